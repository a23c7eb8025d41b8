"""Tests for posttrain.objectives.lemma (SPEC §D: verifier, conjugate reward, lemma graph credit).

Run: python -m pytest tests/posttrain/test_lemma.py -q
"""

from __future__ import annotations

from fractions import Fraction
from math import comb

import pytest
import torch

from posttrain.objectives.lemma import (
    Lemma,
    LemmaGraph,
    accepted,
    conjugate_reward,
    conjugate_reward_exact,
    conjugate_rewards,
    prob_beta_greater,
    verifier_confidence,
)


def test_verifier_confidence_and_acceptance() -> None:
    passes = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)
    conf = verifier_confidence(passes)
    assert conf.tolist() == [0.25, 0.5, 1.0, 0.0]
    assert accepted(conf).tolist() == [False, True, True, False]  # 0.25 is not > 0.25: "uncertain"


def test_conjugate_reward_worked() -> None:
    assert conjugate_reward(4, 4) == pytest.approx(0.996, abs=5e-4)
    # k = n closed form: 1 − E[Y^{n+1}] for Y ~ Beta(1, n+1) = 1 − 1/C(2n+2, n+1).
    for n in range(1, 9):
        assert conjugate_reward_exact(n, n) == 1 - Fraction(1, comb(2 * n + 2, n + 1))
    assert conjugate_reward_exact(4, 4) == Fraction(251, 252)


def test_conjugate_reward_properties() -> None:
    for n in range(1, 9):
        vals = [conjugate_reward(k, n) for k in range(n + 1)]
        assert all(a < b for a, b in zip(vals, vals[1:]))  # strictly increasing in k
        assert vals[0] == pytest.approx(0.5)  # k = 0: both posteriors are Beta(1, n+1)
    assert prob_beta_greater(2, 3, 2, 3) == Fraction(1, 2)
    assert prob_beta_greater(3, 2, 2, 3) + prob_beta_greater(2, 3, 3, 2) == 1  # P(X>Y) + P(Y>X) = 1
    with pytest.raises(ValueError):
        conjugate_reward(5, 4)


def test_conjugate_reward_against_numerical_integration() -> None:
    stats = pytest.importorskip("scipy.stats")
    integrate = pytest.importorskip("scipy.integrate")
    for n in range(1, 9):
        for k in range(n + 1):
            num = integrate.quad(
                lambda y, k=k, n=n: stats.beta(1, n + 1).pdf(y) * stats.beta(k + 1, n - k + 1).sf(y),
                0,
                1,
                epsabs=1e-13,
                epsrel=1e-13,
            )[0]
            assert conjugate_reward(k, n) == pytest.approx(num, abs=1e-9)


def test_conjugate_reward_against_monte_carlo_without_scipy() -> None:
    n, m = 4, 400_000
    for k in (1, 3):
        x = torch.distributions.Beta(torch.tensor(float(k + 1)), torch.tensor(float(n - k + 1)))
        y = torch.distributions.Beta(torch.tensor(1.0), torch.tensor(float(n + 1)))
        torch.manual_seed(k)
        est = (x.sample((m,)) > y.sample((m,))).double().mean().item()
        assert est == pytest.approx(conjugate_reward(k, n), abs=4e-3)


def test_conjugate_rewards_vectorised() -> None:
    k = torch.tensor([[0, 4], [2, 1]])
    out = conjugate_rewards(k, 4)
    assert out.shape == (2, 2)
    assert out[0, 1].item() == conjugate_reward(4, 4)


def _graph() -> LemmaGraph:
    return LemmaGraph(
        [
            Lemma("a", 0),
            Lemma("d", 0),
            Lemma("b", 1, ("a",)),
            Lemma("e", 1, ("d",)),
            Lemma("c", 3, ("b", "a")),
        ]
    )


def test_backward_propagation() -> None:
    g = _graph()
    v = g.propagate(terminal={"c"}, reward=1.0)
    assert dict(zip([lem.id for lem in g.lemmas], v.tolist())) == {"a": 1.0, "d": 0.0, "b": 1.0, "e": 0.0, "c": 1.0}
    v = g.propagate(terminal={"c"}, reward=1.0, gamma=0.5)
    # a supports c directly (0.5) and via b (0.25): the max wins.
    assert dict(zip([lem.id for lem in g.lemmas], v.tolist()))["a"] == 0.5
    assert g.propagate(terminal={"c"}, reward=0.0).eq(0).all()  # no injection without success


def test_round_values_and_mask() -> None:
    g = _graph()
    values, mask = g.round_values(g.propagate({"c"}, 1.0, gamma=0.5), n_rounds=5)
    assert mask.tolist() == [True, True, False, True, False]
    assert values.tolist() == [0.5, 0.5, 0.0, 1.0, 0.0]  # round 0 = max(a=0.5, d=0); round 1 = max(b, e)


def test_graph_validation() -> None:
    with pytest.raises(ValueError, match="cycle"):
        LemmaGraph([Lemma("x", 0, ("y",)), Lemma("y", 0, ("x",))])
    with pytest.raises(KeyError):
        LemmaGraph([Lemma("x", 0, ("nope",))])
    with pytest.raises(ValueError, match="duplicate"):
        LemmaGraph([Lemma("x", 0), Lemma("x", 1)])
    with pytest.raises(KeyError):
        _graph().propagate({"zzz"}, 1.0)
    with pytest.raises(ValueError):
        _graph().round_values(torch.zeros(5), n_rounds=2)
