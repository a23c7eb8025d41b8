"""Series files through the corpus and into pre-training, through the CLI only (issue 22 §3): ``scifolio build`` of
two small PDFs plus a directory of series files (a multichannel CSV with timestamps and a text context, a Monash
``.tsf``, a CSV whose timestamps do not parse, one file that must be quarantined) → shards holding series rows →
``scifolio pretrain --config debug`` trains the time-series lane beside the text model, its forecasting loss on the
held-out tails falling over the steps.

    .venv/bin/python -m pytest tests/test_series_chain.py -q      # ~1 min on 2 cores
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from tests.pipelines.pdfs import write_paper
from tests.test_chain import scifolio


def write_series_dir(folder: Path) -> dict[str, str]:
    """The series files and what must become of each: ``series`` (rows in the shards) or ``quarantine``."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = ["series_id,timestamp,channel,value,context"]
    for k in range(4):  # two channels with a fixed relation, hourly timestamps, the context on the first row
        for t in range(160):
            stamp = f"2024-01-{1 + t // 24:02d} {t % 24:02d}:00:00"
            x = math.sin(2 * math.pi * t / (12 + 4 * k) + k)
            ctx = f"reactor {k}: temperature and pressure every hour" if t == 0 else ""
            rows.append(f"r{k},{stamp},temperature,{20 + 3 * x:.4f},{ctx}")
            rows.append(f"r{k},{stamp},pressure,{1 + 0.1 * x:.5f},")
    (folder / "reactors.csv").write_text("\n".join(rows) + "\n")
    tsf = ["# Monthly output of three plants", "@relation plants", "@attribute series_name string"]
    tsf += ["@frequency monthly", "@horizon 6", "@missing false", "@equallength false", "@data"]
    for k in range(3):
        vals = [100 + 10 * math.sin(2 * math.pi * i / 12 + k) + 0.2 * i for i in range(120 - 10 * k)]
        tsf.append(f"P{k}:" + ",".join(f"{v:.3f}" for v in vals))
    (folder / "plants.tsf").write_text("\n".join(tsf) + "\n")
    (folder / "lab.csv").write_text(
        "series_id,timestamp,value\n" + "".join(f"q,run-{i},{math.cos(i / 3):.4f}\n" for i in range(90))
    )
    (folder / "notes.csv").write_text("series_id,value\na,high\nb,low\n")
    return {"reactors.csv": "series", "plants.tsf": "series", "lab.csv": "series", "notes.csv": "quarantine"}


@pytest.mark.slow
@pytest.mark.integration  # the deepspeed launcher
def test_build_series_then_pretrain_forecasting_loss_falls(tmp_path: Path):
    from formats.manifest import Manifest
    from formats.quarantine import iter_quarantine
    from formats.shards import ShardFile, list_shards

    tiny, out, inputs = tmp_path / "tiny", tmp_path / "out", tmp_path / "inputs"
    inputs.mkdir()
    write_paper(inputs / "a.pdf", n_pages=1, seed=1)
    write_paper(inputs / "b.pdf", n_pages=1, seed=2)
    expect = write_series_dir(inputs / "series")
    from pipelines.tiny import write_area, write_tiny_tokenizer

    write_area(tiny, "pretrain", write_tiny_tokenizer(tiny / "tokenizer"))  # what `scifolio models tiny` writes for it
    printed = scifolio(
        "build", str(inputs), "--out", str(out), "--tokenizer", str(tiny / "tokenizer"), "--backend", "pymupdf",
        "--max-tokens", "256", "--overlap", "16", "--no-progress", "--max-error-rate", "1",
    )  # fmt: skip

    # the manifest accounts for every file: 2 PDFs + 3 series files in the shards, the bad file quarantined
    m = Manifest.read(out)
    t = m.totals
    assert t.input_files == 6
    assert (t.documents_in_shards, t.documents_quarantined, t.documents_retryable) == (5, 1, 0)
    assert (t.series_files, t.series, t.series_files_quarantined) == (3, 8, 1)
    assert t.series_points == 4 * 2 * 160 + (120 + 110 + 100) + 90
    assert m.dropped_by_reason == {"series.non_numeric_values": 1}
    assert m.metrics.get("series_warnings.timestamp_row_order") == 1
    assert "series: 8" in printed
    dropped = list(iter_quarantine(out / "quarantine"))
    assert [(Path(d.detail["source"]).name, d.stage) for d in dropped] == [("notes.csv", "series")]

    # the shards hold one row per series, with its record and a series segment naming it
    records = {}
    for path in list_shards(out):
        for chunk in ShardFile(path).iter_chunks():
            for rec in chunk.series:
                records[rec.meta.get("name", rec.series_id)] = (rec, chunk)
    assert sorted(records) == ["P0", "P1", "P2", "q", "r0", "r1", "r2", "r3"]
    assert {Path(rec.source).name for rec, _ in records.values()} == {n for n, e in expect.items() if e == "series"}
    r0, row = records["r0"]
    assert r0.channels == ("pressure", "temperature") and r0.length == 160
    assert r0.sampling_period_s == 3600.0 and r0.context.startswith("reactor 0")
    assert [s.kind for s in row.segments] == ["text", "series"] and row.segments[1].series_id == r0.series_id
    mu, sigma = r0.stats()
    assert mu[1] == pytest.approx(np.mean(r0.values[1])) and sigma[1] == pytest.approx(np.std(r0.values[1]))
    p0, _ = records["P0"]
    assert p0.freq == "monthly" and p0.context == "Monthly output of three plants"
    assert records["q"][0].meta["warning"].startswith("timestamp column did not parse")

    # pre-training consumes them: the lane is on, ts_loss logged per step, falling
    run = tmp_path / "pretrain"
    scifolio(
        "pretrain", "--config", "debug", "--shards", str(out), "--models", str(tiny), "--max-steps", "45",
        "--out", str(run), "--set", "data.pages_per_batch=0", "--set", "objective.lambda_vis=0",
    )  # fmt: skip
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(1, 46))
    assert sum(r["ts_series"] for r in lines) >= 45  # about one series per step or more: the lane really ran
    ts = [(r["step"], r["ts_loss"]) for r in lines if r["ts_loss"] is not None]
    assert all(math.isfinite(v) for _, v in ts)
    first = [v for s, v in ts if s <= 15]
    last = [v for s, v in ts if s > 30]
    assert len(first) >= 5 and len(last) >= 5
    assert np.mean(last) < 0.8 * np.mean(first), (np.mean(first), np.mean(last), ts)
    assert all(math.isfinite(r["l_text"]) for r in lines)
