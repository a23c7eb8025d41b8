"""The forecast contract and the shipped default model (issue 36), through ``scifolio timeseries forecast`` with no
``--model``: the user's ids, column names and continuing timestamps back; a duplicate id across two files refused;
a 4x-trained-horizon sine forecast in range; perturbed shipped weights change the forecast.

.venv/bin/python -m pytest tests/pretrain/timeseries/test_default_forecast.py -q
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from pipelines.cli import main
from pretrain.timeseries import pretrained
from pretrain.timeseries.pretrained import load_default, predict, save

pytestmark = pytest.mark.usefixtures("one_torch_thread")
Q = [f"q0.{i}" for i in range(1, 10)]


def _monthly_csv(path, ids=("007", "a:b"), names=("unique_id", "ds", "y"), fmt="%b %Y", n=40):
    rows = []
    for k, sid in enumerate(ids):
        for t, d in enumerate(pd.date_range("2019-01-01", periods=n, freq="MS")):
            rows.append((sid, d.strftime(fmt), 100 + 10 * k + 5 * np.sin(2 * np.pi * t / 12) + 0.3 * t))
    pd.DataFrame(rows, columns=list(names)).to_csv(path, index=False)
    return path


def test_default_keeps_ids_columns_and_continues_timestamps(tmp_path):
    src = _monthly_csv(tmp_path / "in.csv")  # "Jan 2019" dates, ids that look like a number and a file:id
    out = tmp_path / "fc.csv"
    assert main(["timeseries", "forecast", "--data", str(src), "--horizon", "5", "--out", str(out)]) == 0
    fc = pd.read_csv(out, dtype={"unique_id": str})
    assert list(fc.columns) == ["unique_id", "ds", "y", *Q]
    assert sorted(set(fc["unique_id"])) == ["007", "a:b"]
    first = fc[fc["unique_id"] == "007"]
    assert first["ds"].tolist() == ["2022-05-01", "2022-06-01", "2022-07-01", "2022-08-01", "2022-09-01"]
    qs = first[Q].to_numpy()
    assert np.isfinite(qs).all() and (np.diff(qs, axis=1) >= 0).all()
    assert np.allclose(first["y"], first["q0.5"])


def test_channels_hourly_and_integer_times(tmp_path):
    t = pd.date_range("2024-03-01 00:00", periods=60, freq="h")
    rows = [("s1", ch, d.isoformat(), float(i + (ch == "b"))) for ch in "ab" for i, d in enumerate(t)]
    pd.DataFrame(rows, columns=["series_id", "channel", "timestamp", "value"]).to_csv(tmp_path / "h.csv", index=False)
    out = tmp_path / "fc.parquet"
    assert main(["timeseries", "forecast", "--data", str(tmp_path / "h.csv"), "--horizon", "3", "--out", str(out)]) == 0
    fc = pd.read_parquet(out)
    assert list(fc.columns) == ["series_id", "channel", "timestamp", "value", *Q]
    assert fc["timestamp"].iloc[:3].tolist() == list(pd.date_range("2024-03-03 12:00", periods=3, freq="h"))
    # integer times continue as integers; no time column gives a step index
    pd.DataFrame({"series_id": ["x"] * 30, "timestamp": range(10, 70, 2), "value": range(30)}).to_csv(
        tmp_path / "i.csv", index=False
    )
    pd.DataFrame({"value": np.arange(30.0)}).to_csv(tmp_path / "s.csv", index=False)
    for name, col, want in [("i", "timestamp", [70, 72]), ("s", "step", [1, 2])]:
        out = tmp_path / f"{name}_fc.csv"
        assert main(["timeseries", "forecast", "--data", str(tmp_path / f"{name}.csv"), "--horizon", "2",
                     "--out", str(out)]) == 0  # fmt: skip
        assert pd.read_csv(out)[col].tolist() == want


def test_duplicate_id_across_files_is_refused(tmp_path, capsys):
    a = _monthly_csv(tmp_path / "a.csv", ids=("x", "y"))
    b = _monthly_csv(tmp_path / "b.csv", ids=("y",))
    with pytest.raises(SystemExit) as rc:
        main(["timeseries", "forecast", "--data", str(a), str(b), "--horizon", "3", "--out", str(tmp_path / "o.csv")])
    err = capsys.readouterr().err
    assert rc.value.code == 2 and "'y'" in err and str(a) in err and str(b) in err
    assert not (tmp_path / "o.csv").exists()


def test_gaps_irregular_and_too_long_horizons(tmp_path, capsys):
    d = pd.date_range("2020-01-01", periods=30, freq="D")
    keep = np.r_[0:10, 12:30]  # two missing days: inserted as NaN on the daily grid
    pd.DataFrame({"series_id": "g", "timestamp": d[keep].strftime("%d/%m/%Y"), "value": keep * 1.0}).to_csv(
        tmp_path / "gaps.csv", index=False
    )
    irregular = pd.to_datetime(["2020-01-01", "2020-01-02", "2020-01-05", "2020-01-06 07:00"], format="mixed")
    pd.DataFrame({"series_id": "r", "timestamp": irregular, "value": [1.0, 2, 3, 4]}).to_csv(
        tmp_path / "irr.csv", index=False
    )
    out = tmp_path / "fc.csv"
    assert main(["timeseries", "forecast", "--data", str(tmp_path), "--horizon", "2", "--out", str(out)]) == 0
    fc = pd.read_csv(out)
    assert set(fc["series_id"]) == {"g"} and fc["timestamp"].tolist() == ["2020-01-31", "2020-02-01"]
    q = [json.loads(x) for x in (tmp_path / "quarantine" / "series.jsonl").read_text().splitlines()]
    assert [(r["item_id"].endswith("irr.csv"), r["reason"]) for r in q] == [(True, "irregular_timestamps")]
    limit = load_default().cfg.max_horizon
    rc = main(["timeseries", "forecast", "--data", str(tmp_path / "gaps.csv"), "--horizon", str(limit + 1),
               "--out", str(tmp_path / "long.csv")])  # fmt: skip
    assert rc == 2 and f"1..{limit}" in capsys.readouterr().err


def test_four_times_trained_horizon_sine_stays_in_range():
    model = load_default()
    h = 4 * model.cfg.horizon
    t = np.arange(600 + h)
    x = 50 + 10 * np.sin(2 * np.pi * t / 24)
    point, quant = predict(model, [x[:600]], h)
    assert point.shape == (1, h) and np.isfinite(quant).all()
    assert point.min() >= 50 - 10 * 1.2 and point.max() <= 50 + 10 * 1.2  # no runaway, no collapse past the range
    assert np.ptp(point[0, -24:]) > 10  # the last day still oscillates
    assert np.mean(np.abs(point[0] - x[600:])) < 2.5  # and tracks the continuation (MAE < 12.5 % of the amplitude)


def test_perturbed_shipped_weights_change_the_cli_forecast(tmp_path, monkeypatch):
    src = _monthly_csv(tmp_path / "in.csv")
    outs = []
    for name in ("shipped", "perturbed"):
        if name == "perturbed":
            model = load_default()
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.05 * torch.randn_like(p))
            save(model, tmp_path / "perturbed.pt")
            monkeypatch.setattr(pretrained, "DEFAULT_WEIGHTS", tmp_path / "perturbed.pt")
        out = tmp_path / f"{name}.csv"
        assert main(["timeseries", "forecast", "--data", str(src), "--horizon", "4", "--out", str(out)]) == 0
        outs.append(pd.read_csv(out)["y"].to_numpy())
    assert np.abs(outs[0] - outs[1]).max() > 1e-3


def test_finetune_from_default(tmp_path):
    src = _monthly_csv(tmp_path / "in.csv", names=("series_id", "timestamp", "value"), fmt="%Y-%m-%d", n=120)
    run = tmp_path / "ft"
    argv = ["timeseries", "train", "--init", "default", "--data", str(src), "--out", str(run), "--quiet"]
    assert main([*argv, "--set", "steps=4", "--set", "batch=8", "--set", "lr=1e-2"]) == 0
    assert json.loads((run / "config.json").read_text())["kind"] == "pretrained"
    outs = []
    for model in ([], ["--model", str(run)]):
        out = tmp_path / f"fc{len(model)}.csv"
        assert main(["timeseries", "forecast", *model, "--data", str(src), "--horizon", "6", "--out", str(out)]) == 0
        outs.append(pd.read_csv(out)["value"].to_numpy())
    assert outs[0].shape == outs[1].shape == (12,) and np.abs(outs[0] - outs[1]).max() > 1e-6


def test_corpus_sources_exclude_the_reserved_packages():
    import inspect

    from pretrain.timeseries import corpus

    x = corpus.kernel_synth(np.random.default_rng(0), length=128)
    assert x.shape == (128,) and np.isfinite(x).all()
    # the corpus module reads aeon's zip and statsmodels only (real_series also asserts it on what it read)
    code = inspect.getsource(corpus).split("RESERVED = ")[0] + inspect.getsource(corpus._statsmodels)
    assert "import pmdarima" not in code and "vega_datasets" not in code
    assert corpus.source_group("aeon:Lynx/Lynx.csv:0") == "aeon:Lynx"


def test_ambiguous_day_month_dates_take_the_regular_reading():
    from pretrain.timeseries.tables import parse_times

    days = pd.Series([d.strftime("%d/%m/%Y") for d in pd.date_range("2021-01-01", periods=14, freq="MS")])
    assert parse_times(days, "x.csv").tolist() == list(pd.date_range("2021-01-01", periods=14, freq="MS"))


def test_validation_tails_are_cut_from_training_and_never_reserved():
    # every validation set is a training source (never pmdarima / vega-datasets) and its scored tail is removed from
    # the series the pre-training sees
    from pretrain.timeseries.corpus import RESERVED

    sources, series = [], []
    for _, key, h, season, n_win in pretrained.VALIDATION:
        assert not any(r in key for r in RESERVED)
        sources.append(key + ("x" if key.endswith(":") else ""))
        series.append(np.arange(n_win * h + 2 * max(season, h) + 10, dtype=float))
    sources.append("aeon:Lynx/Lynx.csv:0")
    series.append(np.arange(50, dtype=float))
    train, tasks = pretrained.split_validation(series, sources)
    assert len(tasks) == len(pretrained.VALIDATION)
    for (_, h, _, hists, acts), s, kept in zip(tasks, series, train):
        assert all(a.size == h for a in acts) and acts[-1][-1] == s[-1]
        assert kept.size == hists[0].size and kept[-1] < acts[0][0]  # the scored points are not in training
    assert train[-1].size == 50


def _periods(rows):
    z, obs, _, _ = pretrained.normalise(pretrained.left_pad(rows, 512), 512)
    return pretrained.detect_period(torch.from_numpy(z).float(), torch.from_numpy(obs).float()).tolist()


def test_seasonal_path_detects_periods_and_starts_as_the_model_it_extends():
    rng = np.random.default_rng(0)
    t = np.arange(512)
    day = np.sin(2 * np.pi * t / 24)
    # a noisy daily cycle, the same on a trend, a short monthly season: the period; a random walk and white noise: 1
    assert _periods([day + 0.3 * rng.standard_normal(512), day + 0.05 * t, np.sin(2 * np.pi * t[:40] / 12)]) == [
        24, 24, 12]  # fmt: skip
    assert _periods([np.cumsum(rng.standard_normal(512)) for _ in range(8)] + [rng.standard_normal(512)]) == [1] * 9
    z = torch.arange(10.0)[None].repeat(2, 1)
    assert pretrained.seasonal_continuation(z, torch.tensor([3, 1]), 5).tolist() == [[7, 8, 9, 7, 8], [9] * 5]
    # the path added to a model without it computes what that model computed until it is trained
    torch.manual_seed(0)
    old = pretrained.PatchForecaster(pretrained.PatchConfig(d_model=16, layers=1))
    new = old.add_seasonal_path()
    series = [day[:300] * 5 + 20, np.cumsum(rng.standard_normal(200))]
    assert new.cfg.seasonal and not old.cfg.seasonal
    assert np.array_equal(predict(old, series, 24)[1], predict(new, series, 24)[1])


def test_profile_windows_are_finite_cycles_whose_period_is_found():
    from pretrain.timeseries import corpus

    rng = np.random.default_rng(0)
    xs = [corpus.profile_synth(rng) for _ in range(64)]
    assert all(x.shape == (1024,) and np.isfinite(x).all() and x.std() > 0 for x in xs)
    # detect_period finds a cycle (a period > 1) in most generated series
    found = _periods([x[-512:] for x in xs])
    assert np.mean([p > 1 for p in found]) >= 0.8
    # FitConfig.profile = 1: every window is cut from a fresh generated series
    cfg = pretrained.PatchConfig(d_model=16, layers=1)
    data = pretrained.Windows([np.arange(600.0)], ["aeon:Lynx/Lynx.csv:0"], cfg,
                              pretrained.FitConfig(batch=8, profile=1.0))  # fmt: skip
    z, obs, y = data.batch()
    assert z.shape == (8, 512) and torch.isfinite(z).all() and (obs.sum(1) >= 8).all() and torch.isfinite(y).any()
