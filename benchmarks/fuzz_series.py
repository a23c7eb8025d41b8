"""Hostile series files through ``scifolio build`` and ``scifolio timeseries forecast`` (issue 22 §6): NaN, inf,
constant, empty, header-only, non-numeric, ragged-channel, broken .tsf/parquet files and one 10⁷-point series.
Every file must be accounted for — by the build: rows in the shards (its content id among the shards' doc ids) or a
quarantine line naming it; by the forecast: series in the forecast or a quarantine line — nothing may crash, and
the peak RSS of each is reported (the build runs as its own process, so its peak is its own; the 10⁷-point series
is encoded in chunks: memory bounded by the encoder's ``chunk_points``).

    .venv/bin/python benchmarks/fuzz_series.py                  # ~3-6 min on 2 cores, peak RSS printed
    .venv/bin/python benchmarks/fuzz_series.py --big 1000000    # a smaller long series
    .venv/bin/python benchmarks/fuzz_series.py --skip-forecast  # the build only

The build and the forecast differ on one file on purpose: timestamps that parse as no date keep row order in the
build (a warning in the record's meta) but are refused by the forecast contract (issue 36), which must return
timestamps continuing the input's. A series with no finite value is quarantined by both.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def write_hostile(d: Path, big: int) -> dict[str, str]:
    """The files and what should happen to each: ``series`` (read, forecast) or ``quarantine``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    files = {
        "nan.csv": ("series_id,value\n" + "".join(f"a,{'nan' if i % 3 else i}\n" for i in range(50)), "series"),
        "all_nan.csv": ("series_id,value\n" + "n,nan\n" * 20, "quarantine"),
        "inf.csv": ("series_id,value\n" + "".join(f"i,{'inf' if i % 7 == 0 else i}\n" for i in range(40)), "series"),
        "constant.csv": ("series_id,value\n" + "c,5\n" * 30, "series"),
        "huge.csv": ("series_id,value\n" + "".join(f"h,{(-1) ** i * 1e300}\n" for i in range(30)), "series"),
        "one_point.csv": ("series_id,value\np,1.5\n", "series"),
        "ragged.csv": (
            "series_id,channel,value\n" + "".join(f"r,x,{i}\n" for i in range(60)) + "".join(f"r,y,{i}\n" for i in range(7)),
            "series",
        ),
        "bad_timestamps.csv": ("series_id,timestamp,value\n" + "".join(f"t,notadate{i},{i}\n" for i in range(20)), "series"),
        "empty.csv": ("", "quarantine"),
        "header_only.csv": ("series_id,value\n", "quarantine"),
        "words.csv": ("series_id,value\na,hello\n", "quarantine"),
        "no_value.csv": ("series_id,x\na,1\n", "quarantine"),
        "garbage.tsf": ("this is not a tsf\n", "quarantine"),
        "broken.parquet": ("PAR1 but not really", "quarantine"),
        "binary.csv": ("\x00\x01\x02\xff" * 100, "quarantine"),
    }  # fmt: skip
    expect = {}
    for name, (text, what) in files.items():
        (d / name).write_text(text, errors="surrogateescape")
        expect[name] = what
    t = np.arange(big)
    big_values = np.sin(t / 50.0) + 0.01 * rng.normal(size=big)
    big_values[::1000] = np.nan
    pq.write_table(pa.table({"series_id": np.zeros(big, dtype=np.int64), "value": big_values}), d / "big.parquet")
    expect["big.parquet"] = "series"
    return expect


# No finite value: nothing for the corpus to train on and nothing to forecast from (both quarantine it). Timestamps
# that parse as no date: the build keeps row order with a warning; the forecast contract (issue 36) refuses them,
# since it must return timestamps that continue the input's.
BUILD_DIFFERS: dict[str, str] = {}
FORECAST_DIFFERS = {"bad_timestamps.csv": "quarantine"}


