"""The learner on a tiny policy: one version per train call, BKL mask from trainer vs engine, KL option, config overrides."""

from __future__ import annotations

import copy

import pytest
import torch

from formats.overrides import with_overrides
from posttrain.rl.learner import Learner, LearnerConfig
from posttrain.rl.loop import build_policy, sampling_params
from posttrain.rl.recipes import debug
from posttrain.rl.task import JsonlTask, TaskSource, countdown_rows, prefix_credit
from posttrain.rollout.engines.hf import HFEngine
from posttrain.rollout.scheduler import PartialRolloutScheduler, SchedulerConfig


def setup(kl_beta: float = 0.0, bkl_phi: float = 0.1):
    cfg = debug()
    model, tok = build_policy(cfg)
    learner = Learner(model, LearnerConfig(lr=1e-2, n_minibatches=2, kl_beta=kl_beta, bkl_phi=bkl_phi))
    engine = HFEngine(copy.deepcopy(model), capacity=24)
    src = TaskSource(JsonlTask(countdown_rows(32), prefix_credit), tok)
    sc = SchedulerConfig(batch_target=2, group_size=4, dapo=False)
    sched = PartialRolloutScheduler(engine, src, src.reward, sampling_params(cfg, tok), sc)
    return learner, sched


def test_train_changes_weights_bumps_version_and_syncs():
    learner, sched = setup()
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    batch = sched.collect()
    m = learner.train(batch)
    assert learner.version == 1
    assert any(not torch.equal(before[k], v) for k, v in learner.model.state_dict().items())
    assert m["bkl_masked_fraction"] == 0.0  # same weights on both sides: nothing to mask
    assert m["mismatch_abs_mean"] < 1e-5
    sched.sync(learner.weights(), learner.version)
    with pytest.raises(ValueError):
        learner.train(batch)  # collected for version 0: the learner refuses stale bookkeeping


def test_bkl_mask_masks_tokens_after_an_engine_mismatch():
    learner, sched = setup()
    batch = sched.collect()
    with torch.no_grad():  # the trainer now disagrees strongly with the engine that sampled the batch
        for p in learner.model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    m = learner.train(batch)
    assert m["bkl_masked_fraction"] > 0.05
    learner2, sched2 = setup(bkl_phi=0.0)
    b2 = sched2.collect()
    with torch.no_grad():
        for p in learner2.model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    assert learner2.train(b2)["bkl_masked_fraction"] == 0.0  # φ ≤ 0 switches the mask off


def test_kl_beta_option_penalises_distance_to_the_frozen_reference():
    learner, sched = setup(kl_beta=0.1)
    ref0 = {k: v.clone() for k, v in learner.reference.state_dict().items()}
    m1 = learner.train(sched.collect())
    sched.sync(learner.weights(), learner.version)
    m2 = learner.train(sched.collect())
    # The first minibatch runs the reference weights (k3 = 0); every later one has moved away from them.
    assert m1["kl"] > 0.0 and m2["kl"] > 0.0
    assert all(torch.equal(ref0[k], v) for k, v in learner.reference.state_dict().items())
    plain, sched0 = setup(kl_beta=0.0)
    assert plain.reference is None and plain.train(sched0.collect())["kl"] == 0.0


def test_overrides_parse_types_and_reject_unknown_keys():
    cfg = with_overrides(debug(), {"steps": "7", "scheduler.partial": "false", "learner.clip.eps_high": "0.3"})
    assert cfg.steps == 7 and cfg.scheduler.partial is False and cfg.learner.clip.eps_high == 0.3
    assert with_overrides(cfg, {"policy.path": "none"}).policy.path is None
    with pytest.raises(KeyError):
        with_overrides(cfg, {"learner.nope": "1"})
    with pytest.raises(ValueError):
        with_overrides(cfg, {"scheduler.partial": "maybe"})
