"""Advantage shaping for group-sampled RL (SPEC §C5, Eq 14–17 and 25–28).

Every function works on a whole batch of groups at once. A batch of B groups with up to G responses
each is a padded ``[B, G]`` tensor plus a boolean ``group_mask`` marking real responses, so ragged
groups (some responses failed or were filtered) need no Python loop. Per-token tensors are
``[B, G, T]`` with a ``token_mask``. Each response gets one scalar advantage; ``broadcast_to_tokens``
spreads it over its tokens for the policy loss.

Composition (Eq 28): ``Ã = LenReg(GEPO(LOO(R)))``; ``shape()`` runs it and also reports which groups
DAPO dynamic sampling should drop and resample (all rewards identical: no learning signal).

Run the golden tests: ``python -m pytest tests/posttrain/test_advantages.py -q``
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from posttrain.objectives import native


def _valid(rewards: Tensor, group_mask: Tensor | None) -> Tensor:
    if group_mask is None:
        return torch.ones_like(rewards, dtype=torch.bool)
    if group_mask.shape != rewards.shape:
        raise ValueError(f"group_mask shape {tuple(group_mask.shape)} != rewards shape {tuple(rewards.shape)}")
    return group_mask.bool()


def loo_advantages(rewards: Tensor, group_mask: Tensor | None = None) -> Tensor:
    """Leave-one-out advantage (Eq 27): ``Â_i = R_i − (Σ_j R_j − R_i)/(G − 1)`` per group.

    rewards: ``[..., G]``; group_mask: same shape, True for real responses (G is counted per group).
    Padded positions get 0. A group with a single real response has no baseline, which is an input
    error rather than something to paper over, so it raises.
    """
    valid = _valid(rewards, group_mask)
    r = torch.where(valid, rewards, torch.zeros_like(rewards))
    g = valid.sum(dim=-1, keepdim=True)
    if bool((g == 1).any()):
        raise ValueError("LOO needs at least 2 responses in every non-empty group")
    adv = r - (r.sum(dim=-1, keepdim=True) - r) / (g - 1).clamp(min=1).to(r.dtype)
    return torch.where(valid, adv, torch.zeros_like(adv))


def degenerate_groups(rewards: Tensor, group_mask: Tensor | None = None, atol: float = 0.0) -> Tensor:
    """DAPO dynamic-sampling filter: True for groups whose real rewards are all identical.

    Such a group has zero LOO advantage everywhere, so it only dilutes the batch; the rollout side
    drops it and samples a replacement. Returns ``[...]`` (one flag per group). Empty groups are
    flagged too (nothing to learn from).
    """
    valid = _valid(rewards, group_mask)
    big = torch.finfo(rewards.dtype).max if rewards.is_floating_point() else torch.iinfo(rewards.dtype).max
    hi = torch.where(valid, rewards, torch.full_like(rewards, -big)).amax(dim=-1)
    lo = torch.where(valid, rewards, torch.full_like(rewards, big)).amin(dim=-1)
    return ~valid.any(dim=-1) | ((hi - lo) <= atol)


def group_entropy(logprobs: Tensor, token_mask: Tensor, group_mask: Tensor | None = None) -> Tensor:
    """Group entropy (Eq 25): ``H_q = −(1/K) Σ_i Σ_t log π(y_{i,t})``.

    The sequence surprisal of each response, averaged over the K real responses of the group.
    logprobs, token_mask: ``[..., G, T]``; group_mask: ``[..., G]``. Returns ``[...]``.
    """
    surprisal = -torch.where(token_mask.bool(), logprobs, torch.zeros_like(logprobs)).sum(dim=-1)  # [..., G]
    return _group_mean(surprisal, _valid(surprisal, group_mask))


def _group_mean(x: Tensor, valid: Tensor) -> Tensor:
    k = valid.sum(dim=-1).clamp(min=1).to(x.dtype)
    return torch.where(valid, x, torch.zeros_like(x)).sum(dim=-1) / k


@dataclass(frozen=True)
class GepoConfig:
    """GEPO entropy gate (Eq 26). The report gives no values, so every field must be chosen explicitly."""

    h_low: float
    """Below this group entropy the policy is over-confident: positive advantages are scaled by c_low."""
    h_high: float
    """Above this group entropy the group is chaotic: negative advantages are scaled by c_high."""
    c_low: float
    """Multiplier for positive advantages of low-entropy groups."""
    c_high: float
    """Multiplier for negative advantages of high-entropy groups."""

    def __post_init__(self) -> None:
        if self.h_low > self.h_high:
            raise ValueError(f"h_low={self.h_low} must not exceed h_high={self.h_high}")


def gepo(advantages: Tensor, entropy: Tensor, config: GepoConfig) -> Tensor:
    """Entropy-gated scaling (Eq 26). advantages ``[..., G]``, entropy ``[...]`` (one per group)."""
    h = entropy.unsqueeze(-1)
    low = (h < config.h_low) & (advantages > 0)
    high = (h > config.h_high) & (advantages < 0)
    scale = torch.ones_like(advantages)
    scale = torch.where(low, torch.full_like(scale, config.c_low), scale)
    scale = torch.where(high, torch.full_like(scale, config.c_high), scale)
    return advantages * scale


@dataclass(frozen=True)
class LengthConfig:
    """Adaptive length regularisation (Eq 14–17); defaults are the report's."""

    tau: float = 0.5
    """Active only when at least tau·G responses of the group have a positive advantage."""
    alpha: float = 0.2
    """Floor weight of the longest positive response (the shortest gets 1)."""
    gamma: float = 1.0
    """Curvature of the weight in the normalised length r."""


