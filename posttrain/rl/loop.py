"""The RL driver: collect (partial rollout) → learn → sync → checkpoint, one metrics row per step.

    scifolio posttrain rl --config debug --out runs/rl            # or:
    python -c "from posttrain.rl.loop import run; from posttrain.rl.recipes import debug; run(debug(), 'runs/rl')"

Files under ``out``: ``metrics.jsonl`` (one row per learner step), ``trained.jsonl`` (ids of the
trajectories each step trained on), ``tb/`` (TensorBoard), ``checkpoint/state.pt`` (learner, optimizer,
scheduler with its in-flight partial trajectories and the data cursor) and ``policy/`` (the trained
policy as a Hugging Face checkpoint with its tokenizer). Rows are written before the checkpoint, and
``resume`` drops rows newer than the checkpoint, so a kill -9 anywhere loses nothing and trains no
trajectory twice.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from posttrain.rl.draft import DraftTrainer
from posttrain.rl.learner import Learner
from posttrain.rl.recipes import RLConfig, to_dict
from posttrain.rl.task import VERIFIERS, JsonlTask, TaskSource, char_tokenizer, countdown_rows
from posttrain.rollout.engine import RolloutEngine
from posttrain.rollout.engines.hf import HFEngine
from posttrain.rollout.engines.speculative import SpeculativeEngine
from posttrain.rollout.scheduler import PartialRolloutScheduler, SyncScheduler
from posttrain.rollout.types import SamplingParams


def build_policy(cfg: RLConfig) -> tuple[torch.nn.Module, Any]:
    """(policy model in fp32, tokenizer): the tiny debug policy when no path is given."""
    if cfg.policy.path is None:
        from transformers import Qwen2Config, Qwen2ForCausalLM

        tok = char_tokenizer()
        torch.manual_seed(cfg.policy.seed)
        h = cfg.policy.hidden_size
        mcfg = Qwen2Config(
            vocab_size=len(tok),
            hidden_size=h,
            intermediate_size=2 * h,
            num_hidden_layers=cfg.policy.num_layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            tie_word_embeddings=True,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
            attn_implementation=cfg.policy.attn_implementation,
        )
        return Qwen2ForCausalLM(mcfg).float(), tok
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        cfg.policy.path, dtype=torch.float32, attn_implementation=cfg.policy.attn_implementation
    )
    return model, AutoTokenizer.from_pretrained(cfg.policy.tokenizer or cfg.policy.path)


def build_draft(cfg: RLConfig, policy: torch.nn.Module) -> torch.nn.Module:
    """The speculative draft: ``speculative.draft_path`` or, for the tiny policy, a narrower/shallower Qwen2."""
    spec = cfg.speculative
    if spec.draft_path is not None:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(
            spec.draft_path, dtype=torch.float32, attn_implementation=cfg.policy.attn_implementation
        )
    if cfg.policy.path is not None:
        raise ValueError("speculative.enabled with a policy.path needs speculative.draft_path")
    from transformers import Qwen2ForCausalLM

    mcfg = copy.deepcopy(policy.config)
    mcfg.hidden_size = max(8, int(cfg.policy.hidden_size * spec.draft_scale) // 8 * 8)
    mcfg.intermediate_size = 2 * mcfg.hidden_size
    mcfg.num_hidden_layers = max(1, int(cfg.policy.num_layers * spec.draft_scale))
    if hasattr(mcfg, "layer_types"):
        mcfg.layer_types = mcfg.layer_types[: mcfg.num_hidden_layers]
    torch.manual_seed(cfg.policy.seed + 1)
    return Qwen2ForCausalLM(mcfg).float().eval()


def build_fused(cfg: RLConfig, policy: torch.nn.Module) -> torch.nn.Module:
    """``FusedLM(policy, memory, router)`` for ``memdec.enabled`` (Eq 3 rollouts): the memory from
    ``memdec.memory`` (``scifolio memdec train``'s directory) or, for the tiny policy, a random half-width Qwen2 on
    the policy's vocabulary; the router from ``memdec.router`` or untrained."""
    from posttrain.memdec.fused import FusedLM
    from posttrain.memory_decoder import Router, RouterConfig

    m = cfg.memdec
    if m.memory is not None:
        from transformers import AutoModelForCausalLM

        memory = AutoModelForCausalLM.from_pretrained(
            m.memory, dtype=torch.float32, attn_implementation=cfg.policy.attn_implementation
        ).eval()
    elif cfg.policy.path is not None:
        raise ValueError("memdec.enabled with a policy.path needs memdec.memory (a trained memory directory)")
    else:
        from transformers import Qwen2ForCausalLM

        mcfg = copy.deepcopy(policy.config)
        mcfg.hidden_size = max(8, cfg.policy.hidden_size // 2 // 8 * 8)
        mcfg.intermediate_size = 2 * mcfg.hidden_size
        torch.manual_seed(cfg.policy.seed + 2)
        memory = Qwen2ForCausalLM(mcfg).float().eval()
    if m.router is not None:
        from posttrain.memdec.train import load_router

        router = load_router(m.router)
    else:
        router = Router(RouterConfig(policy.config.hidden_size, memory.config.hidden_size))
    return FusedLM(policy, memory, router)


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
        max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p, stop_token_ids=stop
    )


def _truncate_rows(path: Path, last_step: int) -> None:
    """Keep only rows with ``step <= last_step`` (rows of a step the checkpoint does not cover are redone)."""
    if not path.exists():
        return
    rows = [line for line in path.read_text().splitlines() if line.strip()]
    kept = [r for r in rows if json.loads(r)["step"] <= last_step]
    path.write_text("".join(r + "\n" for r in kept))


def _append(path: Path, row: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _save(path: Path, state: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # atomic: a kill leaves the old or the new checkpoint, never half of one


def run(
    cfg: RLConfig,
    out: str | Path,
    resume: bool = False,
    progress: bool = True,
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
    make_engine: Callable[[dict[str, torch.Tensor], int], RolloutEngine] | None = None,
) -> list[dict[str, Any]]:
    """Train for ``cfg.steps`` learner steps (continuing from ``out/checkpoint`` when ``resume``); returns the rows.

    ``make_engine(weights, version)`` builds the rollout engine (``--ray``: engine workers on a cluster); by
    default an in-process ``HFEngine`` on a copy of the policy. With ``speculative.enabled`` it must build
    speculative engines (``RayEngine`` over ``SpeculativeEngine`` workers); the draft trainer stays here, with the
    learner, and each step's draft goes to the engine by ``update_draft`` with its version."""
    from torch.utils.tensorboard import SummaryWriter

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    model, tokenizer = build_policy(cfg)
    learner = Learner(model, cfg.learner, temperature=cfg.sampling.temperature, top_p=cfg.sampling.top_p)
    ckpt = out / "checkpoint" / "state.pt"
    metrics_path, trained_path = out / "metrics.jsonl", out / "trained.jsonl"
    start, state = 0, None
    if resume:
        if not ckpt.exists():
            raise FileNotFoundError(f"--resume: no checkpoint at {ckpt}")
        state = torch.load(ckpt, weights_only=False)
        learner.load_state_dict(state["learner"])
        start = int(state["step"])
    else:
        for p in (metrics_path, trained_path):
            p.unlink(missing_ok=True)
    if cfg.memdec.enabled and (make_engine is not None or cfg.speculative.enabled):
        raise ValueError("memdec.enabled runs on the in-process HF engine (not with --ray or --speculative)")
    drafter = None
    if cfg.speculative.enabled:
        # The draft trainer lives with the learner (here, also with --ray); engines get its weights by sync.
        drafter = DraftTrainer(build_draft(cfg, model), cfg.speculative)
        if state is not None:
            drafter.load_state_dict(state["draft"])
    # The engine starts from the learner's exact weights and version (a fresh run: version 0), and the draft's.
    if make_engine is not None:
        engine = make_engine(learner.weights(), learner.version)
        if drafter is not None:
            if not callable(getattr(engine, "update_draft", None)):
                raise ValueError("speculative.enabled: make_engine must build a speculative engine (update_draft)")
            engine.update_draft(drafter.weights(), drafter.version)
    elif drafter is not None:
        engine = SpeculativeEngine(
            copy.deepcopy(model).eval(),
            copy.deepcopy(drafter.draft).eval(),
            k=cfg.speculative.k,
            capacity=cfg.engine_capacity,
            draft_version=drafter.version,
        )
        if learner.version:
            engine.update_weights(learner.weights(), learner.version)
    else:
        policy = copy.deepcopy(model).eval()
        engine = HFEngine(build_fused(cfg, policy) if cfg.memdec.enabled else policy, capacity=cfg.engine_capacity)
        if learner.version:
            engine.update_weights(learner.weights(), learner.version)
    source = TaskSource(build_task(cfg), tokenizer, seed=cfg.seed)
    cls = PartialRolloutScheduler if cfg.scheduler.partial else SyncScheduler
    sched = cls(engine, source, source.reward, sampling_params(cfg, tokenizer), cfg.scheduler, seed=cfg.seed)
    if state is not None:
        sched.load_state_dict(state["scheduler"])
    _truncate_rows(metrics_path, start)
    _truncate_rows(trained_path, start)
    (out / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
    writer = SummaryWriter(str(out / "tb"), purge_step=start + 1)

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.steps, initial=start, desc="posttrain rl", unit="step")
    rows = []
    for step in range(start + 1, cfg.steps + 1):
        t0 = time.perf_counter()
        batch = sched.collect()
        t1 = time.perf_counter()
        lm = learner.train(batch)
        trajs = [t for g in batch.groups for t in g]
        dm: dict[str, Any] = {}
        if drafter is not None:
            # The draft chases the updated policy on the states just collected; synced with the policy.
            drafter.observe(engine.take_round_log())
            round_acc = engine.acceptance
            dm = drafter.update(trajs, learner.model, temperature=cfg.sampling.temperature)
            dm["draft_round_acceptance"] = round_acc
            dm["tokens_per_round"] = engine.emitted / max(1, engine.rounds)
            engine.update_draft(drafter.weights(), drafter.version)
            dm["engine_draft_version"] = engine.draft_version  # with --ray: the version every worker holds
        if cfg.memdec.enabled:
            dm["memdec_lambda_mean"] = engine.model.take_lambda_mean()  # mean λ_t over this step's rollout positions
        sched.sync(learner.weights(), learner.version)
        t2 = time.perf_counter()
        st = batch.stats
        row = {
            "step": step,
            "version": learner.version,
            "reward": sum(t.reward for t in trajs) / len(trajs),
            "response_length": st["mean_trained_length"],
            "sampled_length": st["mean_finished_length"],
            "discarded_stale": st["discarded_trajectories"],
            "discarded_stale_tokens": st["discarded_tokens"],
            "stale_masked_tokens": st["stale_masked_tokens"],
            "dapo_dropped_groups": st["dapo_dropped_groups"],
            "bkl_masked_fraction": lm["bkl_masked_fraction"],
            # Run-to-date: a step whose batch came entirely from carried-over groups takes no engine step.
            "occupancy": st["occupancy_cumulative"],
            "old_version_fraction": st["old_version_fraction"],
            "old_version_tokens": st["old_version_tokens"],
            "trained_tokens": st["trained_tokens"],
            "engine_steps": st["engine_steps"],
            "max_lag": st["max_lag"],
            "in_flight": st["in_flight"],
            "loss": lm["loss"],
            "clip_fraction": lm["clip_fraction"],
            "mismatch_abs_mean": lm["mismatch_abs_mean"],
            "rollout_s": t1 - t0,
            "train_s": t2 - t1,
            **dm,
        }
        _append(metrics_path, row)
        _append(trained_path, {"step": step, "ids": [t.request_id for t in trajs], "dapo_dropped": batch.dropped})
        _save(
            ckpt,
            {
                "step": step,
                "learner": learner.state_dict(),
                "scheduler": sched.state_dict(),
                "config": to_dict(cfg),
                "draft": drafter.state_dict() if drafter is not None else None,
            },
        )
        for k, v in row.items():
            if k != "step":
                writer.add_scalar(k, v, step)
        rows.append(row)
        if bar is not None:
            bar.set_postfix(
                reward=f"{row['reward']:.3f}", occ=f"{row['occupancy']:.2f}", old=f"{row['old_version_fraction']:.2f}"
            )
            bar.update(1)
        if on_step is not None:
            on_step(step, row)
        if cfg.export_every and step % cfg.export_every == 0:
            export(learner.model, tokenizer, out / "policy")
    if bar is not None:
        bar.close()
    writer.close()
    export(learner.model, tokenizer, out / "policy")
    return rows


def export(model: torch.nn.Module, tokenizer: Any, path: Path) -> Path:
    """The policy as a Hugging Face checkpoint (``from_pretrained``-loadable) with its tokenizer."""
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
