"""``StepOutput.new_tokens``: every engine reports, step by step, exactly the ids it appended to each request.

Summed over the steps of a request (across a pause/resume too) they must equal the finished trajectory's
``token_ids``, and a step's keys are the requests it decoded. This is what lets the agentic gateway stream.
"""

from __future__ import annotations

import torch

from posttrain.rollout.engines.hf import HFEngine
from posttrain.rollout.engines.scripted import ScriptedEngine, ScriptedTokenEngine
from posttrain.rollout.engines.speculative import SpeculativeEngine
from posttrain.rollout.types import Request, SamplingParams
from posttrain.tiny.lm import causal_lm


def tiny(seed: int, vocab: int = 24, hidden: int = 32) -> torch.nn.Module:
    torch.manual_seed(seed)
    return causal_lm(vocab_size=vocab, hidden_size=hidden)


def requests(n: int, max_new: int = 12) -> list[Request]:
    return [
        Request(
            f"r{i}",
            [2] + [3 + (i * 5 + k) % 17 for k in range(1 + i % 3)],
            SamplingParams(max_new_tokens=max_new, seed=i, stop_token_ids=(1,)),
        )
        for i in range(n)
    ]


def drive(engine, reqs: list[Request], pause_after: int | None = None) -> tuple[dict, dict, list[int]]:
    """Step until every request finished; returns (finished by id, ids reported by id, ids reported per step)."""
    engine.submit(reqs)
    finished, reported, per_step = {}, {r.request_id: [] for r in reqs}, []
    steps = 0
    while engine.n_active:
        out = engine.step()
        steps += 1
        assert len(out.new_tokens) == out.n_decoded  # one entry per request that received tokens
        for rid, ids in out.new_tokens.items():
            assert ids, "an entry without ids"
            reported[rid] += ids
        per_step.append(sum(map(len, out.new_tokens.values())))
        for t in out.finished:
            finished[t.request_id] = t
        if steps == pause_after:
            paused = engine.pause()
            assert paused and all(reported[t.request_id] == t.token_ids for t in paused)  # nothing unreported
            engine.resume(paused)
    return finished, reported, per_step


def check(finished: dict, reported: dict, n: int) -> None:
    assert len(finished) == n
    for rid, t in finished.items():
        assert t.n_tokens >= 1 and reported[rid] == t.token_ids


def test_hf_engine_reports_one_id_per_running_request_per_step_across_pause():
    engine = HFEngine(tiny(0), capacity=3)  # 5 requests, 3 slots: some start late
    finished, reported, per_step = drive(engine, requests(5), pause_after=4)
    check(finished, reported, 5)


def test_speculative_engine_reports_every_id_of_a_round():
    engine = SpeculativeEngine(tiny(0), tiny(1, hidden=16), k=3, capacity=4)
    finished, reported, _ = drive(engine, requests(4, max_new=16), pause_after=2)
    check(finished, reported, 4)
    assert engine.emitted > engine.rounds  # some rounds emitted several ids, all of them reported


def test_scripted_engines_report_their_ids():
    finished, reported, per_step = drive(ScriptedEngine(capacity=2), requests(3))
    check(finished, reported, 3)
    assert max(per_step) == 2  # capacity 2: two requests decode per step
    engine = ScriptedTokenEngine(lambda r: [7, 8, 9, 1], capacity=4)
    reqs = [Request(f"s{i}", [2, 3], SamplingParams(max_new_tokens=8, stop_token_ids=(1,))) for i in range(2)]
    finished, reported, _ = drive(engine, reqs)
    check(finished, reported, 2)
    assert all(t.token_ids == [7, 8, 9, 1] for t in finished.values())
