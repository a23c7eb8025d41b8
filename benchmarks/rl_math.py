"""Vectorised RL advantage + loss path vs. a straightforward per-group Python implementation.

Both compute, for every group: LOO advantages (Eq 27), the DAPO resample flag, group entropy (Eq 25),
GEPO (Eq 26), adaptive length regularisation (Eq 14–17), then the detached-IS objective (Eq 29) and its
gradient with respect to log π of every token. The vectorised path runs over the whole batch
(4,096 groups × 16 responses × 2,048 tokens by default) in chunks of groups, so peak memory stays
bounded; the Python baseline runs on a subset of groups and is extrapolated linearly (its cost is
per group). The vectorised paths are timed side by side:

* autograd (old): ``shape`` + ``policy_loss`` + ``backward`` over padded ``[B, G, T]`` chunks;
* torch fused padded: ``shape`` + ``policy_loss_and_grad`` (closed-form gradient, in-place buffer) per block;
* torch fused packed: ``shape_packed`` + ``packed_policy_loss_and_grad(backend="torch")`` on real tokens
  only (no padding), per block of groups. Packing the padded data is done once, untimed (see ``pack``);
* native packed: the same with ``backend="native"``: entropy sums and loss + gradient each in one pass
  of the C kernel in ``posttrain/native`` (built at first use, before timing).

The packed paths run twice: a fresh gradient tensor per block, all kept (the whole batch's 75M
gradients are resident at the end, so each run first-touches ~300 MB of new pages), and one buffer
reused for every block, as in a trainer where each micro-batch's gradient goes into its backward
before the next micro-batch.

The script first checks every path agrees with the Python baseline on the subset (loss and
gradient), then times them.

    python benchmarks/rl_math.py                      # full size
    python benchmarks/rl_math.py --groups 256         # quicker
"""

from __future__ import annotations

import argparse
import math
import resource
import time

import torch

from posttrain.objectives.advantages import GepoConfig, LengthConfig, ShapingConfig, shape, shape_packed
from posttrain.objectives.policy_loss import ClipConfig, packed_policy_loss_and_grad, policy_loss, policy_loss_and_grad

GEPO = GepoConfig(h_low=200.0, h_high=1500.0, c_low=0.5, c_high=0.5)
LENGTH = LengthConfig()
CLIP = ClipConfig(0.2, 0.2)


