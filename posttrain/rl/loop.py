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

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from formats import fs
from formats.chat_images import has_images
from formats.rundir import RunDir
from posttrain.fit import FitConfig, fit, masked_ce, progress_bar
from posttrain.rl import engines
from posttrain.rl.draft import DraftTrainer
from posttrain.rl.learner import Learner
from posttrain.rl.recipes import RLConfig
from posttrain.rl.task import VERIFIERS, JsonlTask, TaskSource, countdown_rows
from posttrain.rollout.engine import RolloutEngine
from posttrain.rollout.scheduler import Batch, PartialRolloutScheduler, SyncScheduler
from posttrain.rollout.types import SamplingParams

build_policy, build_draft = engines.build_policy, engines.build_draft


def build_task(cfg: RLConfig) -> JsonlTask:
    verify = VERIFIERS[cfg.task.verifier]
    if cfg.task.name == "countdown":
        return JsonlTask(countdown_rows(cfg.task.n_rows, seed=cfg.seed, max_start=cfg.task.max_start), verify)
    if cfg.task.name == "jsonl":
        if not cfg.task.jsonl:
            raise ValueError("task.name=jsonl needs task.jsonl=PATH")
        return JsonlTask.from_jsonl(cfg.task.jsonl, verify)
    raise ValueError(f"unknown task {cfg.task.name!r} (countdown | jsonl)")


def task_source(cfg: RLConfig, tokenizer: Any) -> TaskSource:
    """The task's cursor; image rows need a vision-language policy (its processor) on the ``hf`` or ``vllm`` engine
    (requests carry pixel values for the one, decoded images for the other), and a row whose image fails is left
    out, counted by reason on stdout and in ``skipped.jsonl`` (``TaskSource.skipped`` holds each row's)."""
    task, processor = build_task(cfg), engines.load_processor(cfg.policy)
    if any(map(has_images, task.rows)):
        if processor is None:
            raise engines.EngineRefused("task rows hold images and the policy is a text-only model (export --vlm)")
        if cfg.engine.kind not in ("hf", "vllm"):
            raise engines.EngineRefused(f"task rows with images run on engine.kind=hf or vllm, not {cfg.engine.kind}")
    source = TaskSource(task, tokenizer, seed=cfg.seed, processor=processor)
    if source.skipped:
        reasons = Counter(r.split(":")[0] for r in source.skipped.values())
        print(
            f"posttrain rl: {len(source.rows)} task rows kept, skipped {dict(reasons)} (see skipped.jsonl)", flush=True
        )
    return source


def sampling_params(cfg: RLConfig, tokenizer: Any) -> SamplingParams:
    stop = () if tokenizer.eos_token_id is None else (int(tokenizer.eos_token_id),)
    s, moe = cfg.sampling, engines.policy_is_moe(cfg.policy)
    return SamplingParams(s.max_new_tokens, s.temperature, s.top_p, stop_token_ids=stop, return_routed_experts=moe)


@dataclasses.dataclass
class Warmup:
    """A stage's warm-up described as data: the driver fits the learner's model on ``batches`` with ``loss``
    (``posttrain.fit``: ``cfg``'s fresh optimizer, or the learner's own with ``learner_optimizers`` so their state
    carries into RL) until ``stop(losses)``, loads the weights into the engine, and logs ``after(losses)`` as step 0
    (where a stage resets its KL reference or evaluates). Runs once, in a fresh run only."""

    batches: Iterable[Any]
    after: Callable[[list[float]], dict[str, Any]]
    loss: Callable[[torch.nn.Module, Any], torch.Tensor] = masked_ce
    cfg: FitConfig = FitConfig()
    learner_optimizers: bool = False
    stop: Callable[[list[float]], bool] | None = None


def warm_up(stage: Stage) -> dict[str, Any] | None:
    """Run ``stage.warmup()`` (None: the stage has none); returns its step-0 row."""
    if (w := stage.warmup()) is None:
        return None
    opt = stage.learner.optimizers if w.learner_optimizers else None
    losses = fit(stage.learner.model, w.batches, w.loss, w.cfg, optimizers=opt, stop=w.stop)
    if losses:
        stage.sync()
    return w.after(losses)


