"""``scifolio timeseries``: the time-series lane alone (SPEC C10) on CSV / parquet / Monash .tsf files.

    scifolio timeseries forecast --data sales.csv --horizon 12 --out fc.csv     # the shipped default model
    scifolio timeseries train --init default --data sales.csv --out out/ft [--set steps=200]   # fine-tune it
    scifolio timeseries train --config debug --data m1.tsf --out out/ts --set train.holdout=6 [--resume]
    scifolio timeseries forecast --model out/ts --data m1.tsf --horizon 6 --out fc.csv
    scifolio timeseries forecast --model out/ts --data s.csv --instruction "the next two seconds" --sampling-rate-hz 50 \
        --out fc.parquet
    scifolio timeseries eval --model out/ts --data m1.tsf --horizon 6 [--season 1] [--baselines AutoETS,AutoARIMA]

Files that cannot be read are quarantined (``<out or model>/quarantine/series.jsonl``) with a reason, never a crash.
``forecast`` follows the contract of ``pretrain/timeseries/tables.py``: the input's column names (``series_id,
timestamp, value`` or ``unique_id, ds, y``, ``channel``), ids verbatim, timestamps continuing at the inferred
frequency, then ``q0.1 … q0.9``; the same id in two files is an error naming both. ``eval`` uses the last-window
protocol: each series minus its last H points is the history, the last H points are scored.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from pipelines.cli.options import add_set, apply_sets


def register(subparsers: argparse._SubParsersAction) -> None:
    from pretrain.timeseries.config import RECIPES

    p = subparsers.add_parser(
        "timeseries",
        help="time-series lane alone: train | forecast | eval",
        description="Encoder + forecaster (SPEC C10) on CSV/parquet/.tsf series files.",
    )
    sub = p.add_subparsers(dest="ts_command", metavar="STAGE", required=True)
    t = sub.add_parser("train", help="train the encoder + forecaster", description="train on windows of the series")
    t.add_argument("--config", default="debug", choices=sorted(RECIPES), help="named recipe (pretrain/timeseries)")
    t.add_argument("--init", choices=["default"], default=None,
                   help="fine-tune the shipped default model (--set keys: pretrained.FitConfig, e.g. steps=200)")  # fmt: skip
    t.add_argument("--data", nargs="+", required=True, help="series files or directories (.csv .parquet .tsf)")
    t.add_argument("--out", required=True, help="run directory (config.json, metrics.jsonl, ckpt.pt)")
    t.add_argument("--resume", action="store_true", help="continue from <out>/ckpt.pt")
    t.add_argument("--quiet", action="store_true", help="no per-log-line output")
    add_set(t, "train.steps=50 or train.holdout=6")
    t.set_defaults(func=run_train)

    f = sub.add_parser("forecast", help="forecast every series of a file", description="forecast H values per series")
    f.add_argument("--model", default=None, help="run directory written by train (default: the shipped model)")
    f.add_argument("--data", nargs="+", required=True, help="series files or directories")
    g = f.add_mutually_exclusive_group(required=True)
    g.add_argument("--horizon", type=int, help="values to forecast")
    g.add_argument("--instruction", help='e.g. "forecast the next 96 steps" (the horizon predictor reads it)')
    f.add_argument("--sampling-rate-hz", type=float, default=None, help="converts durations in the instruction")
    f.add_argument("--out", required=True, help="FILE.csv or FILE.parquet")
    f.set_defaults(func=run_forecast)

    e = sub.add_parser("eval", help="score against seasonal naive, AutoETS, AutoARIMA", description=__doc__)
    e.add_argument("--model", default=None, help="run directory ('none' = baselines only; default: shipped model)")
    e.add_argument("--data", nargs="+", required=True, help="series files or directories")
    e.add_argument("--horizon", type=int, required=True, help="H: the last H points of each series are scored")
    e.add_argument("--season", type=int, default=None, help="MASE seasonal period (default: from the frequency)")
    e.add_argument("--baselines", default="AutoETS,AutoARIMA", help="comma list of statsforecast models; '' = none")
    e.add_argument("--json", default=None, help="also write the scores here")
    e.set_defaults(func=run_eval)


def read_files(paths: list[str], quarantine_dir: str | None):
    """Every series in the given files/directories; bad files go to ``quarantine_dir/series.jsonl``."""
    from formats.quarantine import write_quarantine
    from formats.series import read_series_file
    from pipelines.assembly.series import pandas_timestamps

    files = _files(paths)
    records, dropped = [], []
    for path in files:
        r, d = read_series_file(path, parse_timestamps=pandas_timestamps)
        records += r
        dropped += d
    for d in dropped:
        print(f"quarantined {d.item_id}: {d.reason}", file=sys.stderr)
    if quarantine_dir and dropped:
        write_quarantine(os.path.join(quarantine_dir, "quarantine"), "series", [d.to_row() for d in dropped])
    return files, records, dropped


def run_train(args: argparse.Namespace) -> int:
    from pretrain.timeseries.config import RECIPES
    from pretrain.timeseries.train import train

    if args.init == "default":
        return run_finetune(args)
    cfg = apply_sets(RECIPES[args.config](), args.set)
    files, records, _ = read_files(args.data, args.out)
    if not records:
        print("error: no readable series in --data", file=sys.stderr)
        return 2
    try:
        last = train(cfg, records, args.out, resume=args.resume, quiet=args.quiet, data_files=files)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"run": args.out, "series": len(records)} | last))
    return 0


def _load(model_dir: str | None):
    from pretrain.timeseries.pretrained import load_model

    try:
        return load_model(model_dir)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def _files(paths: list[str]) -> list[str]:
    from formats.series import is_series_file

    files: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            files += sorted(str(q) for q in Path(p).rglob("*") if q.is_file() and is_series_file(str(q)))
        else:
            files.append(p)
    return files


def _contract_inputs(paths: list[str], quarantine_dir: str | None):
    """The forecast contract's reader; refused files / series are printed and quarantined. Exits 2 on a
    ContractError (an id in two files …) or when no series is left."""
    from formats.quarantine import write_quarantine
    from formats.records import Dropped
    from pretrain.timeseries.tables import ContractError, read_inputs

    files = _files(paths)
    try:
        names, series, refused = read_inputs(files)
    except ContractError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    for r in refused:
        print(f"refused {r.item}: {r.message}", file=sys.stderr)
    if quarantine_dir and refused:
        rows = [Dropped(r.item, "series", r.reason, {"error": r.message[:300]}).to_row() for r in refused]
        write_quarantine(os.path.join(quarantine_dir, "quarantine"), "series", rows)
    if not series:
        print("error: no readable series in --data", file=sys.stderr)
        raise SystemExit(2)
    return files, names, series


def run_forecast(args: argparse.Namespace) -> int:
    from pretrain.timeseries.horizon import predict_horizon
    from pretrain.timeseries.pretrained import forecast_any, quantile_levels
    from pretrain.timeseries.tables import forecast_table, write_table

    _, names, series = _contract_inputs(args.data, os.path.dirname(os.path.abspath(args.out)))
    model = _load(args.model)
    horizon = args.horizon
    if horizon is None:
        first = series[0]
        horizon = predict_horizon(args.instruction, sampling_rate_hz=args.sampling_rate_hz,
                                  sampling_period_s=first.period_s, freq_unit=first.freq_unit)  # fmt: skip
        if horizon is None:
            print(f"error: no horizon in {args.instruction!r} (a duration needs --sampling-rate-hz)", file=sys.stderr)
            return 2
    if horizon < 1:
        print("error: --horizon must be ≥ 1", file=sys.stderr)
        return 2
    try:
        points, quants = forecast_any(model, [s.values for s in series], horizon)
    except ValueError as e:  # beyond the model's documented maximum horizon
        print(f"error: {e}", file=sys.stderr)
        return 2
    table = forecast_table(names, series, points, quants, quantile_levels(model))
    write_table(table, args.out)
    print(json.dumps({"out": args.out, "series": len(series), "horizon": horizon, "rows": len(table)}))
    return 0


def run_finetune(args: argparse.Namespace) -> int:
    from pretrain.timeseries.pretrained import FitConfig, finetune

    if args.resume:
        print("error: --init default starts a new run; --resume is for --config runs", file=sys.stderr)
        return 2
    fcfg = apply_sets(FitConfig(steps=200, lr=1e-4, batch=64, warmup=20, log_every=25), args.set)
    files, _, series = _contract_inputs(args.data, args.out)
    try:
        last = finetune([s.values for s in series], args.out, fcfg, files, quiet=args.quiet)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"run": args.out, "series": len(series), "init": "default"} | last))
    return 0


def run_eval(args: argparse.Namespace) -> int:
    import numpy as np

    from pretrain.timeseries.evaluate import evaluate

    model = None if args.model == "none" else _load(args.model)
    _, _, series = _contract_inputs(args.data, None)  # the files forecast reads, read the same way
    h = args.horizon
    hist, act, seasons = [], [], []
    for s in series:
        a = s.values
        if a.size > h and np.isfinite(a[-h:]).all():
            hist.append(a[:-h])
            act.append(a[-h:])
            seasons.append(s.season)
    if not hist:
        print(f"error: no series longer than H={h} with a finite last window", file=sys.stderr)
        return 2
    season = args.season or (max(set(seasons), key=seasons.count) if seasons else 1)
    baselines = [b for b in args.baselines.split(",") if b.strip()]
    report = evaluate(model, hist, act, h, season, baselines=baselines)
    print(report.table())
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return 0
