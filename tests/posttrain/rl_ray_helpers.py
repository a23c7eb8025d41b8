"""Shared by the Ray tests: one small RL run (real scheduler, HF engine, learner, countdown task) to distribute."""

from __future__ import annotations

import functools

import torch

VOCAB = 14  # char_tokenizer(): 3 specials + "0123456789:"
STEPS = 3


def parts():
    from posttrain.rl.learner import LearnerConfig
    from posttrain.rl.task import JsonlTask, TaskSource, char_tokenizer, countdown_rows, prefix_credit
    from posttrain.rollout.scheduler import PartialRolloutScheduler, SchedulerConfig
    from posttrain.rollout.types import SamplingParams
    from posttrain.tiny import build_tiny_causal_lm

    tok = char_tokenizer()
    source = TaskSource(JsonlTask(countdown_rows(64, seed=0), prefix_credit), tok, seed=0)
    sampling = SamplingParams(max_new_tokens=8, stop_token_ids=(tok.eos_token_id,))
    sched_cfg = SchedulerConfig(batch_target=2, group_size=4, max_stale=3)
    scheduler = functools.partial(
        PartialRolloutScheduler, source=source, reward_fn=source.reward, sampling=sampling, config=sched_cfg
    )
    build_model = functools.partial(build_tiny_causal_lm, VOCAB, 64, 0)
    return scheduler, build_model, LearnerConfig(n_minibatches=2, lr=1e-2)


def run_steps_in_driver(engine, steps: int = STEPS):
    from posttrain.rl.learner import Learner

    scheduler_factory, build_model, learner_cfg = parts()
    sched = scheduler_factory(engine)
    learner = Learner(build_model(), learner_cfg)
    batches, rows = [], []
    for _ in range(steps):
        batch = sched.collect()
        metrics = learner.train(batch)
        sched.sync(learner.weights(), learner.version)
        batches.append(batch)
        rows.append({**batch.row(), **metrics})
    return batches, rows


def assert_same_batches(a, b) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.version == y.version
        assert [[t.request_id for t in g] for g in x.groups] == [[t.request_id for t in g] for g in y.groups]
        for gx, gy in zip(x.groups, y.groups, strict=True):
            for tx, ty in zip(gx, gy, strict=True):
                assert tx.token_ids == ty.token_ids
                assert tx.versions == ty.versions
                assert tx.reward == ty.reward
                assert torch.allclose(torch.tensor(tx.logprobs), torch.tensor(ty.logprobs), atol=1e-5)


def run_in_process():
    from posttrain.rollout.engines.hf import HFEngine

    _sched, build_model, _cfg = parts()
    torch.set_num_threads(1)
    return run_steps_in_driver(HFEngine(build_model(), capacity=16))