def length_weights(lengths: Tensor, positive: Tensor, config: LengthConfig = LengthConfig()) -> Tensor:
    """Eq 15–16: ``w_i = α + (1−α)(1 − r_i)^γ`` with r from the min/max length of the positives.

    lengths, positive: ``[..., G]``. Non-positive responses get weight 1 (they are left unchanged).
    If all positives have one length, r = 0 and every weight is 1 (nothing to prefer).
    """
    lf = lengths.to(torch.float64 if lengths.dtype == torch.float64 else torch.float32)
    inf = torch.tensor(float("inf"), dtype=lf.dtype, device=lf.device)
    lmin = torch.where(positive, lf, inf).amin(dim=-1, keepdim=True)
    lmax = torch.where(positive, lf, -inf).amax(dim=-1, keepdim=True)
    span = lmax - lmin
    safe_span = torch.where(span > 0, span, torch.ones_like(span))
    r = torch.where(span > 0, (lf - lmin) / safe_span, torch.zeros_like(lf)).clamp(0.0, 1.0)
    w = config.alpha + (1.0 - config.alpha) * (1.0 - r) ** config.gamma
    return torch.where(positive, w, torch.ones_like(w))


def length_regularise(
    advantages: Tensor, lengths: Tensor, group_mask: Tensor | None = None, config: LengthConfig = LengthConfig()
) -> Tensor:
    """Eq 14–17: reweight positive advantages towards shorter responses, preserving their total.

    ``Ã_i = [Σ_P Â_j / Σ_P w_j Â_j] · w_i · Â_i`` for i in P = {Â_i > 0}, only in groups with
    ``|P| ≥ τ·G``; all other advantages pass through unchanged.
    """
    valid = _valid(advantages, group_mask)
    positive = valid & (advantages > 0)
    n_pos = positive.sum(dim=-1, keepdim=True)
    g = valid.sum(dim=-1, keepdim=True)
    active = (n_pos > 0) & (n_pos.to(advantages.dtype) >= config.tau * g.to(advantages.dtype))
    w = length_weights(lengths, positive, config).to(advantages.dtype)
    pos_adv = torch.where(positive, advantages, torch.zeros_like(advantages))
    mass = pos_adv.sum(dim=-1, keepdim=True)
    weighted = (w * pos_adv).sum(dim=-1, keepdim=True)
    # w ≥ α > 0 and every positive Â > 0, so `weighted` > 0 wherever a group is active.
    norm = torch.where(active, mass / torch.where(active, weighted, torch.ones_like(weighted)), torch.ones_like(mass))
    return torch.where(positive & active, norm * w * advantages, advantages)


@dataclass(frozen=True)
class ShapingConfig:
    """Eq 28 pipeline settings."""

    gepo: GepoConfig | None = None
    """Entropy gate; None switches GEPO off explicitly (the report gives no thresholds)."""
    length: LengthConfig | None = field(default_factory=LengthConfig)
    """Length regularisation; None switches it off."""
    dapo_atol: float = 0.0
    """Rewards closer than this count as identical for the DAPO resample flag."""


