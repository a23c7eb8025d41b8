"""Held-out measurement of a Memory Decoder: per-token log-probabilities of base, memory and fused (Eq 3 with the
trained router) on a domain and a general held-out set, and the mean λ on each.

    scifolio memdec eval --config debug --work-dir out/memdec
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from posttrain.memdec.data import Example, collate, gold
from posttrain.memdec.train import frozen_outputs
from posttrain.objectives.memory_decoder import Router, fuse

GENERAL_TOLERANCE = 0.02  # fused may be at most 2% worse than the base on general text (issue 15)


@torch.no_grad()
def token_scores(base, memory, router: Router, examples: Sequence[Example], pad_id: int, batch: int = 32):
    """``{"base", "memory", "fused": log p(gold) [n], "lambda": λ [n]}`` over every answer-side position."""
    cols: dict[str, list[torch.Tensor]] = {"base": [], "memory": [], "fused": [], "lambda": []}
    for start in range(0, len(examples), batch):
        b = collate(examples[start : start + batch], pad_id)
        hb, hm, pb, pm = frozen_outputs(base, memory, b)
        lam = router(hb, hm, pb, pm)
        g = gold(b).unsqueeze(-1)
        for name, p in (("base", pb), ("memory", pm), ("fused", fuse(pb, pm, lam))):
            cols[name].append(p.gather(-1, g).squeeze(-1).log())
        cols["lambda"].append(lam)
    return {k: torch.cat(v) for k, v in cols.items()}


@dataclass(frozen=True)
class SetScores:
    """Perplexities (exp of mean NLL per answer-side token) and mean λ on one held-out set."""

    tokens: int
    ppl_base: float
    ppl_memory: float
    ppl_fused: float
    mean_lambda: float


def set_scores(scores: dict[str, torch.Tensor]) -> SetScores:
    ppl = lambda lp: math.exp(-lp.double().mean().item())  # noqa: E731
    return SetScores(
        tokens=int(scores["base"].numel()),
        ppl_base=ppl(scores["base"]),
        ppl_memory=ppl(scores["memory"]),
        ppl_fused=ppl(scores["fused"]),
        mean_lambda=float(scores["lambda"].double().mean()),
    )


@dataclass(frozen=True)
class EvalReport:
    domain: SetScores
    general: SetScores

    def claims(self) -> list[tuple[str, bool]]:
        d, g = self.domain, self.general
        return [
            (f"memory domain PPL {d.ppl_memory:.3f} < base domain PPL {d.ppl_base:.3f}", d.ppl_memory < d.ppl_base),
            (f"fused domain PPL {d.ppl_fused:.3f} < base domain PPL {d.ppl_base:.3f}", d.ppl_fused < d.ppl_base),
            (
                f"fused general PPL {g.ppl_fused:.3f} within {GENERAL_TOLERANCE:.0%} of base {g.ppl_base:.3f} "
                f"(ratio {g.ppl_fused / g.ppl_base:.4f})",
                g.ppl_fused <= (1 + GENERAL_TOLERANCE) * g.ppl_base,
            ),
            (f"mean λ domain {d.mean_lambda:.3f} > mean λ general {g.mean_lambda:.3f}", d.mean_lambda > g.mean_lambda),
        ]

    def ok(self) -> bool:
        return all(ok for _, ok in self.claims())

    def to_json(self) -> dict:
        return {
            "domain": asdict(self.domain),
            "general": asdict(self.general),
            "claims": [{"claim": c, "ok": ok} for c, ok in self.claims()],
        }

    def table(self) -> str:
        rows = [f"{'set':8} {'tokens':>7} {'PPL base':>10} {'PPL memory':>11} {'PPL fused':>10} {'mean λ':>7}"]
        for name, s in (("domain", self.domain), ("general", self.general)):
            rows.append(
                f"{name:8} {s.tokens:7d} {s.ppl_base:10.3f} {s.ppl_memory:11.3f} {s.ppl_fused:10.3f} "
                f"{s.mean_lambda:7.3f}"
            )
        rows += [f"[{'PASS' if ok else 'FAIL'}] {c}" for c, ok in self.claims()]
        return "\n".join(rows)


def evaluate(base, memory, router, domain: Sequence[Example], general: Sequence[Example], pad_id: int) -> EvalReport:
    return EvalReport(
        domain=set_scores(token_scores(base, memory, router, domain, pad_id)),
        general=set_scores(token_scores(base, memory, router, general, pad_id)),
    )
