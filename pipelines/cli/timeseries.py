"""``scifolio timeseries``: the time-series lane alone (SPEC C10) on CSV / parquet / Monash .tsf files.

    scifolio timeseries train --config debug --data m1.tsf --out out/ts --set train.holdout=6 [--resume]
    scifolio timeseries forecast --model out/ts --data m1.tsf --horizon 6 --out fc.csv
    scifolio timeseries forecast --model out/ts --data s.csv --instruction "the next two seconds" --sampling-rate-hz 50 \
        --out fc.parquet
    scifolio timeseries eval --model out/ts --data m1.tsf --horizon 6 [--season 1] [--baselines AutoETS,AutoARIMA]

Files that cannot be read are quarantined (``<out or model>/quarantine/series.jsonl``) with a reason, never a crash.
``forecast`` writes long format ``series_id, channel, step, value, q0.1 … q0.9``. ``eval`` uses the last-window
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
    t.add_argument("--data", nargs="+", required=True, help="series files or directories (.csv .parquet .tsf)")
    t.add_argument("--out", required=True, help="run directory (config.json, metrics.jsonl, ckpt.pt)")
    t.add_argument("--resume", action="store_true", help="continue from <out>/ckpt.pt")
    t.add_argument("--quiet", action="store_true", help="no per-log-line output")
    add_set(t, "train.steps=50 or train.holdout=6")
    t.set_defaults(func=run_train)

    f = sub.add_parser("forecast", help="forecast every series of a file", description="forecast H values per series")
    f.add_argument("--model", required=True, help="run directory written by train")
    f.add_argument("--data", nargs="+", required=True, help="series files or directories")
    g = f.add_mutually_exclusive_group(required=True)
    g.add_argument("--horizon", type=int, help="values to forecast")
    g.add_argument("--instruction", help='e.g. "forecast the next 96 steps" (the horizon predictor reads it)')
    f.add_argument("--sampling-rate-hz", type=float, default=None, help="converts durations in the instruction")
    f.add_argument("--out", required=True, help="FILE.csv or FILE.parquet")
    f.set_defaults(func=run_forecast)

    e = sub.add_parser("eval", help="score against seasonal naive, AutoETS, AutoARIMA", description=__doc__)
    e.add_argument("--model", required=True, help="run directory written by train ('none' = baselines only)")
    e.add_argument("--data", nargs="+", required=True, help="series files or directories")
    e.add_argument("--horizon", type=int, required=True, help="H: the last H points of each series are scored")
    e.add_argument("--season", type=int, default=None, help="MASE seasonal period (default: from the frequency)")
    e.add_argument("--baselines", default="AutoETS,AutoARIMA", help="comma list of statsforecast models; '' = none")
    e.add_argument("--json", default=None, help="also write the scores here")
    e.set_defaults(func=run_eval)


def read_files(paths: list[str], quarantine_dir: str | None):
    """Every series in the given files/directories; bad files go to ``quarantine_dir/series.jsonl``."""
    from formats.quarantine import write_quarantine
    from formats.series import is_series_file, read_series_file
    from pipelines.assembly.series import pandas_timestamps

    files: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            files += sorted(str(q) for q in Path(p).rglob("*") if q.is_file() and is_series_file(str(q)))
        else:
            files.append(p)
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


def _load(model_dir: str):
    from pretrain.timeseries.train import load_run

    try:
        return load_run(model_dir)[1]
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def run_forecast(args: argparse.Namespace) -> int:
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    from formats.fs import open_output
    from pretrain.timeseries.forecaster import forecast_many
    from pretrain.timeseries.horizon import predict_horizon

    model = _load(args.model)
    _, records, _ = read_files(args.data, os.path.dirname(os.path.abspath(args.out)))
    horizon = args.horizon
    if horizon is None:
        freq = records[0].freq if records else ""
        unit = {"yearly": "year", "monthly": "month", "daily": "day", "hourly": "hour", "weekly": "week"}.get(freq)
        horizon = predict_horizon(args.instruction, sampling_rate_hz=args.sampling_rate_hz, freq_unit=unit)
        if horizon is None:
            print(f"error: no horizon in {args.instruction!r} (a duration needs --sampling-rate-hz)", file=sys.stderr)
            return 2
    if horizon < 1:
        print("error: --horizon must be ≥ 1", file=sys.stderr)
        return 2
    levels = model.cfg.forecaster.quantiles
    cols: dict[str, list] = {"series_id": [], "channel": [], "step": [], "value": []}
    cols |= {f"q{lv:g}": [] for lv in levels}
    fcs = forecast_many(model, [np.asarray(r.values, dtype=np.float64) for r in records], horizon)
    for r, (point, quant) in zip(records, fcs):
        for c, ch in enumerate(r.channels):
            cols["series_id"] += [r.series_id] * horizon
            cols["channel"] += [ch] * horizon
            cols["step"] += list(range(1, horizon + 1))
            cols["value"] += point[c].tolist()
            for k, lv in enumerate(levels):
                cols[f"q{lv:g}"] += quant[c, :, k].tolist()
    table = pa.table(cols)
    with open_output(args.out) as f:
        if args.out.endswith(".parquet"):
            pq.write_table(table, f)
        else:
            pcsv.write_csv(table, f)
    print(json.dumps({"out": args.out, "series": len(records), "horizon": horizon, "rows": table.num_rows}))
    return 0


def run_eval(args: argparse.Namespace) -> int:
    import numpy as np

    from pretrain.timeseries.evaluate import evaluate

    model = None if args.model == "none" else _load(args.model)
    _, records, _ = read_files(args.data, None)
    h = args.horizon
    hist, act, seasons = [], [], []
    for r in records:
        for ch in r.values:
            a = np.asarray(ch, dtype=np.float64)
            if a.size > h and np.isfinite(a[-h:]).all():
                hist.append(a[:-h])
                act.append(a[-h:])
                seasons.append(r.season)
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
