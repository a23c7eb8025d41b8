"""The sampling distribution, shared by the engine that samples and the learner that re-scores.

Engine and learner call the same ``sampling_logprobs`` on their logits, so a token's behaviour
logprob (engine) and its trainer logprob (learner) describe the same distribution (temperature and
top-p applied), and with equal weights agree to float rounding (SPEC §C2–C3).
"""

from __future__ import annotations

import random

import torch
from torch import Tensor

_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: spreads (seed, attempt, position) over 63 bits


def without_placeholder(logits: Tensor, config: object) -> Tensor:
    """``logits`` with a vision-language model's image placeholder (``config.image_token_id``) at -inf, in engine and
    learner alike: it stands for an image's features in the input, never a token to sample (a sampled one would
    give prompt + response more image tokens than images, which the forward refuses)."""
    tid = getattr(config, "image_token_id", None)
    return logits if tid is None else logits.index_fill(-1, torch.tensor([tid], device=logits.device), float("-inf"))


def sampling_logprobs(logits: Tensor, temperature: float = 1.0, top_p: float = 1.0) -> Tensor:
    """log π of the distribution actually sampled: ``log_softmax(logits / T)``, restricted to the
    nucleus (smallest set of tokens with mass ≥ top_p) and renormalised; tokens outside get -inf.

    logits ``[..., V]`` (computed in float32 whatever the input dtype).

    ``temperature == 0`` is greedy decoding, the T → 0 limit: a point mass on the first argmax (logprob 0
    there, -inf elsewhere; top_p does not matter), so engine and learner still agree exactly.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if temperature == 0:
        top = logits.float().argmax(dim=-1, keepdim=True)
        return torch.full_like(logits, float("-inf"), dtype=torch.float32).scatter(-1, top, 0.0)
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    if top_p >= 1.0:
        return logp
    sorted_lp, order = logp.sort(dim=-1, descending=True)
    mass_before = sorted_lp.exp().cumsum(dim=-1) - sorted_lp.exp()
    drop_sorted = mass_before >= top_p  # the top token always survives (mass_before = 0)
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)


def token_uniform(seed: int, attempt: int, position: int) -> float:
    """The uniform number that draws token ``position`` of a request: a pure function of its arguments, so
    pausing, resuming, batching differently or restarting the process never changes a draw."""
    mixed = (seed * _MIX + attempt * 1_000_003 + position * 97_531) % (2**63 - 1)
    return random.Random(mixed).random()


def draw(logp: Tensor, uniforms: Tensor) -> Tensor:
    """Inverse-CDF draws: ``logp`` ``[B, V]`` (float32), ``uniforms`` ``[B]`` in [0, 1) → token ids ``[B]``.

    A token with probability 0 (outside the nucleus) is never drawn: its CDF step has zero width. ``softmax`` of the
    normalised logp is its ``exp`` up to rounding, ~10× faster: ``Tensor.exp`` takes a slow path for results below
    float32's normal range, and a 49k-token LM row has thousands (−1e4 logits of a subset head: all but a few)."""
    cdf = logp.softmax(dim=-1).cumsum(dim=-1)
    u = uniforms.to(cdf.dtype).unsqueeze(-1) * cdf[:, -1:]  # scale by the total so float rounding cannot overrun
    idx = torch.searchsorted(cdf, u, right=True).squeeze(-1)
    return idx.clamp(max=logp.shape[-1] - 1)


def token_logprobs_of(logits: Tensor, tokens: list[int], temperature: float = 1.0, top_p: float = 1.0) -> list[float]:
    """``logits`` ``[n, V]`` whose row j predicts ``tokens[j]`` → the tokens' logprobs under the sampling
    transform (what an engine records when it re-prefills kept tokens after a weight sync)."""
    if not tokens:
        return []
    lp = sampling_logprobs(logits, temperature, top_p)
    return lp.gather(-1, torch.tensor(tokens).unsqueeze(-1)).squeeze(-1).tolist()
