"""The time-series encoder (SPEC C10), top-down: normalise per channel (keep μ, σ) → adaptive patches → local CNN →
Q-Former per patch → channel-wise Transformer → channel pooling → body Transformer → projection into the LLM space.

    enc = SeriesEncoder(EncoderConfig())
    out = enc(x)            # x: [B, C, T] float, NaN = missing; out.tokens [B, ≤budget, llm_dim], out.mu/out.sigma

Cost is linear in T: the patch length grows with T (L = ⌈Q·T/budget⌉) so the token count never exceeds the budget,
and the CNN + Q-Former run over the patches a chunk at a time (memory bounded by ``chunk_points``), so only the
per-point CNN work grows with T. A 300,000-step, 8-channel series encodes on CPU (tests/pretrain/timeseries).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pretrain.timeseries.config import EncoderConfig

# A normalised value this far from 0 carries no more information; clamping keeps inf-free activations on hostile data.
Z_CLAMP = 1e4


# --- pure pieces: patch arithmetic and normalisation ---------------------------------------------------------------


def patch_length(T: int, budget: int, queries: int) -> int:
    """L = ⌈Q·T / budget⌉ (SPEC C10: T=300,000, budget 1,024, Q=4 → 1,172; T=4,096 → 16), at least 1."""
    return max(1, -(-queries * T // budget))


def n_patches(T: int, budget: int, queries: int) -> int:
    """Patches a length-T series is cut into: ⌈T / L⌉ ≤ budget / Q (so Q·patches ≤ budget when Q divides it)."""
    return max(1, -(-T // patch_length(T, budget, queries)))


def token_count(T: int, budget: int, queries: int) -> int:
    """Tokens a length-T series becomes (after channel pooling): Q per patch."""
    return queries * n_patches(T, budget, queries)


def normalise(x: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-channel z-scores over the valid points, in float64: ``[B, C, T]`` → (z, μ [B, C], σ [B, C]).

    σ is the population std; a constant (or single-point) channel gets σ = |μ| (or 1 when μ = 0) so the forecast
    stays finite and still scales with the data. Missing points become z = 0 (the mask says they are missing).
    """
    x = x.double()
    n = valid.sum(-1).clamp(min=1)
    zero = torch.zeros((), dtype=x.dtype)
    # Moments of x / max|x|, scaled back: squares of values near 1e300 would overflow float64.
    peak = torch.where(valid, x.abs(), zero).amax(-1)
    peak = torch.where(peak > 0, peak, torch.ones_like(peak))
    xs = torch.where(valid, x / peak[..., None], zero)
    mu_s = xs.sum(-1) / n
    var_s = torch.where(valid, (xs - mu_s[..., None]) ** 2, zero).sum(-1) / n
    mu, sigma = mu_s * peak, var_s.sqrt() * peak
    flat = sigma <= 1e-12 * (1.0 + mu.abs())
    sigma = torch.where(flat, torch.where(mu.abs() > 0, mu.abs(), torch.ones_like(mu)), sigma)
    z = torch.where(valid, (x - mu[..., None]) / sigma[..., None], torch.zeros((), dtype=x.dtype))
    return z.clamp(-Z_CLAMP, Z_CLAMP), mu, sigma


def sinusoid(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Fixed sinusoidal embeddings of (possibly fractional or huge) positions: ``[...]`` → ``[..., dim]``."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=positions.device) / max(half, 1))
    angles = positions.float()[..., None] * freqs
    emb = torch.cat([angles.sin(), angles.cos()], dim=-1)
    return F.pad(emb, (0, dim - 2 * half))


def _safe_padding(mask_valid: torch.Tensor) -> torch.Tensor:
    """key_padding_mask (True = ignore) that never masks a whole row (softmax over nothing is NaN); rows with no
    valid key attend to their first key and are masked out downstream."""
    pad = ~mask_valid
    empty = pad.all(-1)
    if empty.any():
        pad = pad.clone()
        pad[empty, 0] = False
    return pad


# --- modules -------------------------------------------------------------------------------------------------------


class QFormer(nn.Module):
    """K learned queries cross-attend to a set of states (plus one learned null state, so an empty set is fine)."""

    def __init__(self, n_queries: int, d_in: int, d_model: int, heads: int) -> None:
        super().__init__()
        self.queries = nn.Parameter(torch.randn(n_queries, d_model) * 0.02)
        self.null = nn.Parameter(torch.zeros(1, 1, d_model))
        self.inp = nn.Linear(d_in, d_model) if d_in != d_model else nn.Identity()
        self.attn = nn.MultiheadAttention(d_model, heads, batch_first=True)
        self.ln_q, self.ln_kv, self.ln_ff = nn.LayerNorm(d_model), nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, states: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, S, d_in]`` (valid ``[B, S]``) → ``[B, K, d_model]``."""
        b = states.shape[0]
        kv = torch.cat([self.null.expand(b, 1, -1), self.inp(states)], dim=1)
        if valid is None:
            valid = torch.ones(states.shape[:2], dtype=torch.bool, device=states.device)
        pad = torch.cat([torch.zeros(b, 1, dtype=torch.bool, device=states.device), ~valid], dim=1)
        q = self.queries.expand(b, -1, -1)
        h = q + self.attn(self.ln_q(q), self.ln_kv(kv), self.ln_kv(kv), key_padding_mask=pad, need_weights=False)[0]
        return h + self.ff(self.ln_ff(h))


def _transformer(d: int, heads: int, layers: int, dropout: float) -> nn.TransformerEncoder:
    layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout, activation="gelu", batch_first=True, norm_first=True)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


@dataclass
class EncoderOutput:
    """What the encoder hands to the LLM and the forecaster."""

    tokens: torch.Tensor
    """[B, N, llm_dim] series tokens in the LLM's embedding space, N = Q · patches ≤ budget."""
    token_mask: torch.Tensor
    """[B, N] True where a token covers at least one observed value."""
    channel_tokens: torch.Tensor
    """[B, C, N, d_model] per-channel tokens after the channel-wise Transformer (permute channels → permuted)."""
    channel_mask: torch.Tensor
    """[B, C] True for a channel that exists and has at least one observed value."""
    mu: torch.Tensor
    """[B, C] per-channel mean (float64), kept to de-normalise forecasts."""
    sigma: torch.Tensor
    """[B, C] per-channel scale (float64)."""
    z_last: torch.Tensor
    """[B, C, T] normalised input (0 where missing), float32: the forecaster's first decoder input reads its tail."""
    valid: torch.Tensor
    """[B, C, T] which inputs were observed."""
    patch_len: int
    """L used for this batch."""


