"""Train the time-series lane on windows cut from series records; one run directory per run.

    from pretrain.timeseries.train import train, load_run
    train(debug(), records, "out/ts")             # out/ts/{config.json, metrics.jsonl, ckpt.pt, data.json}
    cfg, model = load_run("out/ts")

Run directory (DESIGN "one layout"): ``config.json``; ``metrics.jsonl`` (trimmed to the checkpoint's step on
resume); ``ckpt.pt`` written atomically (model, optimizer, scheduler, step, sampler RNG state); ``tb/`` TensorBoard
when tensorboard is installed. ``resume=True`` continues the same window stream up to ``train.steps``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from formats import fs
from formats.overrides import with_overrides
from formats.series import SeriesRecord
from pretrain.timeseries.config import TimeseriesConfig
from pretrain.timeseries.forecaster import SeriesForecastModel, pad_batch


def series_arrays(records: Sequence[SeriesRecord], holdout: int = 0) -> list[np.ndarray]:
    """Records → ``[C, T]`` arrays, the last ``holdout`` points cut (the eval protocol's test window)."""
    out = []
    for r in records:
        a = np.asarray(r.values, dtype=np.float64)
        if holdout:
            a = a[:, :-holdout] if a.shape[1] > holdout else a[:, :0]
        out.append(a)
    return out


def windows(
    series: Sequence[np.ndarray], cfg: TimeseriesConfig, rng: random.Random
) -> Iterator[tuple[torch.Tensor, torch.Tensor, list[str]]]:
    """Endless batches of (context ``[B, C, T]``, target ``[B, C, H]``, instruction texts): a series drawn
    uniformly, a cut point drawn uniformly so that ≥ ``min_context`` points precede it and ≥ 1 follows. Each batch
    draws its own context cap in [min_context, context]: the patch length follows a batch's longest context, so
    every L that inference meets (``forecast_many`` batches by L) is also trained on."""
    tc = cfg.train
    usable = [s for s in series if s.shape[1] > tc.min_context]
    if not usable:
        raise ValueError(f"no series longer than min_context={tc.min_context} (+1) to train on")
    while True:
        ctxs, tgts, texts = [], [], []
        cap = rng.randint(tc.min_context, max(tc.min_context, tc.context))
        for _ in range(tc.batch):
            s = usable[rng.randrange(len(usable))]
            t = rng.randint(tc.min_context, s.shape[1] - 1)
            ctxs.append(s[:, max(0, t - cap) : t])
            tgt = np.full((s.shape[0], tc.horizon), np.nan)
            fut = s[:, t : t + tc.horizon]
            tgt[:, : fut.shape[1]] = fut
            tgts.append(tgt)
            texts.append(f"forecast the next {tc.horizon} steps" if rng.random() < 0.5 else "")
        c = max(a.shape[0] for a in ctxs)
        y = np.full((len(tgts), c, tc.horizon), np.nan)
        for i, g in enumerate(tgts):
            y[i, : g.shape[0]] = g
        yield pad_batch(ctxs), torch.from_numpy(y), texts


def config_to_dict(cfg: TimeseriesConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def config_from_dict(d: dict[str, Any]) -> TimeseriesConfig:
    """Inverse of ``config_to_dict`` through the one override rule (lists become tuples, types checked)."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, obj: dict[str, Any]) -> None:
        for k, v in obj.items():
            if isinstance(v, dict):
                walk(f"{prefix}{k}.", v)
            else:
                flat[prefix + k] = v

    walk("", d)
    return with_overrides(TimeseriesConfig(), flat)


def _cosine(total: int, floor: float = 0.1) -> Callable[[int], float]:
    return lambda s: floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(s, total) / max(total, 1)))


def train(
    cfg: TimeseriesConfig,
    records: Sequence[SeriesRecord],
    out_dir: str | os.PathLike[str],
    resume: bool = False,
    quiet: bool = True,
    data_files: Sequence[str] = (),
) -> dict[str, Any]:
    """Train to ``cfg.train.steps``; returns the last metrics line. ``resume`` needs ``out_dir/ckpt.pt``."""
    from formats.rundir import RunDir

    run = RunDir(out_dir, resume=resume, checkpoint="ckpt.pt")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    model = SeriesForecastModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _cosine(cfg.train.steps))
    rng = random.Random(cfg.seed)
    start = 0
    if resume:
        state = run.load_checkpoint(lambda p: torch.load(p, weights_only=False))
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        rng.setstate(state["rng"])
        start = state["step"]
        run.trim(start)
    run.write_config(config_to_dict(cfg))
    fs.write_text(
        run.path / "data.json",
        json.dumps({"files": list(data_files), "series": len(records), "holdout": cfg.train.holdout}, indent=2) + "\n",
    )

    def checkpoint(step: int) -> None:
        state = {"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}
        run.save_checkpoint(lambda f: torch.save({**state, "step": step, "rng": rng.getstate()}, f))

    batches = windows(series_arrays(records, cfg.train.holdout), cfg, rng)
    last: dict[str, Any] = {"step": start}
    t0, window_loss = time.time(), []
    model.train()
    try:
        for step in range(start + 1, cfg.train.steps + 1):
            ctx, tgt, texts = next(batches)
            losses = model.loss(ctx, tgt, texts)
            opt.zero_grad(set_to_none=True)
            losses["loss"].backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            window_loss.append(float(losses["loss"].detach()))
            if step % cfg.train.log_every == 0 or step == cfg.train.steps:
                last = {
                    "step": step,
                    "loss": float(np.mean(window_loss)),
                    "point": float(losses["point"]),
                    "quantile": float(losses["quantile"]),
                    "lr": sched.get_last_lr()[0],
                    "elapsed_s": round(time.time() - t0, 2),
                }
                window_loss = []
                run.log(last)
                if not quiet:
                    print(json.dumps(last), flush=True)
            if step % cfg.train.save_every == 0 and step != cfg.train.steps:
                checkpoint(step)
        checkpoint(max(cfg.train.steps, start))
    finally:
        run.close()
    return last


def load_run(run_dir: str | os.PathLike[str]) -> tuple[TimeseriesConfig, SeriesForecastModel]:
    """A trained run's config and model (eval mode)."""
    run = Path(run_dir)
    if not (run / "ckpt.pt").exists():
        raise FileNotFoundError(f"{run}: no ckpt.pt (train first: scifolio timeseries train --out {run})")
    cfg = config_from_dict(json.loads((run / "config.json").read_text()))
    model = SeriesForecastModel(cfg)
    model.load_state_dict(torch.load(run / "ckpt.pt", weights_only=False)["model"])
    return cfg, model.eval()
