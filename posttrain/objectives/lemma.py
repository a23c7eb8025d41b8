"""Lemma-memory agent credit and the conjugate reward of OREAL-H (SPEC §D, Intern-S1-MO).

- Verifier: n parallel checks per lemma; confidence = fraction passing; accepted when > 0.25, else
  kept as "uncertain" (still usable context, flagged).
- Conjugate reward for k passes out of n: ``r(k, n) = P(p_sol > p_base)`` with
  p_sol ~ Beta(k+1, n−k+1) (posterior of the solution's pass rate under a uniform prior) and
  p_base ~ Beta(1, n+1) (posterior of a baseline that failed all n checks). Computed exactly: for
  integer parameters the Beta CDF is a binomial tail, so the probability is a finite sum of Beta
  functions, evaluated here in rational arithmetic.
- Lemma dependency graph (edges supporting → dependent): on a positive final reward the reward is
  injected at the terminal success lemmas and propagated backwards to every lemma they rest on
  (value(u) = max(own, γ·max over dependents)); a round's value is the max over the lemmas it
  produced; rounds that produced no new lemma are masked out of the advantage.
- Centring (the decision SPEC §D leaves open): r(0, n) = 1/2 for every n, because with no pass the solution's
  posterior *is* the baseline's and ``P(X > Y)`` of two i.i.d. continuous draws is 1/2. The reward the agent
  trains on is ``2·r − 1 = P(p_sol > p_base) − P(p_sol < p_base)``: the probability margin by which the
  solution beats a baseline that fails every check. It is 0 exactly at k = 0 (zero passes earn nothing),
  increasing and concave in k, and below 1 (n=4: 0, 5/9, 5/6, 20/21, 125/126); one affine map, so the
  ordering and ratios of differences of r are untouched. Against the raw pass ratio k/n it saturates:
  3 of 4 (20/21) is worth nearly as much as 4 of 4, so a strong but not unanimous verdict keeps its reward.

Pure torch/stdlib math, no agent code (``posttrain/objectives``: a torch-only leaf).
Run the tests: ``python -m pytest tests/posttrain/test_lemma.py tests/posttrain/lemma -q``
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from math import comb, factorial

import torch
from torch import Tensor

ACCEPT_THRESHOLD = 0.25


def verifier_confidence(passes: Tensor) -> Tensor:
    """``[L, n]`` pass/fail of n parallel checks per lemma → ``[L]`` fraction passing."""
    return passes.to(torch.float32).mean(dim=-1)


def accepted(confidence: Tensor, threshold: float = ACCEPT_THRESHOLD) -> Tensor:
    """Strictly above the threshold (1 of 4 checks = 0.25 is *not* enough)."""
    return confidence > threshold


def _beta_fn(x: int, y: int) -> Fraction:
    return Fraction(factorial(x - 1) * factorial(y - 1), factorial(x + y - 1))


def prob_beta_greater(a1: int, b1: int, a2: int, b2: int) -> Fraction:
    """Exact ``P(X > Y)`` for independent X ~ Beta(a1, b1), Y ~ Beta(a2, b2) with positive integers.

    With N = a1 + b1 − 1, ``F_X(y) = Σ_{j=a1}^{N} C(N, j) y^j (1−y)^{N−j}`` (X ≤ y iff at least a1 of N
    uniforms fall below y), so ``P(X > Y) = 1 − Σ_j C(N, j)·B(a2 + j, b2 + N − j)/B(a2, b2)``.
    """
    if min(a1, b1, a2, b2) < 1:
        raise ValueError("Beta parameters must be positive integers")
    n = a1 + b1 - 1
    b_y = _beta_fn(a2, b2)
    cdf_mean = sum((comb(n, j) * _beta_fn(a2 + j, b2 + n - j) for j in range(a1, n + 1)), Fraction(0))
    return 1 - cdf_mean / b_y


@lru_cache(maxsize=256)
def conjugate_reward_exact(k: int, n: int) -> Fraction:
    """``r(k, n) = P(Beta(k+1, n−k+1) > Beta(1, n+1))`` as an exact rational."""
    if not 0 <= k <= n:
        raise ValueError(f"need 0 ≤ k ≤ n, got k={k}, n={n}")
    return prob_beta_greater(k + 1, n - k + 1, 1, n + 1)


def conjugate_reward(k: int, n: int) -> float:
    """``r(k, n)`` as a float; n=4, k=4 gives 1 − 1/252 ≈ 0.996."""
    return float(conjugate_reward_exact(k, n))


@lru_cache(maxsize=256)
def centred_conjugate_reward_exact(k: int, n: int) -> Fraction:
    """``2·r(k, n) − 1``: 0 at k = 0, 1 − 2/C(2n+2, n+1) at k = n (n=4: 125/126); see the module docstring."""
    return 2 * conjugate_reward_exact(k, n) - 1


def centred_conjugate_reward(k: int, n: int) -> float:
    """The reward a verified item earns from k of n passing checks (``2·r − 1``, 0 for no pass)."""
    return float(centred_conjugate_reward_exact(k, n))


def pass_ratio_reward(k: int, n: int) -> float:
    """The ablation: the raw fraction of passing checks ``k / n``."""
    if not 0 <= k <= n:
        raise ValueError(f"need 0 ≤ k ≤ n, got k={k}, n={n}")
    return k / n


def conjugate_rewards(k: Tensor, n: int) -> Tensor:
    """Vectorised r(k, n) for a tensor of pass counts (table lookup of the exact values)."""
    table = torch.tensor([conjugate_reward(i, n) for i in range(n + 1)], dtype=torch.float64)
    return table[k.to(torch.int64)]


@dataclass(frozen=True)
class Lemma:
    """One lemma produced by the summariser."""

    id: str
    """Unique id within the trajectory."""
    round: int
    """Reasoning round (0-based) that produced it."""
    depends_on: tuple[str, ...] = ()
    """Ids of the lemmas it uses (edges run from those to this one)."""


class LemmaGraph:
    """Dependency DAG of a trajectory's lemmas (edges supporting → dependent)."""

    def __init__(self, lemmas: Sequence[Lemma]) -> None:
        self.lemmas = list(lemmas)
        self.index = {lem.id: i for i, lem in enumerate(self.lemmas)}
        if len(self.index) != len(self.lemmas):
            raise ValueError("duplicate lemma ids")
        n = len(self.lemmas)
        self.adjacency = torch.zeros(n, n, dtype=torch.bool)  # [supporting, dependent]
        for lem in self.lemmas:
            for dep in lem.depends_on:
                if dep not in self.index:
                    raise KeyError(f"lemma {lem.id!r} depends on unknown lemma {dep!r}")
                self.adjacency[self.index[dep], self.index[lem.id]] = True
        self._check_acyclic()

    def _check_acyclic(self) -> None:
        # Kahn's algorithm on the (small) lemma graph; a cycle would make "backwards" meaningless.
        indeg = self.adjacency.sum(dim=0).tolist()
        frontier = [i for i, d in enumerate(indeg) if d == 0]
        seen = 0
        while frontier:
            u = frontier.pop()
            seen += 1
            for v in torch.nonzero(self.adjacency[u]).flatten().tolist():
                indeg[v] -= 1
                if indeg[v] == 0:
                    frontier.append(v)
        if seen != len(self.lemmas):
            raise ValueError("lemma dependencies contain a cycle")

    def propagate(self, terminal: Collection[str], reward: float, gamma: float = 1.0) -> Tensor:
        """Backward reward propagation: ``[L]`` lemma values.

        Zero everywhere unless reward > 0. Terminal success lemmas get the reward; every other lemma
        gets γ × the best value among the lemmas that depend on it, transitively.
        """
        n = len(self.lemmas)
        values = torch.zeros(n, dtype=torch.float64)
        if reward <= 0 or n == 0:
            return values
        missing = [t for t in terminal if t not in self.index]
        if missing:
            raise KeyError(f"unknown terminal lemma(s) {missing}")
        values[[self.index[t] for t in terminal]] = reward
        seed, adj = values, self.adjacency.to(torch.float64)
        # Each pass pushes value one edge further back; a DAG on n nodes settles within n passes.
        for _ in range(n):
            pulled = gamma * (adj * values.unsqueeze(0)).amax(dim=1)
            new = torch.maximum(seed, pulled)
            if torch.equal(new, values):
                break
            values = new
        return values

    def round_values(self, lemma_values: Tensor, n_rounds: int) -> tuple[Tensor, Tensor]:
        """Round value = max over the lemmas it produced; mask False for rounds with no new lemma."""
        rounds = torch.tensor([lem.round for lem in self.lemmas], dtype=torch.int64)
        if len(rounds) and (rounds.min() < 0 or rounds.max() >= n_rounds):
            raise ValueError(f"lemma round outside [0, {n_rounds})")
        out = torch.zeros(n_rounds, dtype=torch.float64)
        out = out.scatter_reduce(0, rounds, lemma_values.to(torch.float64), reduce="amax", include_self=False)
        mask = torch.bincount(rounds, minlength=n_rounds) > 0
        return torch.where(mask, out, torch.zeros_like(out)), mask


