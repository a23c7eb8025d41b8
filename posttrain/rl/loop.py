"""The RL driver: collect (partial rollout) → train → draft chase → sync → log/checkpoint, one row per step.

    scifolio posttrain rl --config debug --out runs/rl            # or:
    python -c "from posttrain.rl.loop import run; from posttrain.rl.recipes import debug; run(debug(), 'runs/rl')"

The engine comes from ``cfg.engine`` (``posttrain.rl.engines``: kind × in process / Ray, refusals up front, R3 for
MoE policies). Files under ``out`` (``formats.rundir.RunDir``): ``config.json``, ``metrics.jsonl`` (one row per
learner step), ``trained.jsonl`` (ids of the trajectories each step trained on), ``tb/``, ``checkpoint/state.pt``
(learner, optimizers, schedules, scheduler with its in-flight partial trajectories and the data cursor, draft) and
``policy/`` (the trained policy as a Hugging Face checkpoint with its tokenizer). Rows are written before the
checkpoint and a resume trims rows newer than it, so a kill -9 anywhere loses nothing and trains no trajectory twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from formats.rundir import RunDir
from posttrain.rl import engines
from posttrain.rl.draft import DraftTrainer
from posttrain.rl.learner import Learner
from posttrain.rl.recipes import RLConfig, to_dict
from posttrain.rl.task import VERIFIERS, JsonlTask, TaskSource, countdown_rows
from posttrain.rollout.engine import RolloutEngine
from posttrain.rollout.scheduler import Batch, PartialRolloutScheduler, SyncScheduler
from posttrain.rollout.types import SamplingParams

build_policy, build_draft, build_fused = engines.build_policy, engines.build_draft, engines.build_fused


def build_task(cfg: RLConfig) -> JsonlTask:
    verify = VERIFIERS[cfg.task.verifier]
    if cfg.task.name == "countdown":
        return JsonlTask(countdown_rows(cfg.task.n_rows, seed=cfg.seed, max_start=cfg.task.max_start), verify)
    if cfg.task.name == "jsonl":
        if not cfg.task.jsonl:
            raise ValueError("task.name=jsonl needs task.jsonl=PATH")
        return JsonlTask.from_jsonl(cfg.task.jsonl, verify)
    raise ValueError(f"unknown task {cfg.task.name!r} (countdown | jsonl)")


def sampling_params(cfg: RLConfig, tokenizer: Any) -> SamplingParams:
    stop = () if tokenizer.eos_token_id is None else (int(tokenizer.eos_token_id),)
    s = cfg.sampling
    return SamplingParams(
        max_new_tokens=s.max_new_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
        stop_token_ids=stop,
        return_routed_experts=engines.policy_is_moe(cfg.policy),
    )


def run(
    cfg: RLConfig,
    out: str | Path,
    resume: bool = False,
    progress: bool = True,
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
    wrap_engine: Callable[[RolloutEngine], RolloutEngine] | None = None,
) -> list[dict[str, Any]]:
    """Train for ``cfg.steps`` learner steps (continuing from ``out/checkpoint`` when ``resume``); returns the rows.

    ``wrap_engine`` lets a test put a fault injector around the engine (a perturbed router, shifted logprobs)."""
    cfg = engines.resolve(cfg)
    run_dir = RunDir(out, resume=resume, logs=("trained.jsonl",))
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    model, tokenizer = build_policy(cfg)  # fp32 master weights; the engine holds its own copy in policy.dtype
    learner = Learner(model, cfg.learner, cfg.sampling.temperature, cfg.sampling.top_p, total_versions=cfg.steps)
    state = run_dir.load_checkpoint(lambda p: torch.load(p, weights_only=False)) if resume else None
    start = 0 if state is None else int(state["step"])
    if state is not None:
        learner.load_state_dict(state["learner"])
    drafter = None
    if cfg.engine.kind == "speculative":  # the draft trainer lives with the learner, in process or with Ray
        drafter = DraftTrainer(build_draft(cfg, model), cfg.speculative)
        if state is not None:
            drafter.load_state_dict(state["draft"])
    engine = engines.start_engine(cfg, learner.weights(), learner.version)
    try:
        if drafter is not None:
            engine.update_draft(drafter.weights(), drafter.version)
        if wrap_engine is not None:
            engine = wrap_engine(engine)
        source = TaskSource(build_task(cfg), tokenizer, seed=cfg.seed)
        cls = PartialRolloutScheduler if cfg.scheduler.partial else SyncScheduler
        sched = cls(engine, source, source.reward, sampling_params(cfg, tokenizer), cfg.scheduler, seed=cfg.seed)
        if state is not None:
            sched.load_state_dict(state["scheduler"])
        run_dir.trim(start)
        run_dir.write_config(to_dict(cfg))
        rows = []
        bar = _bar(progress, cfg.steps, start)
        for step in range(start + 1, cfg.steps + 1):
            t0 = time.perf_counter()
            batch = sched.collect()
            t1 = time.perf_counter()
            lm = learner.train(batch)
            dm = chase_draft(drafter, engine, batch, learner, cfg) if drafter is not None else {}
            if cfg.engine.kind == "fused":
                dm["memdec_lambda_mean"] = engine.model.take_lambda_mean()  # mean λ_t over this step's positions
            sched.sync(learner.weights(), learner.version)
            row = {"step": step, **metrics_row(batch, lm), "rollout_s": t1 - t0, "train_s": time.perf_counter() - t1}
            row.update(dm)
            trajs = [t for g in batch.groups for t in g]
            run_dir.log(row)
            run_dir.log(
                {"step": step, "ids": [t.request_id for t in trajs], "dapo_dropped": batch.dropped},
                file="trained.jsonl",
            )
            ckpt = {
                "step": step,
                "learner": learner.state_dict(),
                "scheduler": sched.state_dict(),
                "config": to_dict(cfg),
                "draft": drafter.state_dict() if drafter is not None else None,
            }
            run_dir.save_checkpoint(lambda f, c=ckpt: torch.save(c, f))
            rows.append(row)
            if bar is not None:
                bar.set_postfix(reward=f"{row['reward']:.3f}", occ=f"{row['occupancy']:.2f}")
                bar.update(1)
            if on_step is not None:
                on_step(step, row)
            if cfg.export_every and step % cfg.export_every == 0:
                export(learner.model, tokenizer, run_dir.policy)
        if bar is not None:
            bar.close()
    finally:
        run_dir.close()
        engines.stop_engine(cfg)
    export(learner.model, tokenizer, run_dir.policy)
    return rows


def chase_draft(drafter: DraftTrainer, engine: Any, batch: Batch, learner: Learner, cfg: RLConfig) -> dict[str, Any]:
    """The draft chases the updated policy on the states just collected, and goes to the engine with its version."""
    drafter.observe(engine.take_round_log())
    round_acc = engine.acceptance
    dm = drafter.update([t for g in batch.groups for t in g], learner.model, temperature=cfg.sampling.temperature)
    dm["draft_round_acceptance"] = round_acc
    dm["tokens_per_round"] = engine.emitted / max(1, engine.rounds)
    engine.update_draft(drafter.weights(), drafter.version)
    dm["engine_draft_version"] = engine.draft_version  # with Ray: the version every worker holds
    return dm


def metrics_row(batch: Batch, lm: dict[str, float]) -> dict[str, Any]:
    """The per-step row: the batch's collection statistics and the learner's metrics."""
    st = batch.stats
    trajs = [t for g in batch.groups for t in g]
    row = {
        "version": batch.version + 1,
        "reward": sum(t.reward for t in trajs) / len(trajs),
        "response_length": st["mean_trained_length"],
        "sampled_length": st["mean_finished_length"],
        "discarded_stale": st["discarded_trajectories"],
        "discarded_stale_tokens": st["discarded_tokens"],
        "stale_masked_tokens": st["stale_masked_tokens"],
        "dapo_dropped_groups": st["dapo_dropped_groups"],
        # Run-to-date: a step whose batch came entirely from carried-over groups takes no engine step.
        "occupancy": st["occupancy_cumulative"],
        "old_version_fraction": st["old_version_fraction"],
        "old_version_tokens": st["old_version_tokens"],
        "trained_tokens": st["trained_tokens"],
        "engine_steps": st["engine_steps"],
        "max_lag": st["max_lag"],
        "in_flight": st["in_flight"],
    }
    keys = (
        "loss",
        "clip_fraction",
        "bkl_masked_fraction",
        "bkl_compared_fraction",
        "mismatch_abs_mean",
        "matched_mismatch_abs_max",
        "lr",
        "r3_replayed_tokens",
        "r3_changed_routes",
        "group_entropy",
    )
    row.update({k: lm[k] for k in keys if k in lm})
    return row


def _bar(progress: bool, total: int, start: int) -> Any:
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=start, desc="posttrain rl", unit="step")


def export(model: torch.nn.Module, tokenizer: Any, path: Path) -> Path:
    """The policy as a Hugging Face checkpoint (``from_pretrained``-loadable) with its tokenizer."""
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