class SeriesEncoder(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        # The local CNN sees the value and its observed-flag, so a missing point is never confused with a zero.
        self.cnn = nn.Sequential(nn.Conv1d(2, d, 3, padding=1), nn.GELU(), nn.Conv1d(d, d, 3, padding=1), nn.GELU())
        self.cnn_pos = nn.Parameter(torch.randn(cfg.cnn_positions, d) * 0.02)
        self.qformer = QFormer(cfg.queries, d, d, cfg.heads)
        self.query_emb = nn.Parameter(torch.randn(cfg.queries, d) * 0.02)
        self.channel_tf = _transformer(d, cfg.heads, cfg.channel_layers, cfg.dropout)
        self.pool_score = nn.Linear(d, 1)  # attention pooling over channels: permutation-invariant, learned weights
        self.body = _transformer(d, cfg.heads, cfg.body_layers, cfg.dropout)
        self.ln = nn.LayerNorm(d)
        self.proj = nn.Linear(d, cfg.llm_dim)

    def forward(
        self, x: torch.Tensor, valid: torch.Tensor | None = None, channel_mask: torch.Tensor | None = None
    ) -> EncoderOutput:
        """``x`` ``[B, C, T]`` (NaN/inf = missing; ``valid`` may mark more), ``channel_mask`` ``[B, C]`` for padded
        channels. Series are aligned at their *end* (left-padded), as forecasting needs the latest points."""
        cfg = self.cfg
        finite = torch.isfinite(x)
        valid = finite if valid is None else (valid & finite)
        if channel_mask is not None:
            valid = valid & channel_mask[..., None]
        if cfg.channel_mixing == "mean":  # the baseline: one channel, the per-step mean of the observed channels
            n = valid.sum(1, keepdim=True)
            x = torch.where(valid, x, torch.zeros((), dtype=x.dtype)).sum(1, keepdim=True) / n.clamp(min=1)
            valid = n > 0
        b, c, t = x.shape
        z, mu, sigma = normalise(x, valid)
        z = z.float()
        chan_ok = valid.any(-1)

        L = patch_length(t, cfg.budget, cfg.queries)
        p = -(-t // L)
        left = p * L - t
        zp = F.pad(z, (left, 0))
        vp = F.pad(valid, (left, 0))
        patches = torch.stack([zp, vp.float()], dim=2).reshape(b * c * p, 2, L)  # [N, 2, L], time order kept
        per_chunk = max(1, cfg.chunk_points // L)
        feats = torch.cat([self._patch_tokens(chunk) for chunk in patches.split(per_chunk)], dim=0)
        feats = feats.reshape(b, c, p, cfg.queries, -1)
        patch_ok = vp.reshape(b, c, p, L).any(-1)  # [B, C, P]

        # Position of a patch counted from the end (the series' last patch is 0 whatever T is), plus query identity.
        pos = sinusoid(torch.arange(p - 1, -1, -1, device=x.device), cfg.d_model)
        feats = feats + pos[None, None, :, None, :] + self.query_emb[None, None, None]
        n = p * cfg.queries
        feats = feats.reshape(b, c, n, -1)

        # Channel-wise Transformer: at every token position, attention across the channels (no channel positions,
        # so it is permutation-equivariant and takes any channel count).
        h = feats.permute(0, 2, 1, 3).reshape(b * n, c, -1)
        cpad = _safe_padding(chan_ok[:, None, :].expand(b, n, c).reshape(b * n, c))
        h = self.channel_tf(h, src_key_padding_mask=cpad)
        channel_tokens = h.reshape(b, n, c, -1).permute(0, 2, 1, 3)

        score = self.pool_score(h).squeeze(-1).masked_fill(cpad, float("-inf"))
        pooled = (score.softmax(-1)[..., None] * h).sum(1).reshape(b, n, -1)
        token_ok = (patch_ok & chan_ok[..., None]).any(1).repeat_interleave(cfg.queries, dim=-1)  # [B, N]
        body = self.body(pooled, src_key_padding_mask=_safe_padding(token_ok))
        tokens = self.proj(self.ln(body))
        return EncoderOutput(tokens, token_ok, channel_tokens, chan_ok, mu, sigma, z, valid, L)

    def _patch_tokens(self, patches: torch.Tensor) -> torch.Tensor:
        """``[n, 2, L]`` → ``[n, Q, d]``: local CNN, pooled to ≤ cnn_positions steps, then the per-patch Q-Former."""
        f = self.cnn(patches)
        k = min(patches.shape[-1], self.cfg.cnn_positions)
        f = F.adaptive_avg_pool1d(f, k).transpose(1, 2) + self.cnn_pos[:k]
        return self.qformer(f)
