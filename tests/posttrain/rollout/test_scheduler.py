"""Partial-rollout scheduler on the scripted engine (SPEC §C1): staleness bound, versions, pause/resume."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from posttrain.rollout.engines.scripted import ScriptedEngine, scripted_logprob
from posttrain.rollout.scheduler import PartialRolloutScheduler, Prompt, SchedulerConfig, Starved, SyncScheduler
from posttrain.rollout.types import SamplingParams, Trajectory


class ListSource:
    """Prompts whose meta carries each sample's scripted length (cycled)."""

    def __init__(self, lengths: list[list[int]]) -> None:
        self.lengths = lengths
        self.cursor = 0

    def next_prompt(self) -> Prompt:
        i = self.cursor
        self.cursor += 1
        return Prompt(f"p{i}", [1, 2, 3], {"lengths": self.lengths[i % len(self.lengths)]})

    def state_dict(self) -> dict[str, Any]:
        return {"cursor": self.cursor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cursor = state["cursor"]


def length_of(t: Trajectory) -> int:
    j = int(t.request_id.rsplit("-", 1)[1])
    return t.request.meta["lengths"][j]


def reward_of(t: Trajectory) -> float:
    return float(int(t.request_id.rsplit("-", 1)[1]) % 2)  # alternate 0/1 inside a group: never degenerate


def make(lengths, capacity=2, group_size=1, batch_target=1, max_stale=3, dapo=False, cls=PartialRolloutScheduler):
    engine = ScriptedEngine(capacity=capacity, length_fn=length_of)
    cfg = SchedulerConfig(batch_target=batch_target, group_size=group_size, max_stale=max_stale, dapo=dapo)
    sampling = SamplingParams(max_new_tokens=100)
    return cls(engine, ListSource(lengths), reward_of, sampling, cfg), engine


def run_steps(sched, n):
    batches = []
    for _ in range(n):
        b = sched.collect()
        batches.append(b)
        sched.sync({}, sched.version + 1)
    return batches


def test_lag_three_kept_lag_four_discarded():
    # Prompt 0: one response of length 4 (resp. 5); every other prompt a length-1 response. With 2 slots the
    # short ones complete one batch per engine step, so the long one gains one token per version.
    for long, kept in ((4, True), (5, False)):
        sched, _ = make([[long]] + [[1]] * 50)
        batches = run_steps(sched, 10)
        trained = {t.request_id: t for b in batches for g in b.groups for t in g}
        if kept:
            t = trained["g0-0"]
            assert t.versions == [0, 1, 2, 3]
            assert sched.totals["discarded_trajectories"] == 0
            batch_of = next(b for b in batches if any(x.request_id == "g0-0" for g in b.groups for x in g))
            assert batch_of.version - t.versions[0] == 3
        else:
            assert sched.totals["discarded_trajectories"] == 1
            assert sched.totals["discarded_tokens"] == 4  # versions 0..3 thrown away at version 4
            # Restarted from scratch at version 4 and pinned: never discarded again; when trained at version 8
            # its token of version 4 is more than 3 versions old and leaves the loss (context only).
            t = trained["g0-0"]
            assert t.attempt == 1 and t.versions == [4, 5, 6, 7, 8] and t.loss_mask == [0, 1, 1, 1, 1]
            assert sched.totals["stale_masked_tokens"] == 1


def test_versions_non_decreasing_and_logprobs_match_versions():
    sched, _ = make([[7, 2, 1, 3], [1, 5, 9, 2], [4, 4, 1, 1]], capacity=8, group_size=4, batch_target=1)
    batches = run_steps(sched, 12)
    multi = 0
    for b in batches:
        for g in b.groups:
            for t in g:
                t.validate()
                assert all(x <= y for x, y in zip(t.versions, t.versions[1:]))
                assert t.logprobs == [scripted_logprob(i, v) for i, v in enumerate(t.versions)]
                assert b.version - t.versions[0] <= 3
                multi += t.versions[-1] > t.versions[0]
    assert multi > 0  # partial rollout really carried trajectories across syncs


def test_paused_prefix_bit_identical_after_resume():
    sched, engine = make([[3, 3]] + [[1, 1]] * 20, capacity=4, group_size=2)
    sched.collect()
    paused = {t.request_id: json.dumps(t.to_dict()) for t in sched.paused}
    assert paused, "expected in-flight trajectories at the pause"
    sched.sync({}, 1)
    later = {}
    for _ in range(6):
        for g in sched.collect().groups:
            for t in g:
                later[t.request_id] = t
        sched.sync({}, sched.version + 1)
    for rid, before in paused.items():
        b = json.loads(before)
        t = later[rid]
        n = len(b["token_ids"])
        assert t.token_ids[:n] == b["token_ids"] and t.logprobs[:n] == b["logprobs"] and t.versions[:n] == b["versions"]
        assert t.attempt == 0 and t.versions[n] > b["versions"][-1]  # continued under the new weights
    assert set(paused) <= set(engine.resumed)


def test_importance_and_bkl_inputs_use_each_tokens_own_behaviour_logprob(monkeypatch):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    import posttrain.rl.learner as learner_mod

    lengths = [[4, 1]] + [[1, 1]] * 30
    sched, _ = make(lengths, capacity=4, group_size=2)
    batches = run_steps(sched, 3)
    batch = sched.collect()  # version 3: holds g0 whose long member spans versions 0..3
    t = next(t for g in batch.groups for t in g if t.request_id == "g0-0")
    assert t.versions == [0, 1, 2, 3] and batches

    seen: dict[str, list[torch.Tensor]] = {"rho": [], "bkl": []}
    real_loss, real_bkl = learner_mod.policy_loss, learner_mod.bkl_mask_from_logprobs

    def spy_loss(lp, beh, *a, **k):
        seen["rho"].append(beh.clone())
        return real_loss(lp, beh, *a, **k)

    def spy_bkl(lp, beh, *a, **k):
        seen["bkl"].append(beh.clone())
        return real_bkl(lp, beh, *a, **k)

    monkeypatch.setattr(learner_mod, "policy_loss", spy_loss)
    monkeypatch.setattr(learner_mod, "bkl_mask_from_logprobs", spy_bkl)
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=1000,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    learner = learner_mod.Learner(Qwen2ForCausalLM(cfg), learner_mod.LearnerConfig(n_minibatches=1), version=3)
    learner.train(batch)
    trajs = [x for g in batch.groups for x in g]
    row = trajs.index(t)
    own = torch.tensor([scripted_logprob(i, v) for i, v in enumerate(t.versions)])
    # BKL (SPEC C3) compares trainer and engine at the same weights: only the token sampled at the learner's
    # version 3 has an engine logprob there (the scripted engine never re-prefills); the IS weight uses all four.
    assert seen["bkl"][0][row, 3] == own[3]
    assert learner.last_mask["compared"][row, :4].tolist() == [False, False, False, True]
    order = torch.randperm(len(trajs), generator=torch.Generator().manual_seed(3))  # the learner's minibatch order
    assert torch.equal(seen["rho"][0][(order == row).nonzero().item(), :4], own)
    assert len(set(own.tolist())) == 4  # four versions, four different behaviour logprobs


def test_dapo_drops_identical_groups_and_replaces_them():
    engine = ScriptedEngine(capacity=8, length_fn=lambda t: 1)
    rewards = {}

    def reward(t: Trajectory) -> float:  # every even group all-zero
        g = int(t.group_id[1:])
        rewards[t.request_id] = 0.0 if g % 2 == 0 else float(int(t.request_id[-1]) % 2)
        return rewards[t.request_id]

    cfg = SchedulerConfig(batch_target=3, group_size=2, dapo=True, partial=False)
    sched = PartialRolloutScheduler(engine, ListSource([[1, 1]]), reward, SamplingParams(), cfg)
    b = sched.collect()
    assert len(b.groups) == 3
    assert all(len({t.reward for t in g}) > 1 for g in b.groups)
    assert b.stats.dapo_dropped_groups >= 2
    # each dropped trajectory is a dead letter with its reason (all-zero groups: reward 0)
    assert len(b.dropped) == 2 * b.stats.dapo_dropped_groups
    assert {(d.stage, d.reason, d.detail["reward"]) for d in b.dropped} == {("scheduler", "dapo_all_equal", 0.0)}
    assert all(int(d.item_id.split("-")[0][1:]) % 2 == 0 for d in b.dropped)  # only the even (all-zero) groups


def test_dapo_dropping_every_group_stops_with_advice_and_reports_each_drop():
    engine = ScriptedEngine(capacity=8, length_fn=lambda t: 1)
    cfg = SchedulerConfig(batch_target=2, group_size=2, dapo=True, starve_after_s=0, starve_after_groups=5)
    sched = PartialRolloutScheduler(engine, ListSource([[1, 1]]), lambda t: 0.0, SamplingParams(), cfg)
    seen = []
    sched.on_drop = lambda dropped, in_a_row: seen.append((dropped, in_a_row))
    with pytest.raises(Starved) as e:
        sched.collect()
    assert seen == [(1, 1), (2, 2), (3, 3), (4, 4), (5, 5)]  # reported as they happen, stopped at the limit
    msg = str(e.value)
    assert "5 complete groups in a row were dropped by the DAPO" in msg and "group rewards: 0 ×5" in msg
    assert "solves none of these prompts" in msg and "scheduler.dapo=false" in msg
    assert "scheduler.starve_after_groups=5" in msg


def test_a_kept_group_resets_the_starvation_count():
    # Groups alternate all-zero (dropped) and mixed (kept): 1 drop in a row at most, never a stop.
    engine = ScriptedEngine(capacity=8, length_fn=lambda t: 1)

    def reward(t: Trajectory) -> float:
        return 0.0 if int(t.group_id[1:]) % 2 == 0 else float(int(t.request_id[-1]) % 2)

    cfg = SchedulerConfig(batch_target=3, group_size=2, dapo=True, partial=False, starve_after_groups=2)
    sched = PartialRolloutScheduler(engine, ListSource([[1, 1]]), reward, SamplingParams(), cfg)
    streaks = []
    sched.on_drop = lambda dropped, in_a_row: streaks.append(in_a_row)
    for _ in range(4):
        assert len(sched.collect().groups) == 3
        sched.sync({}, sched.version + 1)
    assert len(streaks) >= 8 and set(streaks) == {1}


def test_starvation_time_limit_counts_collecting_only(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr("posttrain.rollout.scheduler.time.monotonic", lambda: clock[0])
    engine = ScriptedEngine(capacity=2, length_fn=lambda t: 1)

    def reward(t: Trajectory) -> float:  # the first 3 groups mixed, every later one all-zero
        clock[0] += 10.0  # each finished sample "takes" 10 s
        return float(int(t.request_id[-1]) % 2) if int(t.group_id[1:]) < 3 else 0.0

    cfg = SchedulerConfig(batch_target=3, group_size=2, dapo=True, partial=False, starve_after_s=95)
    sched = PartialRolloutScheduler(engine, ListSource([[1, 1]]), reward, SamplingParams(), cfg)
    sched.collect()
    sched.sync({}, 1)
    clock[0] += 1000.0  # a long learner step is not starvation
    with pytest.raises(Starved, match=r"dropped by the DAPO .* over 100 s"):
        sched.collect()


def test_sync_scheduler_never_leaves_work_in_flight():
    sched, _ = make([[7, 1, 3, 2]] * 5, capacity=16, group_size=4, batch_target=2, cls=SyncScheduler)
    for b in run_steps(sched, 3):
        assert sched.paused == []
        assert b.stats.old_version_fraction == 0.0
        assert all(len(set(t.versions)) == 1 for g in b.groups for t in g)


def test_state_dict_roundtrip_continues_identically():
    lengths = [[7, 2, 1, 3], [1, 5, 9, 2], [4, 4, 1, 1]]
    a, _ = make(lengths, capacity=8, group_size=4)
    run_steps(a, 3)
    state = json.loads(json.dumps(a.state_dict()))
    assert state["paused"] or state["groups"]
    b, eb = make(lengths, capacity=8, group_size=4)
    eb.update_weights({}, state["version"])
    b.load_state_dict(state)
    ids_a = [[t.request_id for g in x.groups for t in g] for x in run_steps(a, 4)]
    ids_b = [[t.request_id for g in x.groups for t in g] for x in run_steps(b, 4)]
    assert ids_a == ids_b


def test_state_dict_refuses_while_engine_busy():
    sched, engine = make([[3]])
    engine.submit([])
    sched._submit_group()
    with pytest.raises(RuntimeError):
        sched.state_dict()


def test_batches_keep_a_fixed_size_and_extras_carry_over_once():
    # 8 slots, groups of 2, all length 1: four groups complete in the first step, the batch takes two.
    sched, _ = make([[1, 1]], capacity=8, group_size=2, batch_target=2)
    batches = run_steps(sched, 6)
    assert all(len(b.groups) == 2 for b in batches)
    ids = [t.request_id for b in batches for g in b.groups for t in g]
    assert len(ids) == len(set(ids))
    assert ids[:4] == ["g0-0", "g0-1", "g1-0", "g1-1"] and ids[4:8] == ["g2-0", "g2-1", "g3-0", "g3-1"]
    assert batches[1].stats.engine_steps == 0  # the carried groups alone filled the second batch


def test_finish_restarted_alternative_trains_restarted_ones_fully_fresh():
    engine = ScriptedEngine(capacity=2, length_fn=length_of)
    cfg = SchedulerConfig(batch_target=1, group_size=1, dapo=False, pin_restarted=False, finish_restarted=True)
    sched = PartialRolloutScheduler(engine, ListSource([[5]] + [[1]] * 50), reward_of, SamplingParams(), cfg)
    batches = run_steps(sched, 8)
    t = next(t for b in batches for g in b.groups for t in g if t.request_id == "g0-0")
    assert t.attempt == 1 and t.versions == [4] * 5 and t.loss_mask == [1] * 5