class Stage:
    """A recipe of the driver: what feeds the learner and how it learns. ``posttrain rl`` (``RLStage``: the
    partial-rollout scheduler over a verifiable task), ``posttrain agentic`` (harness sessions through the gateway,
    ``posttrain.agentic.rl``), ``posttrain distill`` (on-policy distillation, ``posttrain.rl.distill``) and
    ``posttrain lemma train`` (``posttrain.lemma.train``). The methods below are the defaults."""

    name: str
    steps: int
    learner: Learner
    tokenizer: Any
    cfg: Any
    engine: Any
    processor: Any = None
    """A vision-language policy's processor: saved with the policy in place of the bare tokenizer."""
    skipped: tuple[dict[str, Any], ...] = ()
    """Input rows the stage left out before training, each ``{"id", "reason"}`` (a task row whose image fails):
    the driver writes them to ``out/skipped.jsonl``, as ``posttrain sft`` does."""

    def config(self) -> dict[str, Any]:
        return dataclasses.asdict(self.cfg)

    def warmup(self) -> Warmup | None:
        """Training before the first step of a fresh run (an SFT warm-up, behavioural cloning), as data."""
        return None

    def collect(self) -> Batch:
        raise NotImplementedError

    def train(self, batch: Batch) -> dict[str, Any]:
        """One learner version on ``batch`` (the stage's objective) and what comes with it (draft chase, evals)."""
        raise NotImplementedError

    def sync(self) -> None:
        """Load the learner's new weights into the rollout side."""
        self.engine.update_weights(self.learner.weights(), self.learner.version)

    def row(self, batch: Batch, metrics: dict[str, Any]) -> dict[str, Any]:
        return {"version": self.learner.version, **batch.row(), **metrics}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sync()

    def close(self) -> None:
        engines.stop_engine(self.cfg)


def run_stage(
    stage: Stage,
    out: str | Path,
    resume: bool = False,
    progress: bool = True,
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
    export_every: int = 0,
) -> list[dict[str, Any]]:
    """The driver: collect → train → sync → log/checkpoint, ``stage.steps`` times; the policy goes to ``out/policy``.
    A checkpoint holds the step, the learner and the stage's state (rows and resume: the module docstring)."""
    run_dir = RunDir(out, resume=resume, logs=("trained.jsonl",))
    rows: list[dict[str, Any]] = []
    try:
        start = 0
        if resume:
            state = run_dir.load_checkpoint(lambda p: torch.load(p, weights_only=False))
            start = int(state["step"])
            stage.learner.load_state_dict(state["learner"])
            stage.load_state_dict(state["stage"])
            run_dir.trim(start)
        run_dir.write_config(stage.config())
        fs.write_jsonl(run_dir.path / "skipped.jsonl", stage.skipped)
        if not resume and (warm := warm_up(stage)) is not None:
            run_dir.log({"step": 0, **warm})
        bar = progress_bar(stage.steps, progress, initial=start, desc=stage.name, unit="step")
        postfix: dict[str, str] = {}
        if progress and (sched := getattr(stage, "sched", None)) is not None:
            drawn = [0.0]

            def show_drop(dropped: int, in_a_row: int) -> None:  # as it happens, not once a batch is complete
                postfix["dropped"] = f"{dropped} ({in_a_row} in a row)"
                bar.set_postfix(postfix, refresh=False)
                if time.monotonic() - drawn[0] >= 1.0:  # at most one redraw a second
                    drawn[0] = time.monotonic()
                    bar.refresh()

            sched.on_drop = show_drop
        for step in range(start + 1, stage.steps + 1):
            t0 = time.perf_counter()
            batch = stage.collect()
            t1 = time.perf_counter()
            metrics = stage.train(batch)
            stage.sync()
            row = {"step": step, **stage.row(batch, metrics), "rollout_s": t1 - t0, "train_s": time.perf_counter() - t1}
            row.update(Counter(f"dropped_{d.reason}" for d in batch.dropped))
            ids = [t.request_id for g in batch.groups for t in g]
            dapo = [d.item_id for d in batch.dropped if d.reason == "dapo_all_equal"]
            run_dir.log(row)
            run_dir.log({"step": step, "ids": ids, "dapo_dropped": dapo}, file="trained.jsonl")
            ckpt = {"step": step, "learner": stage.learner.state_dict(), "stage": stage.state_dict()}
            run_dir.save_checkpoint(lambda f, c=ckpt: torch.save(c, f))
            rows.append(row)
            postfix["reward"] = f"{row.get('reward', float('nan')):.3f}"
            bar.set_postfix(postfix, refresh=False)
            bar.update(1)
            if on_step is not None:
                on_step(step, row)
            if export_every and step % export_every == 0:
                export(stage.learner.model, stage.processor or stage.tokenizer, run_dir.policy)
        bar.close()
    finally:
        run_dir.close()
        stage.close()
    export(stage.learner.model, stage.processor or stage.tokenizer, run_dir.policy)
    return rows


