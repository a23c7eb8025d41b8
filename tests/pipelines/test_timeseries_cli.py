"""``scifolio timeseries train | forecast | eval`` end to end on small files (the debug recipe shortened with --set).

.venv/bin/python -m pytest tests/pipelines/test_timeseries_cli.py -q
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from pipelines.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("series")
    rng = np.random.default_rng(0)
    lines = ["series_id,timestamp,value"]
    for s in range(6):
        for t in range(48):
            v = 100 + 10 * s + 20 * np.sin(2 * np.pi * t / 12) + t + rng.normal()
            lines.append(f"s{s},{2020 + t // 12}-{1 + t % 12:02d}-01,{v:.3f}")
    (d / "monthly.csv").write_text("\n".join(lines) + "\n")
    (d / "bad.csv").write_text("series_id,oops\na,1\n")
    return d


@pytest.fixture(scope="module")
def run(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "ts"
    sets = [
        "--set",
        "train.steps=8",
        "--set",
        "train.batch=8",
        "--set",
        "train.save_every=4",
        "--set",
        "train.log_every=2",
    ]
    assert (
        main(["timeseries", "train", "--config", "debug", "--data", str(data), "--out", str(out), "--quiet", *sets])
        == 0
    )
    return out


def test_train_writes_run_dir_and_quarantine(run):
    assert {"config.json", "metrics.jsonl", "ckpt.pt", "data.json"} <= {p.name for p in run.iterdir()}
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [2, 4, 6, 8]
    q = (run / "quarantine" / "series.jsonl").read_text()
    assert "no_value_column" in q and "bad.csv" in q
    assert json.loads((run / "data.json").read_text())["series"] == 6


def test_resume_continues(run, data):
    args = ["timeseries", "train", "--data", str(data), "--out", str(run), "--resume", "--quiet"]
    assert main([*args, "--set", "train.steps=10", "--set", "train.batch=8", "--set", "train.log_every=2"]) == 0
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [2, 4, 6, 8, 10]


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_forecast_long_format(run, data, tmp_path, suffix):
    out = tmp_path / f"fc.{suffix}"
    assert main(["timeseries", "forecast", "--model", str(run), "--data", str(data / "monthly.csv"),
                 "--horizon", "7", "--out", str(out)]) == 0  # fmt: skip
    t = pq.read_table(out) if suffix == "parquet" else pcsv.read_csv(out)
    assert t.column_names == ["series_id", "timestamp", "value"] + [f"q0.{i}" for i in range(1, 10)]
    assert t.num_rows == 6 * 7 and t["series_id"].to_pylist()[:7] == ["s0"] * 7
    stamps = [str(x)[:10] for x in t["timestamp"].to_pylist()[:3]]  # the input's months continue after 2023-12
    assert stamps == ["2024-01-01", "2024-02-01", "2024-03-01"]
    assert np.isfinite(np.asarray(t["value"].to_pylist())).all()


def test_forecast_from_instruction(run, data, tmp_path):
    out = tmp_path / "fc.csv"
    assert main(["timeseries", "forecast", "--model", str(run), "--data", str(data / "monthly.csv"),
                 "--instruction", "predict the next two hours", "--sampling-rate-hz", str(1 / 600),
                 "--out", str(out)]) == 0  # fmt: skip
    assert pcsv.read_csv(out).num_rows == 6 * 12


def test_eval_prints_scores_next_to_seasonal_naive(run, data, tmp_path, capsys):
    js = tmp_path / "scores.json"
    argv = ["timeseries", "eval", "--model", str(run), "--data", str(data / "monthly.csv"), "--horizon", "6",
            "--season", "12", "--baselines", "", "--json", str(js)]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "MASE" in text and "seasonal naive" in text and "scifolio" in text
    scores = json.loads(js.read_text())
    assert scores["scifolio"]["success"] == 1.0 and scores["scifolio"]["n"] == 6 and scores["season"] == 12


@pytest.mark.slow
def test_eval_with_statsforecast_baselines(run, data, capsys):
    pytest.importorskip("statsforecast")
    argv = ["timeseries", "eval", "--model", str(run), "--data", str(data / "monthly.csv"), "--horizon", "6"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "AutoETS" in out and "AutoARIMA" in out


def test_bad_set_key_exits_2(data, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["timeseries", "train", "--data", str(data), "--out", str(tmp_path / "r"), "--set", "train.nope=1"])
    assert e.value.code == 2
