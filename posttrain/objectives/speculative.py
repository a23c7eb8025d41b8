"""Lossless speculative sampling and the online draft's hybrid loss (SPEC §C4, Eq 21–24).

``verify()`` is the Chen et al. / Leviathan et al. accept-reject step, vectorised over a batch of
rounds: draft token x_j ~ q_j is accepted with probability min(1, p_j(x)/q_j(x)); at the first
rejection a token is drawn from the residual norm(max(0, p_j − q_j)); if all K drafts pass, a bonus
token is drawn from p_K. Each emitted token is then distributed exactly as the target p, whatever q is
(tests check this with a chi-square over many draws of a Markov chain).

The chance a draft token passes is Σ_v min(p_v, q_v) = 1 − TV(p, q) (Eq 21), so with K drafts of
i.i.d. acceptance a a round emits (1 − a^{K+1})/(1 − a) tokens on average. The draft is trained online
on the policy's own distributions with L_k = λ_k·KL(p‖q) + (1−λ_k)·TV(p, q), λ_k = exp(−η·ᾱ_k): where
the draft is poorly aligned (low running acceptance ᾱ_k) the smooth, mode-covering KL dominates; once
aligned, TV (which is exactly 1 − acceptance) is optimised directly.

Run the tests: ``python -m pytest tests/posttrain/test_speculative.py -q``
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def acceptance_rate(p: Tensor, q: Tensor) -> Tensor:
    """Eq 21: probability a draft token from q is accepted under target p: ``Σ_v min(p_v, q_v)``."""
    return torch.minimum(p, q).sum(dim=-1)


def total_variation(p: Tensor, q: Tensor) -> Tensor:
    """``TV(p, q) = ½ Σ_v |p_v − q_v|`` over the last dimension."""
    return 0.5 * (p - q).abs().sum(dim=-1)


def expected_tokens_per_round(acceptance: Tensor | float, k: int) -> Tensor:
    """``(1 − a^{K+1})/(1 − a)`` tokens per verification round (accepted drafts plus one); K+1 at a = 1."""
    a = torch.as_tensor(acceptance, dtype=torch.float64)
    ks = torch.arange(k + 1, dtype=torch.float64)
    # Σ_{j=0..K} a^j is the same closed form without the 0/0 at a = 1.
    return (a.unsqueeze(-1) ** ks).sum(dim=-1)


@dataclass(frozen=True)
class Verified:
    """Outcome of one batched verification round."""

    tokens: Tensor
    """``[B, K+1]`` emitted tokens, −1 after the first ``n_emitted`` of each row."""
    n_emitted: Tensor
    """``[B]`` tokens emitted this round: accepted drafts + 1 (residual or bonus token)."""
    n_accepted: Tensor
    """``[B]`` accepted draft tokens (0..K)."""


def verify(
    draft_tokens: Tensor,
    draft_probs: Tensor,
    target_probs: Tensor,
    generator: torch.Generator | list[torch.Generator] | None = None,
) -> Verified:
    """Accept/reject K draft tokens per row against the target, with residual resampling.

    draft_tokens: ``[B, K]`` sampled from draft_probs. draft_probs: ``[B, K, V]`` q at each draft
    position. target_probs: ``[B, K+1, V]`` p at each draft position plus the bonus position
    (the target scores all K+1 positions in one forward pass). generator: one, or a list of one per row.
    """
    b, k = draft_tokens.shape
    if target_probs.shape[1] != k + 1 or draft_probs.shape[1] != k:
        raise ValueError(f"need draft_probs [B,{k},V] and target_probs [B,{k + 1},V]")
    idx = draft_tokens.unsqueeze(-1)
    p_x = target_probs[:, :k].gather(-1, idx).squeeze(-1)
    q_x = draft_probs.gather(-1, idx).squeeze(-1)
    if isinstance(generator, list):  # K accept tests + 1 residual draw per row, independent of the rows beside it
        u = torch.stack([torch.rand(k + 1, generator=g, dtype=p_x.dtype) for g in generator]).to(p_x.device)
    else:
        u = torch.rand(b, k + 1, generator=generator, dtype=p_x.dtype, device=p_x.device)
    # u < p/q written as u·q < p: no division, and it is always true when p ≥ q.
    accept = u[:, :k] * q_x < p_x
    n_acc = accept.to(torch.int64).cumprod(dim=-1).sum(dim=-1)
    rows = torch.arange(b, device=draft_tokens.device)
    p_sel = target_probs[rows, n_acc]
    # Position K has no draft: padding q with zeros turns the residual into p itself (the bonus token).
    q_pad = torch.cat([draft_probs, torch.zeros_like(draft_probs[:, :1])], dim=1)
    residual = (p_sel - q_pad[rows, n_acc]).clamp(min=0)
    mass = residual.sum(dim=-1, keepdim=True)
    # A rejection implies p(x) < q(x), hence some v with p_v > q_v: mass > 0 except by float rounding.
    cdf = torch.where(mass > 0, residual, p_sel).cumsum(dim=-1)
    # Inverse CDF as sampling.draw (objectives import no rollout code): exact, ~1 ms less than multinomial on 49k tokens.
    extra = torch.searchsorted(cdf, u[:, k:] * cdf[:, -1:], right=True).squeeze(-1).clamp(max=cdf.shape[-1] - 1)
    pos = torch.arange(k + 1, device=draft_tokens.device)
    drafts_pad = torch.cat([draft_tokens, torch.full_like(draft_tokens[:, :1], -1)], dim=1)
    tokens = torch.where(pos < n_acc.unsqueeze(-1), drafts_pad, torch.full_like(drafts_pad, -1))
    tokens = torch.where(pos == n_acc.unsqueeze(-1), extra.unsqueeze(-1), tokens)
    return Verified(tokens=tokens, n_emitted=n_acc + 1, n_accepted=n_acc)


def position_outcomes(n_accepted: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Per draft position j: was it reached (n_acc ≥ j) and accepted (n_acc > j)? Both ``[B, K]``."""
    pos = torch.arange(k, device=n_accepted.device)
    na = n_accepted.unsqueeze(-1)
    return na >= pos, na > pos


