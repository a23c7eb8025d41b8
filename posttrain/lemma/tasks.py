"""The ``lemma-chain`` task family: generated multi-step problems whose every step is a lemma the next one needs.

A problem starts from ``x0`` and defines ``x1 … xS``, each from the previous one by an algebra or number-theory
step; the answer is ``xS``. Each step's result is a closed statement the formal checker decides, e.g.::

    Let x0 = 4. Let x1 be the remainder of x0^3 + 2 on division by 7. Let x2 = gcd(x1 + 30, 84). … Find x4.
    step lemmas: int: Mod(4**3 + 2, 7) = 3 · int: gcd(3 + 30, 84) = 3 · …

Step kinds: ``poly`` (evaluate a quadratic), ``modpow`` (remainder of a power), ``gcd``, ``divisors`` (number of
positive divisors), ``least`` (least t ≥ 1 with t² ≥ …, an inequality fact), ``root`` (largest real root of a
quadratic whose roots are the previous value and a constant: a solution-set fact), ``sum`` (1 + … + n). Knobs:
``steps`` (chain length) and ``magnitude`` (how large the constants are). A kind is only drawn where it keeps the
values small enough for the checker's size guards.

Rows follow ``posttrain/rl/task.py``: ``{"id", "prompt", "answer"}`` plus ``family``, ``x0``, ``steps`` (kind,
params, the true statement and value of each step) and ``difficulty``; ``verify_answer`` is its verifier
(``ANSWER:`` line or ``\\boxed{}``, compared by math-verify). Train and test come from separate seeded streams,
and test drops any prompt that also occurs in train.

    python -m posttrain.lemma.tasks --out tasks/ --train 200 --test 100 --steps 4 --magnitude 1
"""

from __future__ import annotations

import argparse
import math
import random
import re
import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from formats import fs
from posttrain.lemma.format import parse_answer
from posttrain.lemma.statements import answers_match

FAMILY = "lemma-chain"


def _divisor_count(n: int) -> int:
    count, d = 0, 1
    while d * d <= n:
        if n % d == 0:
            count += 1 if d * d == n else 2
        d += 1
    return count


@dataclass(frozen=True)
class StepKind:
    """One kind of step: how it reads in the problem, its lemma, its value, and a plausible wrong result."""

    name: str
    sentence: str
    """The step in the problem, ``{prev}``/``{cur}`` the variable names, ``{a}``, ``{b}``… the params."""
    statement: str
    """The step's lemma, ``{v}`` the previous value, ``{rhs}`` the result."""
    compute: Callable[[int, dict[str, int]], int]
    allowed: Callable[[int, dict[str, int]], bool]
    draw: Callable[[random.Random, int], dict[str, int]]
    """Params for a given magnitude."""

    def pattern(self) -> re.Pattern[str]:
        """The sentence as a regex (what a reader of the problem text matches)."""
        out, seen = "", set()
        for literal, name, _, _ in string.Formatter().parse(self.sentence):
            out += re.escape(literal)
            if name is None:
                continue
            if name in seen:
                out += f"x(?P={name})" if name in ("prev", "cur") else f"(?P={name})"
            else:
                seen.add(name)
                out += f"x(?P<{name}>\\d+)" if name in ("prev", "cur") else f"(?P<{name}>-?\\d+)"
        return re.compile(out)

    def rhs(self, v: int, params: dict[str, int], value: int) -> str:
        if self.name == "root":
            return "{" + ", ".join(str(r) for r in sorted({v, params["a"]})) + "}"
        return str(value)

    def lemma(self, v: int, params: dict[str, int], value: int | None = None, rhs: str | None = None) -> str:
        value = self.compute(v, params) if value is None else value
        return self.statement.format(v=_paren(v), rhs=rhs if rhs is not None else self.rhs(v, params, value), **params)

    def lemma_prefix(self, v: int, params: dict[str, int]) -> str:
        """The statement up to its result: how a reader finds this step's lemma in a memory."""
        return self.statement.split("{rhs}")[0].format(v=_paren(v), **params)

    def value_of(self, rhs: str) -> int | None:
        """The step's value from a lemma's result text (``root``: the largest root)."""
        nums = re.findall(r"-?\d+", rhs)
        if not nums:
            return None
        return max(int(n) for n in nums) if self.name == "root" else int(nums[0])

    def wrong(self, v: int, params: dict[str, int], rng: random.Random) -> tuple[str, int]:
        """A plausible wrong result (an off-by-a-little slip) and the value a reader takes from it."""
        true = self.compute(v, params)
        if self.name == "root":
            lo = min(v, params["a"])
            bad = max(true + rng.randint(1, 3), lo + 1)
            return "{" + f"{lo}, {bad}" + "}", bad
        bad = true + rng.choice([-2, -1, 1, 2, 3])
        if self.name in ("divisors", "least", "gcd") and bad < 1:
            bad = true + rng.randint(1, 3)
        return str(bad), bad


