"""R3 on a tiny Qwen2-MoE (4 experts, top-2): record on the engine side, replay in the learner (SPEC C3)."""

from __future__ import annotations

import copy

import pytest
import torch

from posttrain.objectives.r3 import RoutingRecorder, RoutingReplay, batch_routes, check_router_formula, find_routers
from posttrain.tiny.moe import build_tiny_moe_lm

PROMPT_LEN, NEW_TOKENS = 5, 12


@pytest.fixture(scope="module")
def model():
    return build_tiny_moe_lm(seed=0)


def _generate(model, prompt: torch.Tensor, n_new: int, seed: int):
    """Engine-style sampling: prefill, then one token per step on a KV cache, recording routes all along."""
    from transformers import DynamicCache

    gen = torch.Generator().manual_seed(seed)
    cache = DynamicCache(config=model.config)
    tokens, logps = [], []
    with RoutingRecorder(model) as rec, torch.no_grad():
        out = model(input_ids=prompt[None], cache=cache, use_cache=True)
        for i in range(n_new):
            logp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
            tok = torch.multinomial(logp.exp(), 1, generator=gen)
            tokens.append(int(tok))
            logps.append(float(logp[tok]))
            if i < n_new - 1:  # the last sampled token is never fed back, so it has no route
                out = model(input_ids=tok[None], cache=cache, use_cache=True)
        routes = rec.pop()
    return torch.tensor(tokens), torch.tensor(logps), routes


def _learner_logprobs(model, seq: torch.Tensor, n_new: int, routes: torch.Tensor | None):
    """Logprob of each sampled token from one full-sequence forward, optionally replaying ``routes``."""
    if routes is None:
        logits = model(input_ids=seq[None]).logits
        replay = None
    else:
        padded = batch_routes([routes], seq.shape[0], [0], routes.shape[1], routes.shape[2])
        with RoutingReplay(model, padded) as replay:
            logits = model(input_ids=seq[None]).logits
    logp = torch.log_softmax(logits[0, -n_new - 1 : -1].float(), dim=-1)
    return logp.gather(-1, seq[-n_new:, None])[:, 0], replay


def _router_inputs(model, seq: torch.Tensor) -> list[torch.Tensor]:
    captured = []
    hooks = [
        r.register_forward_pre_hook(lambda _m, args: captured.append(args[0].detach())) for r in find_routers(model)
    ]
    try:
        with torch.no_grad():
            model(input_ids=seq[None])
    finally:
        for h in hooks:
            h.remove()
    return captured


def _flip_routes_keeping_recorded_logits(model, seq: torch.Tensor, routes: torch.Tensor) -> torch.nn.Module:
    """A learner copy whose routers pick other experts on many tokens while every recorded expert's logit is unchanged.

    Per layer, one expert's router row moves by a vector orthogonal to the hidden states of the tokens that chose
    it, and raises its logit above the top-1 on every token that did not: the live top-2 changes there. With
    renormalised top-k weights the replayed gate weights depend only on the recorded experts' logits, so replay
    must reproduce the engine exactly, and no replay must not.
    """
    learner = copy.deepcopy(model)
    n = routes.shape[0]
    for layer, (router, hidden) in enumerate(zip(find_routers(learner), _router_inputs(model, seq), strict=True)):
        h = hidden[:n].double()
        logits = h @ router.weight.detach().double().T
        expert = int(torch.bincount(routes[:, layer].flatten().long(), minlength=logits.shape[1]).argmin())
        chosen = (routes[:, layer].long() == expert).any(dim=-1)
        target = torch.where(chosen, torch.zeros(n, dtype=h.dtype), logits.max(-1).values - logits[:, expert] + 1.0)
        delta = torch.linalg.lstsq(h, target[:, None], driver="gelsd").solution[:, 0]
        with torch.no_grad():
            router.weight[expert] += delta.float()
    return learner


def test_recorded_experts_shape_and_range(model):
    prompt = torch.arange(3, 3 + PROMPT_LEN)
    _tokens, _logps, routes = _generate(model, prompt, NEW_TOKENS, seed=1)
    assert routes.shape == (PROMPT_LEN + NEW_TOKENS - 1, 2, 2)  # [tokens, layers, top_k]
    assert int(routes.min()) >= 0 and int(routes.max()) < 4
    assert (routes[..., 0] != routes[..., 1]).all()  # top-2 picks two distinct experts


def test_router_formula_matches_the_model(model):
    for router in find_routers(model):
        check_router_formula(router)


def test_replay_matches_engine_under_perturbed_router_and_plain_forward_does_not(model):
    prompt = torch.arange(3, 3 + PROMPT_LEN)
    tokens, engine_logps, routes = _generate(model, prompt, NEW_TOKENS, seed=2)
    seq = torch.cat([prompt, tokens])

    # Same weights, own routes: replay is an identity on the forward.
    same, _ = _learner_logprobs(model, seq, NEW_TOKENS, routes)
    assert torch.allclose(same, engine_logps, atol=1e-5)

    learner = _flip_routes_keeping_recorded_logits(model, seq, routes)
    plain, _ = _learner_logprobs(learner, seq, NEW_TOKENS, None)
    replayed, replay = _learner_logprobs(learner, seq, NEW_TOKENS, routes)

    assert replay.changed_routes >= 4  # the live routers really disagree with the recorded routes
    assert (replayed - engine_logps).abs().max() <= 1e-5
    assert (plain - engine_logps).abs().max() > 1e-2


