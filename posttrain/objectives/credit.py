"""Session-level credit for agentic RL (SPEC §C7, Eq 30) and the deterministic process annotator.

A session's advantage A_i (group-relative over complete-session rewards) goes to every trainable
segment k of that session, scaled by a process weight w_{i,k} ∈ [−1, 1] only when A_i > 0:

    Ã_{i,k} = w_{i,k}·A_i  if A_i > 0  else  A_i;   0 on non-trainable tokens (system/user/tool).

Why only positive: a successful session can still contain bad steps (a malformed call, a loop of
failing calls) that should not be reinforced; a failed session is penalised as a whole, and a weight
there would *reduce* the penalty on the very steps that failed.

Annotator rules (deterministic, first match wins, in this order): malformed output → 0; call to a tool
that does not exist → 0; repeat of a call that already failed → −0.5; the step that hit a context or
turn limit → −0.5; otherwise 1.

Run the tests: ``python -m pytest tests/posttrain/test_credit.py -q``
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

MALFORMED = 0.0
INVALID_TOOL = 0.0
REPEATED_FAILED_CALL = -0.5
LIMIT_TERMINATION = -0.5
OK = 1.0


@dataclass(frozen=True)
class Step:
    """What the annotator needs to know about one trainable assistant segment."""

    well_formed: bool = True
    """The output parsed (valid tool-call syntax / response format)."""
    tool: str | None = None
    """Name of the tool called, if any."""
    arguments: str = ""
    """Canonical (e.g. sorted-key JSON) arguments, so identical calls compare equal."""
    call_failed: bool = False
    """The tool call returned an error."""
    hit_limit: bool = False
    """The session was terminated by the context or turn limit at this step."""


def annotate(steps: Sequence[Step], tools: Collection[str]) -> list[float]:
    """Process weight per step of one session, by the SPEC §C7 rules (first match wins)."""
    failed_calls: set[tuple[str, str]] = set()
    weights: list[float] = []
    for step in steps:
        call: tuple[str, str] | None = (step.tool, step.arguments) if step.tool is not None else None
        if not step.well_formed:
            w = MALFORMED
        elif step.tool is not None and step.tool not in tools:
            w = INVALID_TOOL
        elif call is not None and call in failed_calls:
            w = REPEATED_FAILED_CALL
        elif step.hit_limit:
            w = LIMIT_TERMINATION
        else:
            w = OK
        if call is not None and step.call_failed:
            failed_calls.add(call)
        weights.append(w)
    return weights


def segment_advantages(session_advantages: Tensor, weights: Tensor, segment_ids: Tensor) -> Tensor:
    """Eq 30 broadcast to tokens.

    session_advantages: ``[S]`` A_i. weights: ``[S, K]`` w_{i,k} (padding ignored).
    segment_ids: ``[S, T]`` index k of the trainable segment each token belongs to, −1 for
    non-trainable tokens (system, user, tool output, skipped steps). Returns ``[S, T]``.
    """
    if weights.numel() and (weights.abs() > 1).any():
        raise ValueError("process weights must lie in [-1, 1]")
    trainable = segment_ids >= 0
    w_tok = weights.gather(1, segment_ids.clamp(min=0).to(torch.int64))
    a = session_advantages.unsqueeze(-1).to(w_tok.dtype)
    credited = torch.where(a > 0, w_tok * a, a.expand_as(w_tok))
    return torch.where(trainable, credited, torch.zeros_like(credited))
