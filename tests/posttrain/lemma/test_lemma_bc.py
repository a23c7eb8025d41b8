"""Cold-start BC data: only the credited rounds of solved problems, exact sampled ids, prompt masked out.

Run: python -m pytest tests/posttrain/lemma/test_lemma_bc.py -q
"""

from __future__ import annotations

from posttrain.lemma.agent import AgentConfig, LemmaAgent
from posttrain.lemma.bc import collate, examples_from_traces, read_jsonl, write_jsonl
from posttrain.lemma.scripted import scripted_caller
from posttrain.lemma.verifiers import FormalVerifier

ROW = {
    "id": "p",
    "prompt": "Let x0 = 4. Let x1 = gcd(x0 + 8, 36). Let x2 be the number of positive divisors of x1 + 0. Find x2.",
    "answer": "6",
}


def _traces():
    caller = scripted_caller(p_correct=1.0)
    policy, real, n = caller.policy, caller.policy.reason, {"calls": 0}

    def reason(prompt, request):  # noqa: ANN001, ANN202 -- round 0's reasoner slips on every step
        n["calls"] += 1
        policy.p_correct = 0.0 if n["calls"] == 1 else 1.0
        return real(prompt, request)

    policy.reason = reason
    unsolvable = {
        "id": "q",
        "prompt": "Let x0 = 4. Let x1 = gcd(x0 + 8, 36). Find x1.",
        "answer": "13",
    }  # wrong reference
    cfg = AgentConfig(reasoner_tokens=400, summariser_tokens=800, max_revisions=2)
    return caller, LemmaAgent(caller, FormalVerifier(), cfg).solve([ROW, unsolvable])


def test_bc_keeps_only_credited_rounds_of_solved_problems(tmp_path) -> None:
    caller, (t, bad) = _traces()
    assert t.final_answer().round == 1 and bad.final_answer() is not None and not bad.final_answer().accepted
    ex = examples_from_traces([t, bad])
    assert [(e.problem_id, e.round, e.role) for e in ex] == [("p", 1, "reasoner"), ("p", 1, "summariser")]
    by_id = {c.call_id: c for c in t.calls}
    for e, call_id in zip(ex, t.rounds[1].call_ids):
        c = by_id[call_id]
        assert e.input_ids == c.prompt_ids + c.token_ids  # exactly what was sampled
        assert e.loss_mask == [0] * len(c.prompt_ids) + [1] * len(c.token_ids)
        assert e.weight == 125 / 126
    generated = caller.codec.decode([i for i, m in zip(ex[1].input_ids, ex[1].loss_mask) if m])
    assert "LEMMA: int: gcd(4 + 8, 36) = 12" in generated and "ANSWER: 6" in generated
    write_jsonl(ex, tmp_path / "bc.jsonl")
    assert read_jsonl(tmp_path / "bc.jsonl") == ex
    batch = collate(ex, pad_id=0)
    n = max(len(e.input_ids) for e in ex)
    assert batch["input_ids"].shape == (2, n) and int(batch["loss_mask"].sum()) == sum(sum(e.loss_mask) for e in ex)
    assert int(batch["attention_mask"][0].sum()) == len(ex[0].input_ids)