def test_router_gets_gradient_under_replay(model):
    prompt = torch.arange(7, 7 + PROMPT_LEN)
    tokens, _logps, routes = _generate(model, prompt, NEW_TOKENS, seed=3)
    seq = torch.cat([prompt, tokens])
    learner = _flip_routes_keeping_recorded_logits(model, seq, routes)
    learner.train()
    logps, _ = _learner_logprobs(learner, seq, NEW_TOKENS, routes)
    (-logps.sum()).backward()
    for router in find_routers(learner):
        assert router.weight.grad is not None
        assert torch.isfinite(router.weight.grad).all()
        assert router.weight.grad.abs().sum() > 0


def test_replaying_own_routes_leaves_gradients_unchanged(model):
    seq = torch.arange(1, 1 + PROMPT_LEN + NEW_TOKENS)
    with RoutingRecorder(model) as rec, torch.no_grad():
        model(input_ids=seq[None])
        routes = rec.pop()
    grads = []
    for replay in (False, True):
        learner = copy.deepcopy(model)
        logps, _ = _learner_logprobs(learner, seq, NEW_TOKENS, routes if replay else None)
        (-logps.sum()).backward()
        grads.append([r.weight.grad.clone() for r in find_routers(learner)])
    for plain, replayed in zip(*grads, strict=True):
        assert torch.allclose(plain, replayed, atol=1e-6)


def test_batch_routes_pads_with_live_marker():
    a = torch.ones(3, 2, 2, dtype=torch.int16)
    out = batch_routes([a, None], seq_len=5, offsets=[1, 0], layers=2, top_k=2)
    assert out.shape == (2, 5, 2, 2)
    assert (out[0, 1:4] == 1).all() and (out[0, 0] == -1).all() and (out[0, 4] == -1).all()
    assert (out[1] == -1).all()


def test_replay_rejects_wrong_shapes(model):
    with pytest.raises(ValueError, match="layers"):
        RoutingReplay(model, torch.zeros(4, 3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="top_k"):
        RoutingReplay(model, torch.zeros(4, 2, 3, dtype=torch.long))
    with RoutingReplay(model, torch.zeros(4, 2, 2, dtype=torch.long)), pytest.raises(ValueError, match="tokens"):
        model(input_ids=torch.arange(5)[None])


def test_hf_engine_records_routes_and_learner_replay_reproduces_its_logprobs(model):
    from posttrain.objectives.r3 import EngineRoutingRecorder, replay_trajectories
    from posttrain.rollout.engines.hf import HFEngine
    from posttrain.rollout.types import Request, SamplingParams

    engine_model = copy.deepcopy(model)
    engine = HFEngine(engine_model, capacity=4)
    recorder = EngineRoutingRecorder(engine_model)
    engine.experts_recorder = recorder
    params = SamplingParams(max_new_tokens=NEW_TOKENS, forced_length=NEW_TOKENS, return_routed_experts=True)
    prompts = [list(range(3, 3 + PROMPT_LEN)), list(range(20, 20 + PROMPT_LEN + 2))]
    engine.submit([Request(f"r{i}", p, params=params) for i, p in enumerate(prompts)])
    done = []
    while engine.n_active:
        done += engine.step().finished
    recorder.close()
    done.sort(key=lambda t: t.request_id)

    seq_len = max(len(t.prompt_ids) + t.n_tokens for t in done)
    offsets = [seq_len - len(t.prompt_ids) - t.n_tokens for t in done]  # left padding
    for t in done:
        assert len(t.routed_experts) == len(t.prompt_ids) + t.n_tokens - 1
        assert len(t.routed_experts[0]) == 2 and len(t.routed_experts[0][0]) == 2

    ids = torch.zeros(len(done), seq_len, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (t, off) in enumerate(zip(done, offsets, strict=True)):
        ids[i, off:] = torch.tensor(t.prompt_ids + t.token_ids)
        mask[i, off:] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)

    # The learner's router differs (routes flipped on the first trajectory's tokens); replay undoes that.
    first = torch.tensor(done[0].prompt_ids + done[0].token_ids)
    learner = _flip_routes_keeping_recorded_logits(model, first, torch.tensor(done[0].routed_experts))

    def logprobs(replay: bool, learner=learner) -> torch.Tensor:
        if replay:
            with replay_trajectories(learner, [t.routed_experts for t in done], seq_len, offsets):
                logits = learner(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        else:
            logits = learner(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        lp = torch.log_softmax(logits[:, -NEW_TOKENS - 1 : -1].float(), dim=-1)
        return lp.gather(-1, ids[:, -NEW_TOKENS:, None])[..., 0]

    engine_lp = torch.tensor([t.logprobs for t in done])
    # Same weights: replaying the engine's routes over the padded batch reproduces every row.
    assert (logprobs(True, learner=model) - engine_lp).abs().max() <= 1e-5
    assert (logprobs(True)[0] - engine_lp[0]).abs().max() <= 1e-5
    assert (logprobs(False)[0] - engine_lp[0]).abs().max() > 1e-2


def test_ray_engine_factory_installs_the_recorder_on_moe_engines():
    import functools

    from posttrain.rl.engines import EngineFactory
    from posttrain.rl.recipes import debug
    from posttrain.rollout.types import Request, SamplingParams

    engine = EngineFactory(debug(), 2, build=functools.partial(build_tiny_moe_lm, seed=0))()  # R3 from its config
    engine.submit(
        [Request("r", [3, 4, 5], SamplingParams(max_new_tokens=4, forced_length=4, return_routed_experts=True))]
    )
    done = []
    while engine.n_active:
        done += engine.step().finished
    (t,) = done
    assert torch.tensor(t.routed_experts).shape == (3 + 4 - 1, 2, 2)
