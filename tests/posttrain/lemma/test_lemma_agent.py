"""The lemma agent's worked numbers (issue 23 acceptance): conjugate values and centring, 1 of 4 uncertain and
2 of 4 accepted, the 8 + 8 round budgets, round value = max over its lemmas, no-lemma rounds masked, backward
propagation only after a positive final reward (a hand-built graph with known values); plus batching and the
recorded tokens.

Run: python -m pytest tests/posttrain/lemma/test_lemma_agent.py -q
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import pytest

from posttrain.lemma.agent import AgentConfig, AnswerRecord, LemmaAgent, MemoryEntry, RoundRecord, Trace
from posttrain.lemma.credit import batch_metrics, trace_credit
from posttrain.lemma.scripted import scripted_caller
from posttrain.lemma.statements import answers_match
from posttrain.lemma.tasks import make_rows
from posttrain.lemma.verifiers import CheckItem, FormalVerifier, Verdict
from posttrain.objectives.lemma import centred_conjugate_reward_exact, conjugate_reward_exact


def test_conjugate_values_and_centring() -> None:
    assert [conjugate_reward_exact(k, 4) for k in range(5)] == [
        Fraction(1, 2),
        Fraction(7, 9),
        Fraction(11, 12),
        Fraction(41, 42),
        Fraction(251, 252),
    ]
    # 2r - 1: zero passes earn nothing, for every n
    assert [centred_conjugate_reward_exact(k, 4) for k in range(5)] == [
        0,
        Fraction(5, 9),
        Fraction(5, 6),
        Fraction(20, 21),
        Fraction(125, 126),
    ]
    assert all(centred_conjugate_reward_exact(0, n) == 0 for n in range(1, 9))


class PatternVerifier:
    """Passes the k-th lemma of a batch per a fixed pattern; answers per ``answer_ok``."""

    def __init__(self, lemma_passes: dict[str, int], answer_ok: bool = True) -> None:
        self.lemma_passes = lemma_passes
        self.answer_ok = answer_ok
        self.batches: list[int] = []

    def check(self, items: Sequence[CheckItem], n: int) -> list[Verdict]:
        self.batches.append(len(items))
        out = []
        for it in items:
            k = (
                self.lemma_passes.get(it.text.split(": ", 1)[-1].split(" ")[0], n)
                if it.kind == "lemma"
                else (n if self.answer_ok else 0)
            )
            out.append(Verdict([True] * k + [False] * (n - k)))
        return out


def _two_step_row() -> dict:
    return {
        "id": "p",
        "prompt": "Let x0 = 4. Let x1 = gcd(x0 + 8, 36). Let x2 be the number of positive divisors of x1 + 0. Find x2.",
        "answer": "6",
    }


def test_one_of_four_is_uncertain_two_of_four_accepted() -> None:
    # the gcd lemma gets 1 pass of 4, the divisor_count lemma 2 of 4
    v = PatternVerifier({"gcd(4": 1, "divisor_count(12": 2})
    agent = LemmaAgent(scripted_caller(p_correct=1.0), v, AgentConfig(reasoner_tokens=400, summariser_tokens=600))
    (t,) = agent.solve([_two_step_row()])
    status = {m.statement.split(" ")[1][:13]: (m.status, m.confidence) for m in t.memory[:2]}
    assert status == {"gcd(4": ("uncertain", 0.25), "divisor_count": ("accepted", 0.5)}


def test_budgets_of_eight_plus_eight_rounds() -> None:
    # a reasoner whose budget fits no step never answers; the reviser's too-small budget answers x0: always wrong
    caller = scripted_caller(p_correct=1.0, tokens_per_step=500)
    agent = LemmaAgent(
        caller, FormalVerifier(), AgentConfig(reasoner_tokens=100, summariser_tokens=50, reviser_tokens=60)
    )
    rows = [r for r in make_rows(10, seed=5, split="test", steps=3) if r["answer"] != str(r["x0"])][:3]
    traces = agent.solve(rows)
    assert len(traces) == 3
    for t in traces:
        roles = [c.role for c in t.calls]
        assert roles.count("reasoner") == 8 and roles.count("summariser") == 8 and roles.count("reviser") == 8
        assert [r.phase for r in t.rounds] == ["reason"] * 8 + ["revise"] * 8
        assert len(t.answers) == 8 and not any(a.accepted for a in t.answers)
        assert t.final == t.answers[-1].id  # every answer rejected: the last one stands
        credit = trace_credit(t)
        assert credit.reward == 0.0 and credit.round_mask == [False] * 8 + [True] * 8  # no lemma: masked
        assert all(v == 0.0 for v in credit.lemma_values.values())


def test_agent_solves_batches_and_records_every_call() -> None:
    caller = scripted_caller(p_correct=1.0)
    sizes: list[int] = []
    submit = caller.engine.submit
    caller.engine.submit = lambda reqs: (sizes.append(len(reqs)), submit(reqs))[1]
    v = PatternVerifier({})
    rows = make_rows(5, seed=1, split="test", steps=4)
    traces = LemmaAgent(caller, v, AgentConfig(reasoner_tokens=300, summariser_tokens=800)).solve(rows)
    assert all(answers_match(t.final_answer().value, t.problem["answer"]) for t in traces)
    assert sizes[:2] == [5, 5]  # round 0: one engine pass for the 5 reasoners, one for the 5 summarisers
    assert v.batches[0] == 10  # 5 problems x 2 lemmas each, verified in one batch
    for t in traces:
        for c in t.calls:
            assert c.token_ids and len(c.token_ids) == len(c.logprobs) == len(c.versions)
            assert c.problem_id == t.problem_id
        credit = trace_credit(t)
        assert credit.reward == pytest.approx(125 / 126)
        # the final answer rests on the whole chain: every step lemma gets the reward back
        assert all(credit.lemma_values[m.id] == pytest.approx(125 / 126) for m in t.memory)


def _hand_trace(final_passes: list[bool]) -> Trace:
    """Round 0: M1, M2 (M2 uses M1). Round 1: M3 (uses M2), M4 (uses M1, a dead end). Round 2: nothing.
    Round 3: M5 (unrelated). Round 4 (revise): answer A4 uses M3."""
    t = Trace({"id": "h", "prompt": "", "answer": "1"})
    t.memory = [
        MemoryEntry("M1", "s1", "", 0, []),
        MemoryEntry("M2", "s2", "", 0, ["M1"]),
        MemoryEntry("M3", "s3", "", 1, ["M2"]),
        MemoryEntry("M4", "s4", "", 1, ["M1"]),
        MemoryEntry("M5", "s5", "", 3, []),
    ]
    t.answers = [AnswerRecord("A4", "1", 4, ["M3"], final_passes, sum(final_passes) > 1)]
    t.rounds = [RoundRecord(i, "reason" if i < 4 else "revise") for i in range(5)]
    t.final = "A4"
    return t


def test_hand_built_graph_known_values() -> None:
    r3 = 20 / 21  # 3 of 4 checks on the final answer, centred conjugate
    c = trace_credit(_hand_trace([True, True, True, False]))
    assert c.reward == pytest.approx(r3)
    assert c.lemma_values == pytest.approx({"M1": r3, "M2": r3, "M3": r3, "M4": 0.0, "M5": 0.0, "A4": r3})
    assert c.round_values == pytest.approx([r3, r3, 0.0, 0.0, r3])  # round 1 = max(M3, M4)
    assert c.round_mask == [True, True, False, True, True]  # round 2 produced nothing
    assert sorted(c.edges) == [("M1", "M2"), ("M1", "M4"), ("M2", "M3"), ("M3", "A4")]
    g = trace_credit(_hand_trace([True, True, True, False]), gamma=0.5)
    assert [g.lemma_values[k] for k in ("A4", "M3", "M2", "M1", "M4")] == pytest.approx(
        [r3, r3 / 2, r3 / 4, r3 / 8, 0.0]
    )
    ratio = trace_credit(_hand_trace([True, True, True, False]), reward="ratio")
    assert ratio.reward == 0.75 and ratio.lemma_values["M1"] == 0.75
    flat = trace_credit(_hand_trace([True, True, True, False]), graph=False)
    assert flat.round_values == pytest.approx([r3, r3, 0.0, r3, r3])  # graph off: M5's round gets it too


def test_no_propagation_without_a_positive_final_reward() -> None:
    c = trace_credit(_hand_trace([False] * 4))
    assert c.reward == 0.0 and set(c.lemma_values.values()) == {0.0} and c.round_values == [0.0] * 5
    assert c.round_mask == [True, True, False, True, True]  # masking does not depend on the reward


def test_answer_on_an_uncertain_lemma_keeps_reasoning() -> None:
    # round 0 derives both steps but the first slips (p_correct 0 for that call only): its lemma is rejected,
    # so the answer resting on it does not end the reasoning; round 1 re-derives from the accepted memory
    caller = scripted_caller(p_correct=1.0)
    policy = caller.policy
    calls = {"n": 0}
    real = policy.reason

    def reason(prompt, request):  # noqa: ANN001, ANN202
        calls["n"] += 1
        policy.p_correct = 0.0 if calls["n"] == 1 else 1.0
        return real(prompt, request)

    policy.reason = reason
    (t,) = LemmaAgent(caller, FormalVerifier(), AgentConfig(reasoner_tokens=400, summariser_tokens=800)).solve(
        [_two_step_row()]
    )
    assert [r.phase for r in t.rounds] == ["reason", "reason", "revise"]
    assert t.answers[0].round == 0 and not LemmaAgent.supported(t, t.answers[0].uses)
    final = t.final_answer()
    assert final.round == 1 and final.accepted and final.value == "6"
    assert (
        t.memory[0].status == "uncertain" and t.memory[0].superseded_by is None
    )  # a different (right) statement came next


def test_one_policy_plays_the_verifier_and_its_calls_join_the_trace() -> None:
    from posttrain.lemma.verifiers import ModelVerifier

    caller = scripted_caller(p_correct=1.0)
    agent = LemmaAgent(caller, ModelVerifier(caller), AgentConfig(reasoner_tokens=400, summariser_tokens=600))
    (t,) = agent.solve([_two_step_row()])
    assert t.final_answer().value == "6" and t.final_answer().accepted
    ver = [c for c in t.calls if c.role == "verifier"]
    assert len(ver) == 4 * (len(t.memory) + len(t.answers))  # n = 4 sampled judgements per lemma and answer
    assert all(c.problem_id == "p" and c.token_ids and len(c.logprobs) == len(c.token_ids) for c in ver)
    assert all(c.call_id in t.rounds[c.round].call_ids for c in ver)
    assert [m.status for m in t.memory] == ["accepted", "accepted"]


def test_batch_metrics_row() -> None:
    good, bad = _hand_trace([True, True, True, False]), _hand_trace([False] * 4)
    good.memory[0].status = "accepted"
    m = batch_metrics([good, bad])
    assert m["reward"] == pytest.approx((20 / 21) / 2)
    assert m["solved"] == 1.0  # both final answers are "1", the reference
    assert m["accepted_per_round"] == pytest.approx(1 / 8) and m["uncertain_per_round"] == pytest.approx(9 / 8)
    assert m["masked_rounds"] == pytest.approx(2 / 10) and m["rounds"] == 5


def test_multi_round_with_memory_beats_one_round_at_the_same_budget() -> None:
    """The acceptance experiment in small (benchmarks/lemma_agent.py runs it on 100 problems)."""
    from posttrain.lemma.tasks import train_test_split
    from posttrain.lemma.verifiers import NoisyVerifier

    _, test = train_test_split(0, 16, seed=0, steps=6)
    multi = AgentConfig(reasoner_tokens=280, summariser_tokens=600, reviser_tokens=280)
    budget = 8 * (280 + 600) + 8 * 280
    single = AgentConfig(max_rounds=1, max_revisions=0, reasoner_tokens=budget, summariser_tokens=600)

    def solved(cfg: AgentConfig) -> int:
        traces = LemmaAgent(scripted_caller(p_correct=0.7), NoisyVerifier(0.931, 0.818, seed=0), cfg).solve(test)
        assert all(t.policy_tokens() <= budget for t in traces)
        return sum(answers_match(t.final_answer().value, t.problem["answer"]) for t in traces if t.final_answer())

    m, s = solved(multi), solved(single)
    assert m >= s + 5, (m, s)  # 100-problem run: 94 % vs 40 %
