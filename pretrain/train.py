"""The pre-training loop: DeepSpeed engine over packed shard batches, L = λ_text·L_text + λ_vis·L_VP (+ λ_ts·L_TS,
the time-series lane's forecasting loss, when the shards hold series: ``ts_loss`` in metrics.jsonl).

    scifolio pretrain --config debug --shards out --models tiny --max-steps 50      # via the deepspeed launcher
    DS_ACCELERATOR=cpu deepspeed --num_gpus 2 --no_local_rank --module pretrain.train --config debug --shards DIR
    python -m pretrain.train --config debug --shards DIR        # one process; sets RANK/WORLD_SIZE/... itself

Checkpoints go through ``engine.save_checkpoint`` without the frozen encoder; ``client_state`` carries the step,
every rank's data cursor and RNG states, so ``--resume`` continues the exact sample stream and loss curve.
"""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pretrain.args import build_parser, config_from_args
from pretrain.config import OptimConfig, TrainConfig, deepspeed_config
from pretrain.data import ShardLoader, model_inputs, n_text_tokens
from pretrain.model import VisualPretrainModel
from pretrain.objective import warmup_cosine


def train(cfg: TrainConfig, resume: bool = False, on_end: Callable[[Any], None] | None = None) -> list[dict[str, Any]]:
    """Run to ``cfg.max_steps`` optimizer steps; returns the metrics records (rank 0 writes them too).

    ``on_end(engine)`` runs on every rank after the last checkpoint (the export test reads the engine's logits)."""
    prepare_env()
    import deepspeed
    import torch.distributed as dist

    rank, world = init_distributed()
    # rank 0 records each chunk's draw weight (own × listed) beside the metrics: what this run sampled by
    record = str(Path(cfg.out_dir) / "draw_weights.parquet") if rank == 0 else None
    loader = ShardLoader(cfg.data, rank, world, record_weights=record)
    series = cfg.series if loader.series else None  # the time-series lane exists only when there are series
    # ZeRO-3 gathers parameters per module call, and ZeRO-1/2 reduce gradients in buckets filled in the order the
    # backward produces them: on several ranks every rank must call the same modules, whatever its batch holds.
    lockstep = cfg.zero_stage == 3 or (world > 1 and cfg.zero_stage in (1, 2))
    if series is not None and lockstep:
        # The lane has no lockstep dummy yet: a rank whose micro-batch holds no series would skip its modules.
        raise ValueError(
            f"the time-series lane with ZeRO-{cfg.zero_stage} on {world} rank(s) is not supported yet (ranks without "
            "series would make other module calls); train it on one rank with ZeRO-0/1/2 or several ranks with "
            "ZeRO-0, or set data.series=off"
        )
    model = VisualPretrainModel.load(
        cfg.model, cfg.objective, patch=cfg.data.patch, seed=cfg.seed, lockstep=lockstep, series=series
    )
    params = model.trainable_parameters()  # E_v is frozen: never handed to the optimizer
    optimizer = make_optimizer(params, cfg.optim)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: warmup_cosine(s, cfg.optim.warmup_steps, cfg.optim.decay_steps, cfg.optim.min_lr_ratio)
    )
    ckpt_dir = Path(cfg.out_dir) / "ckpt"
    resume = resume and (ckpt_dir / "latest").exists()
    tag = elastic_tag(cfg.out_dir, world) if resume else None
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=params,
        optimizer=optimizer,
        lr_scheduler=schedule,
        config=deepspeed_config(cfg, world, load_universal=bool(tag)),
    )
    step = 0
    if resume:
        _, client = engine.load_checkpoint(str(ckpt_dir), tag=tag, load_module_strict=False)
        step = int(client["step"])
        loader.resume(client["data"])  # at another world size the saved readers are dealt anew
        set_rng_state(client["rng"][rank % len(client["rng"])])
    log = MetricsLogger(cfg, rank, resume=resume, step=step)

    while step < cfg.max_steps:
        started, sums, tokens, samples, spans = time.perf_counter(), torch.zeros(4), 0, 0, []
        ts = torch.zeros(3, dtype=torch.float64)  # Σ ts_loss·values, Σ values, series seen
        for _ in range(cfg.grad_accum):
            batch = next(loader)
            out = engine(**model_inputs(batch))
            engine.backward(out["loss"])
            engine.step()  # DeepSpeed only updates (and steps the schedule) at the accumulation boundary
            sums += (
                torch.stack(
                    [out["loss"].detach().float(), out["l_text"].float(), out["l_vp"].float(), out["vp_acc"].float()]
                )
                / cfg.grad_accum
            )
            tokens, samples = tokens + n_text_tokens(batch), samples + batch["samples_finished"]
            if "ts_loss" in out:  # weighted by the target values each micro-batch scored
                n = float(out["ts_values"])
                ts += torch.tensor([float(out["ts_loss"]) * n, n, len(batch["series_slots"])], dtype=torch.float64)
            spans += batch["spans"]
        step += 1
        counts = torch.tensor([tokens, samples], dtype=torch.float64)
        dist.all_reduce(sums)
        dist.all_reduce(counts)
        if series is not None:
            dist.all_reduce(ts)
        elapsed = time.perf_counter() - started
        record = {
            "step": step,
            "loss": sums[0].item() / world,
            "l_text": sums[1].item() / world,
            "l_vp": sums[2].item() / world,
            "vp_acc": sums[3].item() / world,
            "lr": engine.get_lr()[0],
            "grad_norm": _float(engine.get_global_grad_norm()),
            "tokens_per_s": counts[0].item() / elapsed,
            "samples_per_s": counts[1].item() / elapsed,
        }
        if series is not None:  # null on a step whose batches held no series target
            record["ts_loss"] = ts[0].item() / ts[1].item() if ts[1] > 0 else None
            record["ts_series"] = int(ts[2].item())
        if cfg.log_spans:
            record["spans"], record["cursor"] = spans, loader.state_dict()
        if step % cfg.log_every == 0 or step == cfg.max_steps:
            log.write(record)
        if (cfg.save_every and step % cfg.save_every == 0) or step == cfg.max_steps:
            client = {
                "step": step,
                "data": all_gather_object(loader.state_dict()),
                "rng": all_gather_object(get_rng_state()),
            }
            engine.save_checkpoint(
                str(ckpt_dir), tag=f"step{step}", client_state=client, exclude_frozen_parameters=True
            )
    if on_end is not None:
        on_end(engine)
    log.close()
    return log.records


