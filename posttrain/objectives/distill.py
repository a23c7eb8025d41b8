"""On-policy distillation from per-domain teachers (SPEC §C8, Eq 31–36).

The student samples; each query belongs to one domain (reasoning, agentic, …) and is scored by that
domain's teacher. The per-token advantage is

    Â_t = sg[log π_T(y_t) − log π_prox(y_t)]                                     (Eq 33)

with π_prox the student frozen at the start of the batch (so the target does not move while the batch
is consumed), and the loss is the Eq 29 objective with Â_t per token and a per-domain weight λ_d
(Eq 36). Only the sampled token's teacher logprob crosses the wire: O(H) numbers per response instead
of O(H·V) logits, which is what makes remote teachers affordable.

``DomainRouter`` splits a batch by domain and reassembles the teachers' answers; the model class that
turns a local Hugging Face causal LM into a scorer (``TeacherScorer``) lives with the stage, in
``posttrain/rl/teachers.py``.

Run the tests: ``python -m pytest tests/posttrain/test_distill.py -q``
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from posttrain.objectives.policy_loss import ClipConfig, LossStats, policy_loss


def sampled_logprobs(logits: Tensor, tokens: Tensor) -> Tensor:
    """``log softmax(logits)[token]`` per position without materialising the full log-softmax copy."""
    dt = torch.promote_types(logits.dtype, torch.float32)  # bf16 logsumexp loses the small differences
    picked = logits.gather(-1, tokens.unsqueeze(-1).to(torch.int64)).squeeze(-1)
    return picked.to(dt) - torch.logsumexp(logits.to(dt), dim=-1)


def opd_advantage(teacher_logprobs: Tensor, proximal_logprobs: Tensor) -> Tensor:
    """Eq 33: ``sg[log π_T − log π_prox]`` per token (positive where the teacher likes the token more)."""
    return (teacher_logprobs - proximal_logprobs).detach()


@dataclass(frozen=True)
class DomainRoute:
    """One domain's teacher and weight."""

    teacher: str
    """Name of the teacher that scores this domain's queries."""
    weight: float = 1.0
    """λ_d in Eq 36."""


@dataclass(frozen=True)
class Routed:
    """A batch split by teacher."""

    weights: Tensor
    """``[B]`` λ_d of each query's domain."""
    by_teacher: dict[str, Tensor]
    """teacher name → indices (into the batch) of the queries it must score."""


class DomainRouter:
    """Assigns each query to its domain's teacher (SPEC §C8: one domain, one teacher per query)."""

    def __init__(self, routes: Mapping[str, DomainRoute]) -> None:
        if not routes:
            raise ValueError("at least one domain route is required")
        self.routes = dict(routes)

    def route(self, domains: Sequence[str]) -> Routed:
        unknown = sorted({d for d in domains if d not in self.routes})
        if unknown:
            raise KeyError(f"no teacher configured for domain(s) {unknown}")
        weights = torch.tensor([self.routes[d].weight for d in domains], dtype=torch.float32)
        by_teacher: dict[str, list[int]] = {}
        for i, d in enumerate(domains):
            by_teacher.setdefault(self.routes[d].teacher, []).append(i)
        return Routed(weights=weights, by_teacher={t: torch.tensor(ix) for t, ix in by_teacher.items()})

    @staticmethod
    def assemble(routed: Routed, answers: Mapping[str, Tensor], batch_shape: tuple[int, int]) -> Tensor:
        """Scatter each teacher's ``[n_t, T]`` sampled-token logprobs back into batch order ``[B, T]``."""
        missing = sorted(set(routed.by_teacher) - set(answers))
        if missing:
            raise KeyError(f"no answer from teacher(s) {missing}")
        out = torch.full(batch_shape, float("nan"))
        for teacher, idx in routed.by_teacher.items():
            got = answers[teacher]
            if got.shape != (len(idx), batch_shape[1]):
                raise ValueError(
                    f"teacher {teacher!r} returned {tuple(got.shape)}, expected {(len(idx), batch_shape[1])}"
                )
            out[idx] = got.float()
        return out


def distill_loss(
    student_logprobs: Tensor,
    proximal_logprobs: Tensor,
    teacher_logprobs: Tensor,
    response_mask: Tensor,
    domain_weights: Tensor,
    behaviour_logprobs: Tensor | None = None,
    clip: ClipConfig = ClipConfig(),
) -> tuple[Tensor, LossStats]:
    """Eq 36: the Eq 29 loss with per-token advantage λ_d·Â_t.

    student_logprobs: ``[B, T]`` log π_θ (requires grad). proximal_logprobs: the frozen batch-start
    student. teacher_logprobs: routed teacher logprobs of the same tokens. domain_weights: ``[B]``.
    behaviour_logprobs: the rollout engine's logprobs for the importance weight; defaults to the
    proximal student (rollouts came from it).
    """
    resp = response_mask.bool()
    adv = opd_advantage(teacher_logprobs, proximal_logprobs)
    adv = torch.where(resp, adv, torch.zeros_like(adv)) * domain_weights.to(adv.dtype).unsqueeze(-1)
    beh = proximal_logprobs if behaviour_logprobs is None else behaviour_logprobs
    return policy_loss(student_logprobs, beh, adv, resp, clip=clip)