def _paren(v: int) -> str:
    """A value as it appears inside a lemma (negatives parenthesised: ``(-2)**2``, not ``-2**2``)."""
    return f"({v})" if v < 0 else str(v)


def _mag(m: int, base: int) -> int:
    return base * (10 ** max(0, m - 1))


KINDS: dict[str, StepKind] = {
    k.name: k
    for k in [
        StepKind(
            "poly",
            "Let {cur} = {prev}^2 - {a}*{prev} + {b}.",
            "int: {v}**2 - {a}*{v} + {b} = {rhs}",
            lambda v, p: v * v - p["a"] * v + p["b"],
            lambda v, p: abs(v) <= 300,
            lambda r, m: {"a": r.randint(1, _mag(m, 9)), "b": r.randint(1, _mag(m, 20))},
        ),
        StepKind(
            "modpow",
            "Let {cur} be the remainder of {prev}^{a} + {b} on division by {c}.",
            "int: Mod({v}**{a} + {b}, {c}) = {rhs}",
            lambda v, p: (v ** p["a"] + p["b"]) % p["c"],
            lambda v, p: abs(v) <= 10**6,
            lambda r, m: {"a": r.randint(2, 5), "b": r.randint(1, _mag(m, 20)), "c": r.randint(5, _mag(m, 40))},
        ),
        StepKind(
            "gcd",
            "Let {cur} = gcd({prev} + {a}, {b}).",
            "int: gcd({v} + {a}, {b}) = {rhs}",
            lambda v, p: math.gcd(v + p["a"], p["b"]),
            lambda v, p: v + p["a"] != 0,
            lambda r, m: {"a": r.randint(1, _mag(m, 30)), "b": r.choice([12, 24, 36, 48, 60, 72, 84, 90, 96, 120])},
        ),
        StepKind(
            "divisors",
            "Let {cur} be the number of positive divisors of {prev} + {a}.",
            "int: divisor_count({v} + {a}) = {rhs}",
            lambda v, p: _divisor_count(v + p["a"]),
            lambda v, p: 1 <= v + p["a"] <= 10**6,
            lambda r, m: {"a": r.randint(1, _mag(m, 50))},
        ),
        StepKind(
            "least",
            "Let {cur} be the least integer t >= 1 with t^2 >= {prev} + {a}.",
            "least t >= 1: t**2 >= {v} + {a} -> {rhs}",
            lambda v, p: math.isqrt(max(v + p["a"] - 1, 0)) + 1,  # the least t >= 1 with t*t >= v + a
            lambda v, p: v + p["a"] <= 10**6,
            lambda r, m: {"a": r.randint(1, _mag(m, 60))},
        ),
        StepKind(
            "root",
            "Let {cur} be the largest real root of t^2 - ({prev} + {a})*t + {a}*{prev} = 0.",
            "solve t: t**2 - ({v} + {a})*t + {a}*{v} = 0 -> {rhs}",
            lambda v, p: max(v, p["a"]),
            lambda v, p: abs(v) <= 10**4,
            lambda r, m: {"a": r.randint(2, _mag(m, 40))},
        ),
        StepKind(
            "sum",
            "Let {cur} be the sum of the integers from 1 to {prev} + {a}.",
            "int: summation(i, (i, 1, {v} + {a})) = {rhs}",
            lambda v, p: (v + p["a"]) * (v + p["a"] + 1) // 2,
            lambda v, p: 1 <= v + p["a"] <= 400,
            lambda r, m: {"a": r.randint(1, _mag(m, 15))},
        ),
    ]
}


def make_problem(rng: random.Random, steps: int, magnitude: int = 1, problem_id: str = "") -> dict[str, Any]:
    """One problem of ``steps`` steps (each kind drawn among those that keep the values in bounds)."""
    x0 = rng.randint(2, _mag(magnitude, 9))
    v = x0
    sentences = [f"Let x0 = {x0}."]
    out_steps = []
    for k in range(1, steps + 1):
        for _ in range(100):
            kind = KINDS[rng.choice(sorted(KINDS))]
            params = kind.draw(rng, magnitude)
            if kind.allowed(v, params):
                break
        else:  # pragma: no cover - the reducing kinds (modpow, gcd) are always allowed for small v
            raise RuntimeError("no step kind fits")
        value = kind.compute(v, params)
        sentences.append(kind.sentence.format(prev=f"x{k - 1}", cur=f"x{k}", **params))
        out_steps.append({"kind": kind.name, "params": params, "statement": kind.lemma(v, params), "value": value})
        v = value
    sentences.append(f"Find x{steps}.")
    return {
        "id": problem_id,
        "prompt": " ".join(sentences),
        "answer": str(v),
        "family": FAMILY,
        "x0": x0,
        "steps": out_steps,
        "difficulty": {"steps": steps, "magnitude": magnitude},
    }