class RLStage(Stage):
    """``posttrain rl``: the partial-rollout scheduler over a verifiable task, the engine of ``cfg.engine``, the
    draft trainer of a speculative engine, Eq 28 shaping + Eq 29 in the learner."""

    name = "posttrain rl"

    def __init__(self, cfg: RLConfig, wrap_engine: Callable[[RolloutEngine], RolloutEngine] | None = None) -> None:
        cfg = self.cfg = engines.resolve(cfg)
        self.steps = cfg.steps
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        model, self.tokenizer = build_policy(cfg.policy)  # fp32 master weights; the engine holds a copy in policy.dtype
        source = task_source(cfg, self.tokenizer)
        self.processor = source.processor
        self.skipped = tuple({"id": i, "reason": r} for i, r in source.skipped.items())
        self.learner = Learner(
            model, cfg.learner, cfg.sampling.temperature, cfg.sampling.top_p, total_versions=cfg.steps
        )
        self.drafter = None
        if cfg.engine.kind == "speculative":  # the draft trainer lives with the learner, in process or with Ray
            self.drafter = DraftTrainer(build_draft(cfg, model), cfg.speculative)
        self.engine = engines.start_engine(cfg, self.learner.weights(), self.learner.version)
        try:
            if self.drafter is not None:
                self.engine.update_draft(self.drafter.weights(), self.drafter.version)
            if wrap_engine is not None:
                self.engine = wrap_engine(self.engine)
            cls = PartialRolloutScheduler if cfg.scheduler.partial else SyncScheduler
            params = sampling_params(cfg, self.tokenizer)
            self.sched = cls(self.engine, source, source.reward, params, cfg.scheduler, seed=cfg.seed)
        except BaseException:
            engines.stop_engine(cfg)
            raise

    def collect(self) -> Batch:
        return self.sched.collect()

    def train(self, batch: Batch) -> dict[str, Any]:
        m = self.learner.train(batch)
        if self.drafter is not None:
            m.update(chase_draft(self.drafter, self.engine, batch, self.learner, self.cfg))
        if self.cfg.engine.kind == "fused":
            m["memdec_lambda_mean"] = self.engine.model.take_lambda_mean()  # mean λ_t over this step's positions
        return m

    def sync(self) -> None:
        self.sched.sync(self.learner.weights(), self.learner.version)

    def row(self, batch: Batch, metrics: dict[str, Any]) -> dict[str, Any]:
        """The per-step row: the batch's collection statistics and every metric of the step's training."""
        st = batch.stats
        trajs = [t for g in batch.groups for t in g]
        return {
            "version": batch.version + 1,
            "reward": sum(t.reward for t in trajs) / len(trajs),
            "response_length": st.mean_trained_length,
            "sampled_length": st.mean_finished_length,
            "discarded_stale": st.discarded_trajectories,
            "discarded_stale_tokens": st.discarded_tokens,
            "stale_masked_tokens": st.stale_masked_tokens,
            "dapo_dropped_groups": st.dapo_dropped_groups,
            # Run-to-date: a step whose batch came entirely from carried-over groups takes no engine step.
            "occupancy": st.occupancy_cumulative,
            "old_version_fraction": st.old_version_fraction,
            "old_version_tokens": st.old_version_tokens,
            "trained_tokens": st.trained_tokens,
            "engine_steps": st.engine_steps,
            "max_lag": st.max_lag,
            "in_flight": st.in_flight,
            **metrics,  # every learner metric, and the draft's, the fused engine's
        }

    def state_dict(self) -> dict[str, Any]:
        return {"scheduler": self.sched.state_dict(), "draft": self.drafter.state_dict() if self.drafter else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # The engine was started at version 0: it takes the restored learner's weights, version and draft.
        self.engine.update_weights(self.learner.weights(), self.learner.version)
        if self.drafter is not None:
            self.drafter.load_state_dict(state["draft"])
            self.engine.update_draft(self.drafter.weights(), self.drafter.version)
        self.sched.load_state_dict(state["scheduler"])


def run(
    cfg: RLConfig,
    out: str | Path,
    resume: bool = False,
    progress: bool = True,
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
    wrap_engine: Callable[[RolloutEngine], RolloutEngine] | None = None,
) -> list[dict[str, Any]]:
    """``posttrain rl``: the driver over an ``RLStage`` (``wrap_engine``: a test's fault injector)."""
    stage = RLStage(cfg, wrap_engine)
    return run_stage(stage, out, resume=resume, progress=progress, on_step=on_step, export_every=stage.cfg.export_every)


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


def export(model: torch.nn.Module, tokenizer: Any, path: Path) -> Path:
    """The policy as a Hugging Face checkpoint (``from_pretrained``-loadable) with its tokenizer (when it has one:
    the toy-language debug students of ``posttrain distill`` have none)."""
    model.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path
