"""One run directory for every training stage: pre-training, each post-training stage, memdec, time series.

    run = RunDir("runs/rl", resume=args.resume)     # fresh: empties metrics; resume: keeps them
    run.write_config(config_dict)                    # config.json
    start = run.load_checkpoint(torch_load)["step"]  # resume: the last complete checkpoint's step
    run.trim(start)                                  # rows newer than the checkpoint are redone, not duplicated
    run.log({"step": 1, "loss": 0.3})                # metrics.jsonl (fsync'd) + TensorBoard scalars
    run.save_checkpoint(lambda f: torch.save(state, f))

Layout: ``config.json``, ``metrics.jsonl`` (one row per step, each with ``step``), ``tb/`` (TensorBoard events),
``checkpoint/state.pt`` (committed whole by ``fs.open_output``: a kill -9 leaves the old or the new file, never
half of one) and ``policy/`` (the Hugging Face model a stage hands to the next one). DeepSpeed runs (pre-training,
SFT) checkpoint under ``ckpt/`` instead, configured by ``deepspeed_json``. Rows are written before the
checkpoint, so after a kill the rows past the checkpoint's step are trimmed on resume and the step is redone.

TensorBoard events are written with the ``tensorboard`` package's own event writer, so this module stays free of
torch (``formats`` is a leaf); TensorBoard is optional and a run without it still writes every other file.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from formats import fs

CHECKPOINT = "checkpoint/state.pt"


class RunDir:
    """A training run's directory: config, metrics rows, TensorBoard, atomic checkpoints, exported policy."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        resume: bool = False,
        tensorboard: bool = True,
        rank: int = 0,
        checkpoint: str = CHECKPOINT,
        logs: tuple[str, ...] = (),
    ):
        """``checkpoint``: the file whose presence makes a run resumable (DeepSpeed runs: ``ckpt/latest``);
        ``logs``: further per-step jsonl files (``trained.jsonl``…), reset and trimmed with ``metrics.jsonl``."""
        self.path, self.resume, self.rank = Path(path), resume, rank
        self.checkpoint, self._logs = self.path / checkpoint, logs
        self._tb: Any = None
        self._tb_wanted = tensorboard and rank == 0
        if rank != 0:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        if resume and not self.checkpoint.exists():
            raise FileNotFoundError(f"--resume: no checkpoint at {self.checkpoint}")
        if not resume:
            for p in (self.metrics, *self.extra_logs()):
                p.unlink(missing_ok=True)

    # -- paths -----------------------------------------------------------------------------------------------
    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def policy(self) -> Path:
        """Where a stage writes the Hugging Face model the next stage loads."""
        return self.path / "policy"

    def extra_logs(self) -> list[Path]:
        return [self.path / name for name in self._logs]

    # -- config ----------------------------------------------------------------------------------------------
    def write_config(self, config: dict[str, Any]) -> None:
        if self.rank == 0:
            fs.write_text(self.path / "config.json", json.dumps(config, indent=2, default=str))

    # -- metrics ---------------------------------------------------------------------------------------------
    def trim(self, last_step: int) -> None:
        """Drop rows with ``step > last_step`` from every jsonl of the run (they belong to an unfinished step)."""
        if self.rank != 0:
            return
        for p in (self.metrics, *self.extra_logs()):
            if not p.exists():
                continue
            rows = [r for r in p.read_text().splitlines() if r.strip()]
            kept = [r for r in rows if json.loads(r).get("step", 0) <= last_step]
            if len(kept) != len(rows):
                fs.write_text(p, "".join(r + "\n" for r in kept))
        self._open_tb(purge_step=last_step + 1)

    def log(self, row: dict[str, Any], file: str = "metrics.jsonl", scalars: bool = True) -> None:
        """Append one row (durably: fsync) to ``file``; numeric fields also go to TensorBoard."""
        if self.rank != 0:
            return
        with open(self.path / file, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if scalars and file == "metrics.jsonl":
            self._scalars(row)

    def rows(self, file: str = "metrics.jsonl") -> list[dict[str, Any]]:
        p = self.path / file
        return [json.loads(r) for r in p.read_text().splitlines() if r.strip()] if p.exists() else []

    # -- checkpoints -----------------------------------------------------------------------------------------
    def save_checkpoint(self, write: Callable[[IO[bytes]], None]) -> None:
        """``write(file)`` serialises the state; the file replaces the old checkpoint only once complete."""
        if self.rank == 0:
            with fs.open_output(self.checkpoint) as f:
                write(f)

    def load_checkpoint(self, read: Callable[[Path], Any]) -> Any:
        return read(self.checkpoint)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    # -- TensorBoard -----------------------------------------------------------------------------------------
    def _open_tb(self, purge_step: int | None = None) -> None:
        if not self._tb_wanted or self._tb is not None:
            return
        try:
            from tensorboard.compat.proto.event_pb2 import Event, SessionLog
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError:  # TensorBoard is optional: metrics.jsonl is the record
            self._tb_wanted = False
            return
        self._tb = EventFileWriter(str(self.path / "tb"))
        if purge_step is not None:  # TensorBoard hides events of a resumed run's redone steps
            self._tb.add_event(Event(step=purge_step, file_version="brain.Event:2"))
            self._tb.add_event(Event(step=purge_step, session_log=SessionLog(status=SessionLog.START)))

    def _scalars(self, row: dict[str, Any]) -> None:
        self._open_tb()
        if self._tb is None or "step" not in row:
            return
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [
            Summary.Value(tag=k, simple_value=float(v))
            for k, v in row.items()
            if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)
        ]
        self._tb.add_event(Event(wall_time=time.time(), step=int(row["step"]), summary=Summary(value=values)))
        self._tb.flush()


def deepspeed_json(
    micro_batch: int,
    grad_accum: int,
    world_size: int,
    grad_clip: float,
    precision: str,
    zero_stage: int,
    load_universal: bool = False,
) -> dict[str, Any]:
    """The DeepSpeed JSON of a run with a client optimizer and its own logging: pre-training (``pretrain.config``)
    and SFT (``posttrain.sft``) alike (a dict: this module stays free of DeepSpeed)."""
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision must be fp32 or bf16, got {precision!r}")
    if not 0 <= zero_stage <= 3:
        raise ValueError(f"zero_stage must be 0..3, got {zero_stage}")
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "train_batch_size": micro_batch * grad_accum * world_size,
        "gradient_clipping": grad_clip,
        "bf16": {"enabled": precision == "bf16"},
        "zero_optimization": {"stage": zero_stage},
        # A client torch.optim.AdamW is a documented, tested path; DeepSpeed only warns about it under ZeRO.
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 10**9,  # we log ourselves; DeepSpeed's own print is noise
        "wall_clock_breakdown": False,
        "checkpoint": {"load_universal": load_universal},
    }