def fuzz_build(d: Path, tmp: Path, expect: dict[str, str]) -> bool:
    """``scifolio build`` over the hostile folder in a child process; every file in the shards or quarantined."""
    from formats.manifest import Manifest
    from formats.quarantine import iter_quarantine
    from formats.shards import ShardFile, list_shards
    from pipelines.tiny import write_tiny_tokenizer

    tok = write_tiny_tokenizer(tmp / "tokenizer")
    out = tmp / "build"
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "pipelines.cli", "build", str(d), "--out", str(out), "--tokenizer", str(tok)]
    cmd += ["--no-progress", "--max-error-rate", "1"]
    t0 = time.time()
    r = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    elapsed = time.time() - t0
    build_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    if r.returncode != 0:
        print(f"build rc={r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
        return False
    in_shards = set().union(*(ShardFile(p).doc_ids() for p in list_shards(out)))
    quarantined = {Path(q.detail.get("source", q.item_id)).name: q.reason for q in iter_quarantine(out / "quarantine")}
    t = Manifest.read(out).totals
    ok = True
    print(f"build rc=0 in {elapsed:.1f} s; peak RSS of the build process {build_rss:.0f} MiB")
    for name in sorted(expect):
        want = BUILD_DIFFERS.get(name, expect[name])
        doc_id = hashlib.sha256((d / name).read_bytes()).hexdigest()
        got = "series" if doc_id in in_shards else ("quarantine" if name in quarantined else "LOST")
        ok &= got == want
        flag = "ok" if got == want else "MISMATCH"
        print(f"  {name:<20} expected {want:<10} got {got:<10} {quarantined.get(name, ''):<20} {flag}")
    accounted = t.documents_in_shards + t.documents_quarantined + t.documents_retryable
    print(
        f"build manifest: {t.input_files} files = {t.documents_in_shards} in shards + {t.documents_quarantined} "
        f"quarantined + {t.documents_retryable} retryable; {t.series} series, {t.series_points:,} points"
    )
    return ok and accounted == t.input_files == len(expect) and t.documents_retryable == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--big", type=int, default=10_000_000, help="points in the long series")
    ap.add_argument("--skip-forecast", action="store_true", help="run the build pass only")
    args = ap.parse_args()
    import pyarrow.csv as pcsv
    import torch

    from pipelines.cli import main as cli

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "data"
        d.mkdir()
        expect = write_hostile(d, args.big)
        build_ok = fuzz_build(d, Path(tmp), expect)
        if args.skip_forecast:
            print("PASS" if build_ok else "FAIL")
            return 0 if build_ok else 1
        train_dir = Path(tmp) / "train"
        train_dir.mkdir()
        (train_dir / "ok.csv").write_text(
            "series_id,value\n" + "".join(f"s{i % 4},{np.sin(i / 5) * (1 + i % 4)}\n" for i in range(400))
        )
        run = Path(tmp) / "run"
        sets = ["--set", "train.steps=5", "--set", "train.batch=8"]
        assert cli(["timeseries", "train", "--data", str(train_dir), "--out", str(run), "--quiet", *sets]) == 0
        out = Path(tmp) / "out" / "fc.csv"
        t0 = time.time()
        rc = cli(
            ["timeseries", "forecast", "--model", str(run), "--data", str(d), "--horizon", "24", "--out", str(out)]
        )
        elapsed = time.time() - t0
        fc = pcsv.read_csv(out).to_pydict()
        q = out.parent / "quarantine" / "series.jsonl"
        quarantined = {
            Path(json.loads(line)["item_id"]).name: json.loads(line)["reason"] for line in q.read_text().splitlines()
        }
        from formats.series import read_series_file

        got = {}
        expect = {n: FORECAST_DIFFERS.get(n, w) for n, w in expect.items()}
        for name in expect:
            recs, _ = read_series_file(d / name)
            ids = {str(r.meta.get("name", r.series_id)) for r in recs}  # the forecast writes the ids verbatim
            got[name] = (
                "series"
                if ids and ids <= {str(x) for x in fc["series_id"]}
                else ("quarantine" if name in quarantined else "LOST")
            )
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # this process: the forecast (not the build)
    values = np.asarray(fc["value"], dtype=np.float64)
    print(f"forecast rc={rc} in {elapsed:.1f} s; {len(expect)} files, long series {args.big:,} points")
    for name in expect:
        flag = "ok" if got[name] == expect[name] else "MISMATCH"
        print(f"  {name:<20} expected {expect[name]:<10} got {got[name]:<10} {quarantined.get(name, ''):<20} {flag}")
    print(f"forecast rows {len(values)}, finite {np.isfinite(values).mean():.3f}; peak RSS {rss_mib:.0f} MiB")
    ok = build_ok and rc == 0 and all(got[n] == expect[n] for n in expect) and np.isfinite(values).all()
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
