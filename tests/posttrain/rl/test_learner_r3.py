"""The learner replays the engine's recorded expert choices (R3) on a tiny MoE policy."""

from __future__ import annotations

import copy
import dataclasses

import torch

from posttrain.objectives.r3 import EngineRoutingRecorder, find_routers
from posttrain.rl.learner import Learner, LearnerConfig
from posttrain.rollout.engines.hf import HFEngine
from posttrain.rollout.scheduler import Batch
from posttrain.rollout.types import Request, SamplingParams
from posttrain.tiny.moe import build_tiny_moe_lm


def sample(model, n=6):
    engine = HFEngine(copy.deepcopy(model), capacity=4)
    engine.experts_recorder = EngineRoutingRecorder(engine.model)
    params = dict(forced_length=6, return_routed_experts=True)
    engine.submit(
        [Request(f"r{i}", [1, 5 + i, 9], SamplingParams(seed=i, **params), group_id=f"g{i // 3}") for i in range(n)]
    )
    done = []
    while engine.n_active:
        done += engine.step().finished
    return sorted(done, key=lambda t: t.request_id)


def test_learner_replays_engine_routes_and_the_router_still_trains():
    model = build_tiny_moe_lm(seed=0)
    trajs = sample(model)
    assert all(len(t.routed_experts) == len(t.prompt_ids) + t.n_tokens - 1 for t in trajs)
    learner = Learner(model, LearnerConfig(n_minibatches=1, bkl_phi=0.0, lr=1e-2))
    lp = learner.logprobs(trajs)
    for i, t in enumerate(trajs):
        assert (lp[i, : t.n_tokens] - torch.tensor(t.logprobs)).abs().max() <= 1e-5

    with torch.no_grad():  # perturb the learner's routers: live routing now differs from the engine's
        for r in find_routers(learner.model):
            r.weight.add_(2.0 * torch.randn_like(r.weight))
    replayed = learner.logprobs(trajs)
    live = learner.logprobs([dataclasses.replace(t, routed_experts=None) for t in trajs])
    assert (replayed - live).abs().max() > 1e-3  # the replay really changes the forward

    for j, t in enumerate(trajs):
        t.reward = float(j % 2)
    before = [r.weight.detach().clone() for r in find_routers(learner.model)]
    learner.train(Batch(groups=[trajs[:3], trajs[3:]], version=0))
    after = [r.weight for r in find_routers(learner.model)]
    assert any(not torch.equal(a, b) for a, b in zip(before, after))  # gate weights from live logits: router learns
