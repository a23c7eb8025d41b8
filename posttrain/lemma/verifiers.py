"""Verifiers behind one interface: ``check(items, n)`` → per item, the outcomes of n parallel checks.

- ``FormalVerifier``: lemmas decided by sympy (``statements.decide``), final answers by math-verify against the
  row's reference. Deterministic: its n checks agree, so it yields 0 or n passes ("uncertain" never happens).
- ``ModelVerifier``: n sampled judgements per item through a ``RoleCaller`` (the report's setting); each reply is
  parsed for ``VERDICT: VALID|INVALID``; an unparseable reply is a failed check.
- ``NoisyVerifier``: wraps a verifier taken as ground truth and simulates one of given precision and recall
  (the report's lemma verifier: P 0.931, R 0.818). Each check passes a true item with probability R and a false
  one with the false-positive rate that gives precision P at the stated base rate π of true items:
  ``FPR = R·π·(1−P) / (P·(1−π))``. Draws are seeded by (seed, item key, how often that key was checked), so a
  run is reproducible whatever the batch order.

    python -c "from posttrain.lemma.verifiers import *; print(FormalVerifier().check([CheckItem('lemma', 'int: 7 divides 84')], 4))"
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from posttrain.lemma.format import parse_verdict
from posttrain.lemma.roles import RoleCaller, RolePrompt
from posttrain.lemma.statements import answers_match, decide


@dataclass(frozen=True)
class CheckItem:
    """One thing to verify."""

    kind: str
    """``lemma`` (``text`` is a statement) or ``answer`` (``text`` is a final value)."""
    text: str
    problem: dict[str, Any] = field(default_factory=dict)
    """The task row (``prompt``; ``answer`` for a reference check)."""
    justification: str = ""
    context: str = ""
    """The memory as the prompt shows it (model verifiers)."""
    key: str = ""
    """Stable id (``problem/lemma``) for seeding and call labels."""
    round: int = 0


@dataclass
class Verdict:
    passes: list[bool]
    reasons: list[str] = field(default_factory=list)

    @property
    def k(self) -> int:
        return sum(self.passes)


class LemmaVerifier(Protocol):
    def check(self, items: Sequence[CheckItem], n: int) -> list[Verdict]:
        """n independent checks of every item (batched across items)."""
        ...


class FormalVerifier:
    """sympy for lemmas, math-verify against the reference for answers."""

    def truth(self, item: CheckItem) -> tuple[bool, str]:
        if item.kind == "lemma":
            d = decide(item.text)
            return d.ok is True, d.reason or ("holds" if d.ok else "false")
        if item.kind == "answer":
            ref = item.problem.get("answer")
            if ref is None:
                return False, "no reference answer"
            ok = answers_match(item.text, str(ref))
            return ok, "matches the reference" if ok else "differs from the reference"
        raise ValueError(f"unknown item kind {item.kind!r}")

    def check(self, items: Sequence[CheckItem], n: int) -> list[Verdict]:
        return [Verdict([ok] * n, [why] * n) for ok, why in map(self.truth, items)]


def false_positive_rate(precision: float, recall: float, base_rate: float) -> float:
    """The per-check FPR that yields ``precision`` at ``recall`` when a fraction ``base_rate`` of items are true."""
    if not (0 < precision <= 1 and 0 <= recall <= 1 and 0 < base_rate < 1):
        raise ValueError("need 0 < precision ≤ 1, 0 ≤ recall ≤ 1, 0 < base_rate < 1")
    fpr = recall * base_rate * (1 - precision) / (precision * (1 - base_rate))
    if fpr > 1:
        raise ValueError(f"precision {precision} is unreachable at recall {recall} and base rate {base_rate}")
    return fpr


@dataclass
class NoisyVerifier:
    """Simulated verifier of given precision and recall over a ground-truth verifier (``FormalVerifier``)."""

    precision: float = 0.931
    recall: float = 0.818
    base_rate: float = 0.5
    """Fraction of true items the precision refers to."""
    seed: int = 0
    truth: FormalVerifier = field(default_factory=FormalVerifier)
    _seen: Counter[str] = field(default_factory=Counter)

    @property
    def fpr(self) -> float:
        return false_positive_rate(self.precision, self.recall, self.base_rate)

    def check(self, items: Sequence[CheckItem], n: int) -> list[Verdict]:
        out = []
        for it in items:
            ok, why = self.truth.truth(it)
            key = f"{it.kind}/{it.key or it.text}"
            self._seen[key] += 1
            rng = random.Random(f"{self.seed}/{key}/{self._seen[key]}")
            p = self.recall if ok else self.fpr
            passes = [rng.random() < p for _ in range(n)]
            out.append(Verdict(passes, [f"simulated ({'true' if ok else 'false'} item)"] * n))
        return out


@dataclass
class ModelVerifier:
    """n sampled judgements per item through an engine; replies parsed for a ``VERDICT`` line."""

    caller: RoleCaller
    max_tokens: int = 128

    def prompt(self, it: CheckItem) -> str:
        what = "LEMMA" if it.kind == "lemma" else "ANSWER"
        parts = [f"PROBLEM: {it.problem.get('prompt', '')}"]
        if it.context:
            parts.append(f"MEMORY:\n{it.context}")
        parts.append(f"CLAIM ({what}): {it.text}")
        if it.justification:
            parts.append(f"BECAUSE: {it.justification}")
        return "\n".join(parts)

    def check(self, items: Sequence[CheckItem], n: int) -> list[Verdict]:
        prompts = [
            RolePrompt(
                "verifier", self.prompt(it), str(it.problem.get("id", "")), it.round, self.max_tokens, f"{it.key}#{j}"
            )
            for it in items
            for j in range(n)
        ]
        passes, reasons = [], []
        for c in self.caller.generate(prompts):
            v = parse_verdict(c.text)
            passes.append(v is True)
            why = re.findall(r"^REASON:\s*(.+)$", c.text, re.MULTILINE)
            verdict = "unparseable judgement" if v is None else ("valid" if v else "invalid")
            reasons.append(f"{verdict}: {why[-1].strip()[:200]}" if why else verdict)
        return [Verdict(passes[i * n : (i + 1) * n], reasons[i * n : (i + 1) * n]) for i in range(len(items))]


def make_verifier(
    name: str, caller: Any, seed: int = 0, precision: float = 0.931, recall: float = 0.818
) -> LemmaVerifier:
    """``formal``, ``noisy`` (``precision`` / ``recall`` simulated over the formal checker, seeded) or ``model``
    (``caller``, a ``RoleCaller``, in the verifier role)."""
    if name == "formal":
        return FormalVerifier()
    if name == "noisy":
        return NoisyVerifier(precision=precision, recall=recall, seed=seed)
    if name == "model":
        return ModelVerifier(caller)
    raise ValueError(f"verifier={name!r}: formal | noisy | model")
