"""Memory Decoder fused decoding (Eq 3) inside the RL engine: ``HFEngine(FusedLM(base, memory, router))``.

The engine's behaviour logprobs are the fused model's, position by position (checked against a cache-free
forward of the whole sequence), with requests of different lengths batched and left-padded together, across a
pause/resume; a weight sync reaches the base only; the RL loop runs with the option through the CLI."""

from __future__ import annotations

import json

import torch

from posttrain.memdec.fused import FusedLM
from posttrain.objectives.memory_decoder import Router, RouterConfig
from posttrain.rollout.engines.hf import HFEngine
from posttrain.rollout.types import Request, SamplingParams
from posttrain.tiny.lm import causal_lm


def fused_model(seed: int = 0) -> FusedLM:
    torch.manual_seed(seed)
    base = causal_lm(vocab_size=48, hidden_size=32)
    memory = causal_lm(vocab_size=48, hidden_size=16)  # smaller, its own KV shapes
    router = Router(RouterConfig(32, 16, width=8))
    with torch.no_grad():
        router.net[-1].bias.fill_(0.0)  # λ around 0.5: both models matter
    return FusedLM(base, memory, router)


def drive(engine, requests, pause_at: int | None = None):
    engine.submit(requests)
    done, steps = {}, 0
    while engine.n_active:
        for t in engine.step().finished:
            done[t.request_id] = t
        steps += 1
        if steps == pause_at:
            engine.resume(engine.pause())
    return done


def test_engine_logprobs_are_the_fused_distributions_at_every_position():
    model = fused_model()
    reqs = [
        Request(f"r{i}", list(range(3, 3 + n)), SamplingParams(max_new_tokens=7, ignore_eos=True, seed=i))
        for i, n in enumerate((2, 5, 9))
    ]
    done = drive(HFEngine(model, capacity=4), reqs, pause_at=3)
    assert len(done) == 3
    with torch.no_grad():
        for t in done.values():
            seq = torch.tensor([t.prompt_ids + t.token_ids])
            logp = model(input_ids=seq).logits[0]  # log p_fused at every position, no cache, no padding
            at = len(t.prompt_ids) - 1 + torch.arange(len(t.token_ids))
            want = logp[at, torch.tensor(t.token_ids)]
            assert torch.allclose(torch.tensor(t.logprobs), want, atol=1e-4), (t.logprobs, want.tolist())
            # and they are not the base's own (the memory really enters the distribution)
            base = torch.log_softmax(model.base(input_ids=seq).logits[0].float(), -1)[at, torch.tensor(t.token_ids)]
            assert (base - want).abs().max() > 1e-2


def test_a_weight_sync_updates_the_base_and_leaves_memory_and_router():
    model = fused_model()
    engine = HFEngine(model, capacity=2)
    new = {k: v + 0.01 for k, v in model.base.state_dict().items()}
    mem0 = {k: v.clone() for k, v in model.memory.state_dict().items()}
    engine.update_weights(new, 1)
    assert engine.version == 1
    assert all(torch.equal(model.base.state_dict()[k], v) for k, v in new.items())
    assert all(torch.equal(model.memory.state_dict()[k], v) for k, v in mem0.items())


def test_rl_loop_with_fused_rollouts_through_the_cli(tmp_path):
    from pipelines.cli import main

    out = tmp_path / "rl"
    sets = ["steps=2", "memdec.enabled=true"]
    assert main(["posttrain", "rl", "--config", "debug", "--out", str(out), "--no-progress",
                 *(x for s in sets for x in ("--set", s))]) == 0  # fmt: skip
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(0.0 < r["memdec_lambda_mean"] < 1.0 for r in rows)