_TEMPLATE_TRIES = 200
"""Draws ``make_rows(distinct_kinds=True)`` makes for an unused kind sequence before starting a new round."""


def make_rows(
    n: int, seed: int, split: str, steps: int = 4, magnitude: int = 1, distinct_kinds: bool = False
) -> list[dict[str, Any]]:
    """``n`` seeded problems. ``distinct_kinds``: no two problems share their sequence of step kinds (the same
    sentences with other numbers) while unused sequences are still found; once ``_TEMPLATE_TRIES`` draws in a row
    give none, a new round of sequences starts (so ``n`` may exceed their number). For a small training pool: a tiny
    policy cannot tell ``the sum of the integers from 1 to x0 + 1`` (x0 = 8) from ``… x0 + 6`` (x0 = 7), and RL on
    two such questions trades one's answer for the other's (benchmarks/RESULTS.md, "OREAL-H training")."""
    rng = random.Random(f"{FAMILY}/{seed}/{split}/{steps}/{magnitude}")
    if not distinct_kinds:
        return [make_problem(rng, steps, magnitude, f"{FAMILY}-{split}-{i}") for i in range(n)]
    rows: list[dict[str, Any]] = []
    used: set[tuple[str, ...]] = set()
    while len(rows) < n:
        for _ in range(_TEMPLATE_TRIES):
            row = make_problem(rng, steps, magnitude, f"{FAMILY}-{split}-{len(rows)}")
            kinds = tuple(s["kind"] for s in row["steps"])
            if kinds not in used:
                break
        else:
            used.clear()
        used.add(kinds)
        rows.append(row)
    return rows


def train_test_split(
    n_train: int, n_test: int, seed: int = 0, steps: int = 4, magnitude: int = 1
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Fixed-seed train and test rows; test prompts never occur in train."""
    train = make_rows(n_train, seed, "train", steps, magnitude)
    seen = {r["prompt"] for r in train}
    test = [r for r in make_rows(n_test, seed, "test", steps, magnitude) if r["prompt"] not in seen]
    return train, test


def read_chain(prompt: str) -> tuple[int, list[tuple[StepKind, dict[str, int]]]] | None:
    """Recover ``x0`` and the steps from a problem's text (what a scripted reader does); None if it is not one."""
    m = re.search(r"Let x0 = (-?\d+)\.", prompt)
    if not m:
        return None
    found: list[tuple[int, StepKind, dict[str, int]]] = []
    for kind in KINDS.values():
        for mm in kind.pattern().finditer(prompt):
            g = {k: int(v) for k, v in mm.groupdict().items()}
            cur, prev = g.pop("cur"), g.pop("prev")
            if cur != prev + 1:
                return None
            found.append((cur, kind, g))
    found.sort(key=lambda f: f[0])
    if [f[0] for f in found] != list(range(1, len(found) + 1)) or not found:
        return None
    return int(m.group(1)), [(k, p) for _, k, p in found]


def verify_answer(completion: str, row: dict[str, Any], stopped: bool) -> float:
    """The family's verifier in ``posttrain/rl/task.py``'s signature: 1 iff the last ``ANSWER:`` (or
    ``\\boxed{}``) equals the row's answer by math-verify."""
    ans, boxed = parse_answer(completion), re.findall(r"\\boxed\{([^{}]*)\}", completion)
    value = ans.value if ans is not None else (boxed[-1] if boxed else None)
    return 0.0 if value is None else float(answers_match(value, str(row["answer"])))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="write the lemma-chain train/test jsonl")
    ap.add_argument("--out", required=True)
    ap.add_argument("--train", type=int, default=200)
    ap.add_argument("--test", type=int, default=100)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--magnitude", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    train, test = train_test_split(a.train, a.test, a.seed, a.steps, a.magnitude)
    fs.write_jsonl(Path(a.out) / "train.jsonl", train)
    fs.write_jsonl(Path(a.out) / "test.jsonl", test)
    print(f"{len(train)} train, {len(test)} test rows in {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
