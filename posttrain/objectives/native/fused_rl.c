/* Fused per-token kernels of the RL objective on the packed (ragged) layout.
 *
 * Built at first use by posttrain/native/__init__.py (cc -O3 -march=native -fopenmp-simd, no OpenMP
 * runtime: Python threads call these functions on disjoint segment ranges, ctypes releases the GIL).
 * Every function takes a half-open range [s0, s1) of segments (responses); segment s owns tokens
 * [off[s], off[s + 1]).
 *
 * sr_packed_loss_grad is Eq 29 and its exact closed-form gradient in ONE pass over the tokens:
 *
 *     d = log π − log π_beh          ρ = exp(d)        ρ̄ = clip(ρ, lo, hi)
 *     g = m · ρ̄ · coef_s              (coef_s = Ã_s / −Σ|y|, per response)
 *     loss += g · log π               clipped += m · [ρ < lo or ρ > hi]
 *
 * The clip test runs on d against log(lo), log(hi) (exp is monotone); a clipped token takes the bound
 * itself, so a token with ρ = 8 and bound 1.2 contributes exactly 1.2, and exp (a branch-free,
 * vectorisable expf) is evaluated on clip(d, log lo, log hi). NaN propagates as in PyTorch.
 */
#include <stdint.h>

static inline float exp_f32(float x) {
    /* expf to about 1 ulp: x = k·ln2 + r with |r| <= ln2/2 (Cody–Waite split of ln2), exp(r) by its
     * degree-7 Taylor polynomial (|r|^8/8! < 6e-9), 2^k assembled in the exponent bits. Branch-free
     * so the loops below vectorise. NaN stays NaN. */
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float shifter = 12582912.0f; /* 1.5 · 2^23: adding it rounds to an integer */
    const float kf = (x * 1.44269504f + shifter) - shifter;
    const float r = (x - kf * 0.693359375f) + kf * 2.12194440e-4f;
    float p = 1.9841270e-04f;
    p = p * r + 1.3888889e-03f;
    p = p * r + 8.3333333e-03f;
    p = p * r + 4.1666667e-02f;
    p = p * r + 1.6666667e-01f;
    p = p * r + 5.0000000e-01f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union {
        int32_t i;
        float f;
    } scale;
    scale.i = ((int32_t)kf + 127) << 23;
    return p * scale.f;
}

/* out[s] = sum of values over segment s, accumulated in double. */
void sr_segment_sums(const float *restrict values, const int64_t *restrict off, int64_t s0, int64_t s1,
                     double *restrict out) {
    for (int64_t s = s0; s < s1; ++s) {
        double acc = 0.0;
        const int64_t a = off[s], b = off[s + 1];
#pragma omp simd reduction(+ : acc)
        for (int64_t t = a; t < b; ++t) acc += (double)values[t];
        out[s] = acc;
    }
}

/* Writes grad[t] for every token of segments [s0, s1); returns the partial loss in *loss and the
 * number of kept tokens outside [lo, hi] in *clipped. keep may be NULL (every token kept). */
void sr_packed_loss_grad(const float *restrict logp, const float *restrict beh, const int64_t *restrict off,
                         const float *restrict coef, const uint8_t *restrict keep, int64_t s0, int64_t s1,
                         float lo, float hi, float log_lo, float log_hi, float *restrict grad,
                         double *restrict loss, int64_t *restrict clipped) {
    double total = 0.0;
    int64_t n_clip = 0;
    for (int64_t s = s0; s < s1; ++s) {
        const float c = coef[s];
        const int64_t a = off[s], b = off[s + 1];
        float acc = 0.0f;
        int64_t nc = 0;
        if (keep == 0) {
#pragma omp simd reduction(+ : acc, nc)
            for (int64_t t = a; t < b; ++t) {
                const float lp = logp[t];
                const float d = lp - beh[t];
                const int below = d < log_lo, above = d > log_hi;
                const float dc = below ? log_lo : (above ? log_hi : d);
                const float w = below ? lo : (above ? hi : exp_f32(dc));
                const float g = w * c;
                grad[t] = g;
                acc += g * lp;
                nc += below | above;
            }
        } else {
#pragma omp simd reduction(+ : acc, nc)
            for (int64_t t = a; t < b; ++t) {
                const float lp = logp[t];
                const float d = lp - beh[t];
                const int k = keep[t] != 0;
                const int below = d < log_lo, above = d > log_hi;
                const float dc = below ? log_lo : (above ? log_hi : d);
                const float w = below ? lo : (above ? hi : exp_f32(dc));
                const float g = k ? w * c : 0.0f;
                grad[t] = g;
                acc += k ? g * lp : 0.0f; /* a masked −inf log π must not reach the sum */
                nc += k & (below | above);
            }
        }
        total += (double)acc;
        n_clip += nc;
    }
    *loss = total;
    *clipped = n_clip;
}