def round_advantages(round_values: Tensor, round_mask: Tensor, final_rewards: Tensor) -> Tensor:
    """OREAL-H's high-level advantage per round for G rollouts of one question: ``[G, R]``.

    A round's value (graph credit) minus the leave-one-out mean of the *other* rollouts' final rewards (the
    baseline of the project's Eq 27); masked rounds (no new lemma) and padding get 0. A rollout that failed has
    value 0 everywhere, so its lemma-producing rounds get −baseline.
    """
    g = final_rewards.shape[0]
    if g < 2:
        raise ValueError("round advantages need at least 2 rollouts per question")
    r = final_rewards.to(torch.float64)
    baseline = (r.sum() - r) / (g - 1)
    adv = round_values.to(torch.float64) - baseline.unsqueeze(-1)
    return torch.where(round_mask.bool(), adv, torch.zeros_like(adv))


def saturated_questions(solved: Tensor, group_mask: Tensor | None = None) -> Tensor:
    """``[B, G]`` solved flags → ``[B]`` True where the pass rate is 0 or 1 (S1-MO drops those questions)."""
    valid = torch.ones_like(solved, dtype=torch.bool) if group_mask is None else group_mask.bool()
    n = valid.sum(dim=-1)
    k = (solved.bool() & valid).sum(dim=-1)
    return (k == 0) | (k == n)