class AcceptanceTracker:
    """Running per-position acceptance ᾱ_k (exponential moving average over rounds).

    Starts at ``init`` (0: an untrained draft is assumed unaligned, so the loss starts KL-dominated).
    """

    def __init__(self, k: int, decay: float = 0.99, init: float = 0.0) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError("decay must be in [0, 1)")
        self.decay = decay
        self.value = torch.full((k,), float(init), dtype=torch.float64)

    def update(self, n_accepted: Tensor) -> Tensor:
        """Fold one batch of verification outcomes in; positions nobody reached keep their value."""
        reached, accepted = position_outcomes(n_accepted.cpu(), self.value.numel())
        n_reached = reached.sum(dim=0).to(torch.float64)
        rate = accepted.sum(dim=0).to(torch.float64) / n_reached.clamp(min=1)
        blended = self.decay * self.value + (1.0 - self.decay) * rate
        self.value = torch.where(n_reached > 0, blended, self.value)
        return self.value

    def lambdas(self, eta: float = 3.0) -> Tensor:
        """``λ_k = exp(−η·ᾱ_k)`` per position."""
        return torch.exp(-eta * self.value)


def hybrid_draft_loss(
    target_logits: Tensor,
    draft_logits: Tensor,
    running_acceptance: Tensor,
    eta: float = 3.0,
    mask: Tensor | None = None,
) -> Tensor:
    """Eq 22–24: mean over K positions of ``λ_k·KL(p‖q) + (1−λ_k)·TV(p, q)``, λ_k = exp(−η·ᾱ_k).

    target_logits: ``[B, K, V]`` the policy's logits at the draft positions; detached here, since the
    draft learns from the policy and never sends gradient into it. draft_logits: ``[B, K, V]``.
    running_acceptance: ``[K]``. mask: ``[B, K]`` valid positions (per-position mean over valid rows).
    """
    # Softmax in at least fp32: bf16 logits would make small KL/TV differences vanish.
    dt = torch.promote_types(draft_logits.dtype, torch.float32)
    logp = torch.log_softmax(target_logits.detach().to(dt), dim=-1)
    logq = torch.log_softmax(draft_logits.to(dt), dim=-1)
    p = logp.exp()
    kl = (p * (logp - logq)).sum(dim=-1)
    tv = total_variation(p, logq.exp())
    lam = torch.exp(-eta * running_acceptance.to(kl.dtype).to(kl.device))
    per = lam * kl + (1.0 - lam) * tv  # [B, K]
    if mask is None:
        return per.mean()
    m = mask.to(per.dtype)
    per_pos = (per * m).sum(dim=0) / m.sum(dim=0).clamp(min=1)
    present = m.sum(dim=0) > 0
    return per_pos[present].mean()