def make_chunk(b: int, g: int, t: int, seed: int) -> dict[str, torch.Tensor]:
    """Synthetic rollouts: Bernoulli rewards, ragged lengths, behaviour and current logprobs."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(t // 8, t + 1, (b, g), generator=gen)
    mask = torch.arange(t) < lengths.unsqueeze(-1)
    beh = -2.0 * torch.rand(b, g, t, generator=gen)
    logp = beh + 0.3 * torch.randn(b, g, t, generator=gen)  # a few updates away: some ratios clip
    p_correct = torch.rand(b, 1, generator=gen)
    rewards = (torch.rand(b, g, generator=gen) < p_correct).float()
    return {"rewards": rewards, "mask": mask, "beh": beh, "logp": logp}


def vectorised(chunks: list[dict[str, torch.Tensor]], n_tokens: int) -> tuple[float, list[torch.Tensor]]:
    """Advantage shaping + Eq 29 loss + backward, chunk by chunk with one global normaliser."""
    total = 0.0
    grads = []
    cfg = ShapingConfig(gepo=GEPO, length=LENGTH)
    for c in chunks:
        logp = c["logp"].requires_grad_(True)
        shaped = shape(c["rewards"], c["beh"], c["mask"], config=cfg)
        loss, _ = policy_loss(logp, c["beh"], shaped.advantages, c["mask"], clip=CLIP, n_tokens=n_tokens)
        loss.backward()
        total += loss.item()
        grads.append(logp.grad)
        logp.grad = None
        logp.requires_grad_(False)
    return total, grads


def fused_padded(chunks: list[dict[str, torch.Tensor]], n_tokens: int, block: int) -> tuple[float, list[torch.Tensor]]:
    """Same inputs as ``vectorised``; closed-form loss + gradient, ``block`` groups at a time."""
    total = 0.0
    grads = []
    cfg = ShapingConfig(gepo=GEPO, length=LENGTH)
    for c in chunks:
        grad = torch.empty_like(c["logp"])
        for s in range(0, c["rewards"].shape[0], block):
            sl = slice(s, s + block)
            shaped = shape(c["rewards"][sl], c["beh"][sl], c["mask"][sl], config=cfg)
            loss, _, _ = policy_loss_and_grad(
                c["logp"][sl],
                c["beh"][sl],
                shaped.advantages,
                c["mask"][sl],
                clip=CLIP,
                n_tokens=n_tokens,
                grad_out=grad[sl],
            )
            total += loss.item()
        grads.append(grad)
    return total, grads


def pack(c: dict[str, torch.Tensor], block: int) -> list[dict[str, torch.Tensor]]:
    """Padded chunk -> packed blocks of ``block`` groups (real tokens only + per-response lengths).

    Not timed: it stands for a trainer that keeps rollouts packed (varlen), as the Python baseline's
    list-of-real-tokens input is not timed either."""
    out = []
    for s in range(0, c["rewards"].shape[0], block):
        m = c["mask"][s : s + block]
        out.append(
            {
                "rewards": c["rewards"][s : s + block],
                "lengths": torch.count_nonzero(m, dim=-1),
                "logp": c["logp"][s : s + block][m].contiguous(),
                "beh": c["beh"][s : s + block][m].contiguous(),
            }
        )
    return out


def fused_packed(
    blocks: list[dict[str, torch.Tensor]], n_tokens: int, backend: str = "torch", reuse: bool = False
) -> tuple[float, list[torch.Tensor]]:
    """Packed layout: per block, segmented entropy sums + shaping + closed-form loss and gradient.

    ``backend``: "torch" (eager in-place passes) or "native" (the one-pass C kernel). ``reuse``: write
    every block's gradient into one buffer, as a trainer does when each micro-batch's gradient goes
    into its backward before the next (no fresh pages per block); otherwise every block's gradient is
    a new tensor and all of them are kept."""
    total = 0.0
    grads = []
    cfg = ShapingConfig(gepo=GEPO, length=LENGTH)
    buf = torch.empty(max(c["logp"].numel() for c in blocks)) if reuse else None
    for c in blocks:
        shaped = shape_packed(c["rewards"], c["beh"], c["lengths"], config=cfg, backend=backend)
        out = None if buf is None else buf[: c["logp"].numel()]
        loss, grad, _ = packed_policy_loss_and_grad(
            c["logp"],
            c["beh"],
            shaped.advantages,
            c["lengths"],
            clip=CLIP,
            n_tokens=n_tokens,
            grad_out=out,
            backend=backend,
        )
        total += loss.item()
        if not reuse:
            grads.append(grad)
    return total, grads


def python_group(rewards: list[float], logp: list[list[float]], beh: list[list[float]], n_tokens: int):
    """One group, the obvious way: Python lists, loops over responses and tokens."""
    g = len(rewards)
    total_r = sum(rewards)
    adv = [r - (total_r - r) / (g - 1) for r in rewards]
    resample = all(r == rewards[0] for r in rewards)
    entropy = sum(-sum(seq) for seq in beh) / g
    if entropy < GEPO.h_low:
        adv = [a * GEPO.c_low if a > 0 else a for a in adv]
    elif entropy > GEPO.h_high:
        adv = [a * GEPO.c_high if a < 0 else a for a in adv]
    lengths = [len(seq) for seq in beh]
    pos = [i for i in range(g) if adv[i] > 0]
    if pos and len(pos) >= LENGTH.tau * g:
        lmin = min(lengths[i] for i in pos)
        lmax = max(lengths[i] for i in pos)
        w = {}
        for i in pos:
            r = (lengths[i] - lmin) / (lmax - lmin) if lmax > lmin else 0.0
            w[i] = LENGTH.alpha + (1 - LENGTH.alpha) * (1 - r) ** LENGTH.gamma
        norm = sum(adv[i] for i in pos) / sum(w[i] * adv[i] for i in pos)
        for i in pos:
            adv[i] = norm * w[i] * adv[i]
    loss = 0.0
    grads = []
    lo, hi = 1 - CLIP.eps_low, 1 + CLIP.eps_high
    for i in range(g):
        gi = []
        for lp, bp in zip(logp[i], beh[i]):
            rho = math.exp(lp - bp)
            rho = lo if rho < lo else hi if rho > hi else rho
            loss -= rho * adv[i] * lp / n_tokens
            gi.append(-rho * adv[i] / n_tokens)
        grads.append(gi)
    return loss, grads, resample


def to_python(c: dict[str, torch.Tensor], gi: int):
    lengths = c["mask"][gi].sum(-1).tolist()
    logp = [c["logp"][gi, i, :n].tolist() for i, n in enumerate(lengths)]
    beh = [c["beh"][gi, i, :n].tolist() for i, n in enumerate(lengths)]
    return c["rewards"][gi].tolist(), logp, beh


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=4096)
    ap.add_argument("--responses", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--chunk-groups", type=int, default=128, help="groups per vectorised chunk (memory bound)")
    ap.add_argument("--block-groups", type=int, default=128, help="groups per block of the fused paths (cache)")
    ap.add_argument("--baseline-groups", type=int, default=32, help="groups the Python baseline runs on")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="timing of every path and of the baseline: best of N")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    b, g, t = args.groups, args.responses, args.tokens

    t0 = time.perf_counter()
    chunks = [make_chunk(min(args.chunk_groups, b - s), g, t, seed=s) for s in range(0, b, args.chunk_groups)]
    n_tokens = int(sum(int(c["mask"].sum()) for c in chunks))
    print(
        f"data: {b} groups x {g} responses x {t} tokens = {b * g * t / 1e6:.1f}M padded token slots, "
        f"{n_tokens / 1e6:.1f}M real tokens, fp32, generated in {time.perf_counter() - t0:.1f}s"
    )

    # Correctness on the baseline subset (first groups of the first chunk), for every vectorised path.
    nb = min(args.baseline_groups, chunks[0]["rewards"].shape[0])
    sub = {k: v[:nb].clone() for k, v in chunks[0].items()}
    py_inputs = [to_python(chunks[0], gi) for gi in range(nb)]
    py_time = float("inf")
    for _ in range(args.repeats):  # best of N, as for the vectorised paths
        t0 = time.perf_counter()
        py_out = [python_group(r, lp, bp, n_tokens) for r, lp, bp in py_inputs]
        py_time = min(py_time, time.perf_counter() - t0)
    py_loss = sum(o[0] for o in py_out)

    def padded_grad(grads):  # noqa: ANN001, ANN202
        return lambda gi, i, n: grads[0][gi, i, :n]

    def packed_grad(blocks, grads):  # noqa: ANN001, ANN202
        flat = torch.cat(grads)
        offs = torch.cat([blk["lengths"].reshape(-1) for blk in blocks]).cumsum(0).tolist()
        g = sub["rewards"].shape[1]
        return lambda gi, i, n: flat[offs[gi * g + i] - n : offs[gi * g + i]]

    sub_blocks = pack(sub, args.block_groups)
    checks = {
        "autograd (old)": lambda: (lambda r: (r[0], padded_grad(r[1])))(vectorised([sub], n_tokens)),
        "fused padded": lambda: (lambda r: (r[0], padded_grad(r[1])))(fused_padded([sub], n_tokens, args.block_groups)),
        "fused packed": lambda: (lambda r: (r[0], packed_grad(sub_blocks, r[1])))(fused_packed(sub_blocks, n_tokens)),
        "native packed": lambda: (lambda r: (r[0], packed_grad(sub_blocks, r[1])))(
            fused_packed(sub_blocks, n_tokens, "native")
        ),
    }
    for name, run in checks.items():
        sub_loss, grad_of = run()
        max_grad_err, max_grad = 0.0, 0.0
        for gi, (_, gr, _) in enumerate(py_out):
            for i, seq in enumerate(gr):
                if seq:
                    ref = grad_of(gi, i, len(seq)).double()
                    max_grad_err = max(max_grad_err, (ref - torch.tensor(seq, dtype=torch.float64)).abs().max().item())
                    max_grad = max(max_grad, ref.abs().max().item())
        rel_loss_err = abs(py_loss - sub_loss) / max(abs(py_loss), 1e-30)
        rel_grad_err = max_grad_err / max(max_grad, 1e-30)
        print(
            f"agreement with Python on {nb} groups, {name}: loss rel. err {rel_loss_err:.2e}, "
            f"gradient max rel. err {rel_grad_err:.2e}"
        )
        if rel_loss_err > 1e-4 or rel_grad_err > 1e-4:
            print(f"MISMATCH between {name} and Python paths")
            return 1

    t0 = time.perf_counter()
    packed = [blk for c in chunks for blk in pack(c, args.block_groups)]
    pack_s = time.perf_counter() - t0
    per_group_py = py_time / nb
    py_full = per_group_py * b
    print(
        f"python per-group baseline (best of {args.repeats}): {py_time:.2f} s for {nb} groups = {per_group_py * 1e3:.1f} ms/group "
        f"-> extrapolated {py_full:.1f} s for {b} groups"
    )
    bg = args.block_groups
    paths = [
        (f"autograd, padded [B,G,T], {args.chunk_groups}-group chunks (old)", lambda: vectorised(chunks, n_tokens)),
        (f"torch fused, padded, {bg}-group blocks", lambda: fused_padded(chunks, n_tokens, bg)),
        (f"torch fused, packed, {bg}-group blocks", lambda: fused_packed(packed, n_tokens)),
        ("  same, one gradient buffer reused", lambda: fused_packed(packed, n_tokens, reuse=True)),
        (f"native C kernel, packed, {bg}-group blocks", lambda: fused_packed(packed, n_tokens, "native")),
        ("  same, one gradient buffer reused", lambda: fused_packed(packed, n_tokens, "native", True)),
    ]
    results = []
    for name, run in paths:
        best, loss = float("inf"), float("nan")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            loss, _ = run()
            best = min(best, time.perf_counter() - t0)
        results.append((name, best, loss))
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    print(
        f"timings ({args.threads} threads, best of {args.repeats}; packing padded->packed took {pack_s:.2f} s, untimed):"
    )
    for name, best, loss in results:
        print(
            f"  {name:<58} {best:6.2f} s ({n_tokens / best / 1e6:6.1f}M tok/s)  loss {loss:.6f}  "
            f"speed-up vs Python {py_full / best:6.1f}x"
        )
    print(f"(peak RSS {peak_gb:.2f} GB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