def elastic_tag(run: str, world: int) -> str | None:
    """None when the latest checkpoint can be loaded as saved; else (a ZeRO 1–3 run saved at another world size)
    the tag of its universal form, which rank 0 writes once beside it and every rank then loads.

    ZeRO partitions the optimizer state by rank, and DeepSpeed loads such a checkpoint at its own world size only;
    DeepSpeed's universal checkpoint holds each parameter's state whole, so any world size can load it."""
    import torch.distributed as dist

    from formats import fs
    from pretrain.export import latest_checkpoint

    saved = latest_checkpoint(run)
    if saved.zero_stage == 0 or saved.world_size == world:
        return None
    tag = f"{saved.tag}-universal"
    final = saved.dir / tag
    if dist.get_rank() == 0 and not final.exists():
        tmp = saved.dir / f".{tag}.tmp-{os.getpid()}"
        convert = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder"]
        convert += [str(saved.dir / saved.tag), "--output_folder", str(tmp)]
        subprocess.run([*convert, "--num_extract_workers", "1", "--num_merge_workers", "1"], check=True)
        fs.swap_dir(tmp, final)
        fs.write_text(saved.dir / "latest_universal", tag)  # the converter named its temporary folder there
    dist.barrier()
    return tag


def make_optimizer(params: list[torch.nn.Parameter], cfg: OptimConfig) -> torch.optim.Optimizer:
    if cfg.ds_cpu_adam:  # fused C++ Adam; JIT-compiled on first use (~2 min on 2 cores)
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, adamw_mode=True)
    return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)


def init_distributed() -> tuple[int, int]:
    """Join the launcher's process group, or make a bare ``python`` run a world of one.

    A world of one rendezvouses through a file, not a TCP store: c10d's TCPStore listens on every interface, and a
    single process has no reason to open a port at all. Gloo's own sockets stay on loopback unless told otherwise.
    """
    prepare_env()
    import deepspeed
    import torch.distributed as dist

    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    from deepspeed.accelerator import get_accelerator

    backend = "gloo" if get_accelerator().device_name() == "cpu" else get_accelerator().communication_backend_name()
    launched = all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))
    # A bare RANK is not a launcher: a world of one sets RANK/WORLD_SIZE below, and processes it starts inherit them.
    if launched:  # started by deepspeed / torchrun: env:// rendezvous at MASTER_ADDR:MASTER_PORT
        deepspeed.init_distributed(dist_backend=backend)
    else:
        import tempfile

        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        store = tempfile.NamedTemporaryFile(prefix="scifolio-dist-", delete=False).name
        deepspeed.init_distributed(
            dist_backend=backend, init_method=f"file://{store}", rank=0, world_size=1, auto_mpi_discovery=False
        )
    return dist.get_rank(), dist.get_world_size()


def prepare_env() -> None:
    """DeepSpeed reads these at import: CPU accelerator when no GPU, JIT ops built inside the project's cache."""
    if "DS_ACCELERATOR" not in os.environ and not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(__file__).resolve().parents[1] / ".cache/torch_extensions"))


def get_rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def all_gather_object(obj: Any) -> list[Any]:
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


class MetricsLogger:
    """stdout + the run directory's ``metrics.jsonl`` and TensorBoard (``formats.rundir.RunDir``), on rank 0 only;
    a resumed run's rows past its checkpoint are trimmed, so no step appears twice."""

    def __init__(self, cfg: TrainConfig, rank: int, resume: bool = False, step: int = 0) -> None:
        from formats.rundir import RunDir

        self.rank, self.records = rank, []
        self.run = RunDir(cfg.out_dir, resume=resume, tensorboard=cfg.tensorboard, rank=rank, checkpoint="ckpt/latest")
        if resume:
            self.run.trim(step)
        self.run.write_config(dataclasses.asdict(cfg))  # what `pretrain export` reads to rebuild the backbone

    def write(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        if self.rank != 0:
            return
        print(
            " ".join(
                f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                for k, v in record.items()
                if k not in ("spans", "cursor")
            ),
            flush=True,
        )
        self.run.log(record)

    def close(self) -> None:
        self.run.close()


def _float(x: Any) -> float | None:
    return None if x is None else float(x)


def shutdown_distributed() -> None:
    """Leave the process group once every rank is done. A rank that exits with gloo's group still alive can abort
    in its threads' teardown ("terminate called without an active exception", SIGABRT) after a run that finished
    and saved: the launcher then reports the whole run failed."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    prepare_env()
    train(config_from_args(args), resume=args.resume)
    shutdown_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
