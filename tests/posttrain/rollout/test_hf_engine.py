"""The transformers rollout engine: logprobs agree with the learner, pause/resume, seeded draws, forced lengths."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from posttrain.rl.learner import Learner, LearnerConfig
from posttrain.rollout.engines.hf import HFEngine
from posttrain.rollout.types import FINISH_LENGTH, Request, SamplingParams


def tiny(seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=24,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(cfg).eval()


def requests(n: int, **kw) -> list[Request]:
    base = dict(max_new_tokens=14, stop_token_ids=(1,))
    base.update(kw)
    return [
        Request(f"r{i}", [2] + [3 + (i * 7 + k) % 20 for k in range(1 + i % 4)], SamplingParams(seed=100 + i, **base))
        for i in range(n)
    ]


def drain(engine: HFEngine, pause_at: int | None = None, new_state=None, version: int = 1) -> dict:
    done, k = {}, 0
    while engine.n_active:
        for t in engine.step().finished:
            done[t.request_id] = t
        k += 1
        if k == pause_at:
            held = engine.pause()
            engine.update_weights(new_state or {}, version)
            engine.resume(held)
    return done


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_engine_and_learner_logprobs_agree_after_weight_sync(temperature, top_p):
    learner = Learner(tiny(0), LearnerConfig(), temperature=temperature, top_p=top_p)
    engine = HFEngine(tiny(1), capacity=5)  # different weights until the sync
    engine.update_weights(learner.weights(), 1)
    engine.submit(requests(9, temperature=temperature, top_p=top_p))
    done = list(drain(engine, pause_at=3, new_state=learner.weights(), version=2).values())
    assert len(done) == 9 and any(t.n_tokens > 5 for t in done)
    lp = learner.logprobs(done)
    for i, t in enumerate(done):
        diff = (lp[i, : t.n_tokens] - torch.tensor(t.logprobs)).abs().max().item()
        assert diff <= 1e-5, (t.request_id, diff)


def test_pause_keeps_prefix_and_continuation_matches_uninterrupted():
    model = tiny(0)
    a = HFEngine(copy.deepcopy(model), capacity=4)
    a.submit(requests(6))
    plain = drain(a)
    b = HFEngine(copy.deepcopy(model), capacity=4)
    b.submit(requests(6))
    paused = drain(b, pause_at=4, new_state=model.state_dict(), version=1)
    for rid, t in plain.items():
        u = paused[rid]
        assert u.token_ids == t.token_ids  # KV recomputed under equal weights: same draws, same tokens
        assert max(abs(x - y) for x, y in zip(u.logprobs, t.logprobs)) < 1e-5
        assert all(x <= y for x, y in zip(u.versions, u.versions[1:]))
    assert any(1 in t.versions and 0 in t.versions for t in paused.values())


def test_batched_decode_matches_one_request_at_a_time():
    model = tiny(3)
    one = HFEngine(copy.deepcopy(model), capacity=1)
    one.submit(requests(5))
    many = HFEngine(copy.deepcopy(model), capacity=5)
    many.submit(requests(5))
    r1, r5 = drain(one), drain(many)
    assert {k: v.token_ids for k, v in r1.items()} == {k: v.token_ids for k, v in r5.items()}


def test_weight_sync_changes_the_policy_and_version_stamps():
    engine = HFEngine(tiny(0), capacity=3)
    engine.submit(requests(3, forced_length=6))
    before = drain(engine)
    engine.update_weights(tiny(5).state_dict(), 7)
    engine.submit(requests(3, forced_length=6))
    after = drain(engine)
    assert all(t.versions == [7] * 6 for t in after.values())
    assert any(before[k].logprobs != after[k].logprobs for k in before)


def test_forced_length_ignores_eos_and_occupancy_counts():
    engine = HFEngine(tiny(0), capacity=4)
    engine.submit(requests(4, forced_length=9, stop_token_ids=tuple(range(24))))
    out = engine.step()
    assert out.n_decoded == 4 and out.n_prefilled_tokens > 0
    done = drain(engine)
    assert all(t.n_tokens == 9 and t.finish_reason == FINISH_LENGTH for t in done.values())


def test_update_weights_refuses_while_running_and_abort_hands_back():
    engine = HFEngine(tiny(0), capacity=2)
    engine.submit(requests(3, forced_length=5))
    engine.step()
    with pytest.raises(RuntimeError):
        engine.update_weights({}, 1)
    back = engine.abort(["r0", "r2"])
    assert {t.request_id for t in back} == {"r0", "r2"} and all(t.finish_reason == "abort" for t in back)
    assert back[0].n_tokens == 1 and engine.n_active == 1
    with pytest.raises(KeyError):
        engine.pause()
        engine.update_weights({"nope.weight": torch.zeros(1)}, 1)