@dataclass(frozen=True)
class Shaped:
    """Result of ``shape()``."""

    advantages: Tensor
    """``[B, G]`` final per-response advantages Ã (0 on padding)."""
    resample: Tensor
    """``[B]`` True for groups DAPO drops and replaces (all rewards identical)."""
    entropy: Tensor
    """``[B]`` group entropy H_q (Eq 25)."""


def shape(
    rewards: Tensor,
    logprobs: Tensor,
    token_mask: Tensor,
    group_mask: Tensor | None = None,
    config: ShapingConfig = ShapingConfig(),
) -> Shaped:
    """``Ã = LenReg(GEPO(LOO(R)))`` (Eq 28) over a batch of groups.

    rewards ``[B, G]``; logprobs, token_mask ``[B, G, T]`` (rollout log π of the sampled tokens);
    group_mask ``[B, G]``. Response lengths are the token-mask counts.
    """
    valid = _valid(rewards, group_mask)
    ent = group_entropy(logprobs, token_mask, valid)
    lengths = torch.count_nonzero(token_mask, dim=-1) if config.length is not None else None
    return _shape_core(rewards, valid, ent, lengths, config)


def _shape_core(rewards: Tensor, valid: Tensor, ent: Tensor, lengths: Tensor | None, config: ShapingConfig) -> Shaped:
    adv = loo_advantages(rewards, valid)
    if config.gepo is not None:
        adv = gepo(adv, ent, config.gepo)
    if config.length is not None:
        adv = length_regularise(adv, lengths, valid, config.length)
    return Shaped(advantages=adv, resample=degenerate_groups(rewards, valid, config.dapo_atol), entropy=ent)


def segment_sums(values: Tensor, lengths: Tensor, backend: str = "auto") -> Tensor:
    """Per-segment sums of a packed 1-D tensor: ``values`` is the concatenation of segments of the
    given ``lengths`` (any shape; flattened, 0 allowed). Returns ``lengths.shape`` (0 for empty).

    ``backend``: ``"native"`` sums float32 CPU values in the C kernel (float64 accumulation),
    ``"torch"`` uses ``torch.segment_reduce``, ``"auto"`` picks native when it applies
    (``posttrain.objectives.native.use_native``)."""
    flat = lengths.reshape(-1)
    if values.dim() != 1 or values.numel() != int(flat.sum()):
        raise ValueError(
            f"packed values ({tuple(values.shape)}) must be 1-D with sum(lengths)={int(flat.sum())} entries"
        )
    if bool((flat < 0).any()):
        raise ValueError("segment lengths must be >= 0")
    if native.use_native(backend, values):
        return native.segment_sums(values, native.offsets_of(flat)).to(values.dtype).view(lengths.shape)
    return torch.segment_reduce(values, "sum", lengths=flat).view(lengths.shape)


def shape_packed(
    rewards: Tensor,
    logprobs: Tensor,
    lengths: Tensor,
    group_mask: Tensor | None = None,
    config: ShapingConfig = ShapingConfig(),
    backend: str = "auto",
) -> Shaped:
    """``shape()`` for the packed (ragged) layout: no padding slots at all.

    rewards, lengths: ``[B, G]`` (lengths 0 for padded responses); logprobs: ``[Σ lengths]``, the
    rollout log π of every real token, responses concatenated in row-major ``[B, G]`` order. The group
    entropy's per-response surprisal is one segmented sum over the packed tokens (``backend`` as in
    ``segment_sums``).
    """
    valid = _valid(rewards, group_mask)
    ent = _group_mean(-segment_sums(logprobs, lengths, backend), valid)
    return _shape_core(rewards, valid, ent, lengths if config.length is not None else None, config)


def broadcast_to_tokens(advantages: Tensor, token_mask: Tensor) -> Tensor:
    """One scalar per response spread over its tokens: ``[..., G]`` → ``[..., G, T]``, 0 off-mask."""
    a = advantages.unsqueeze(-1).to(torch.promote_types(advantages.dtype, torch.float32))
    return torch.where(token_mask.bool(), a, torch.zeros((), dtype=a.dtype, device=a.device))
