"""SPEC C10 forecaster claims: affine equivariance, exactly H finite values for any H (success 100 %), a fixed-size
condition whatever the prompt length, and the run directory (train, checkpoint, resume).

    .venv/bin/python -m pytest tests/pretrain/timeseries/test_forecaster.py -q
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import torch

from pretrain.timeseries.config import debug
from pretrain.timeseries.forecaster import SeriesForecastModel, pad_batch
from pretrain.timeseries.horizon import generate_instructions
from pretrain.timeseries.metrics import success

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model() -> SeriesForecastModel:
    torch.manual_seed(0)
    return SeriesForecastModel(debug()).eval()


def _real_or_synthetic() -> list[np.ndarray]:
    from pretrain.timeseries.datasets import airline, available, m1_yearly

    if available():
        return [np.asarray(airline().values[0])] + [np.asarray(r.values[0]) for r in m1_yearly()[:5]]
    t = np.arange(144)
    return [100 + 50 * np.sin(2 * np.pi * t / 12) + t, np.cumsum(np.random.default_rng(0).normal(size=40)) + 10]


@pytest.mark.parametrize("a,b", [(3.0, -7.0), (0.001, 1e4), (250.0, 0.5)])
def test_affine_equivariance(model, a, b):
    xs = _real_or_synthetic()
    base = model.forecast(xs, horizon=12)
    moved = model.forecast([a * x + b for x in xs], horizon=12)
    np.testing.assert_allclose(moved.point, a * base.point + b, rtol=1e-4)
    np.testing.assert_allclose(moved.quantiles, a * base.quantiles + b, rtol=1e-4)


@pytest.mark.parametrize("h", [1, 5, 6, 7, 13, 97, 400])
def test_exactly_h_finite_values(model, h):
    xs = _real_or_synthetic()
    fc = model.forecast(xs, horizon=h)
    assert fc.point.shape == (len(xs), 1, h) and fc.quantiles.shape == (len(xs), 1, h, 9)
    assert all(success(p[0], h) for p in fc.point)
    assert (np.diff(fc.quantiles, axis=-1) >= 0).all()


def test_success_rate_100_percent_on_instructions_and_hostile_inputs(model):
    rng = np.random.default_rng(1)
    hostile = [
        rng.normal(size=(3, 200)),
        np.full(30, 5.0),  # constant
        np.array([np.nan, 1.0, np.nan, 2.0, np.inf, 3.0]),
        np.array([7.0]),
        np.full((2, 10), np.nan),  # nothing observed
        np.array([1e30, -1e30, 1e30]),
        np.array([1e300, -1e300] * 10),  # squares overflow float64: normalise must not
    ]
    # Horizons up to 120 keep the test fast (decoding is one causal pass per 6 values); test_exactly_h_finite_values
    # covers H = 400.
    data = [d for d in generate_instructions(200, seed=7) if d[2] <= 120][:30]
    assert len(data) == 30
    ok = 0
    for text, kwargs, h in data:
        fc = model.forecast(hostile, instruction=text, **kwargs)
        ok += all(success(fc.point[i, c], h) for i in range(len(hostile)) for c in range(fc.point.shape[1]))
    assert ok == len(data)


def test_condition_has_fixed_size_whatever_the_prompt(model):
    x = pad_batch([np.sin(np.arange(100) / 5)])
    enc = model.encoder(x)
    sizes = set()
    for n in (1, 10, 300):
        states = torch.randn(1, n, model.cfg.encoder.llm_dim)
        sizes.add(tuple(model.forecaster.condition(enc, states, torch.ones(1, n, dtype=torch.bool)).shape))
    sizes.add(tuple(model.forecaster.condition(enc, None, None).shape))
    assert sizes == {(1, 4 + 8, 32)}


def test_train_checkpoint_resume(tmp_path):
    from formats.series import SeriesRecord
    from pretrain.timeseries.train import load_run, train

    t = np.arange(60)
    recs = [SeriesRecord(str(i), ((10 + i + np.sin(t / 3 + i)).tolist(),), ("value",), "mem") for i in range(8)]
    cfg = debug(**{"train.steps": 6, "train.batch": 8, "train.save_every": 3, "train.log_every": 1, "train.holdout": 6})
    train(cfg, recs, tmp_path / "run")
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3, 4, 5, 6]
    assert json.loads((tmp_path / "run" / "config.json").read_text())["train"]["steps"] == 6
    assert (tmp_path / "run" / "tb").is_dir() or importlib.util.find_spec("tensorboard") is None

    # resume to 9 steps: continues from step 6, the log keeps one line per step
    cfg = debug(**{"train.steps": 9, "train.batch": 8, "train.log_every": 1})
    last = train(cfg, recs, tmp_path / "run", resume=True)
    assert last["step"] == 9
    steps = [json.loads(x)["step"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 10))
    cfg2, model = load_run(tmp_path / "run")
    assert cfg2.train.steps == 9 and success(model.forecast([recs[0].values[0]], horizon=6).point[0, 0], 6)


def test_loss_falls_when_training(tmp_path):
    from formats.series import SeriesRecord
    from pretrain.timeseries.train import train

    t = np.arange(80)
    recs = [SeriesRecord(str(i), ((np.sin(t / 2 + i) * (i + 1)).tolist(),), ("value",), "mem") for i in range(6)]
    train(debug(**{"train.steps": 40, "train.batch": 16, "train.log_every": 10}), recs, tmp_path / "run")
    losses = [json.loads(x)["loss"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert losses[-1] < 0.7 * losses[0], losses


def test_forecast_many_batches_by_length_and_keeps_order(model):
    from pretrain.timeseries.forecaster import forecast_many

    rng = np.random.default_rng(3)
    xs = [rng.normal(size=n) + 5 for n in (300, 12, 3000, 40)] + [rng.normal(size=(2, 50))]
    many = forecast_many(model, xs, horizon=6, max_points=4000)  # forces several batches
    for x, (point, quant) in zip(xs, many):
        single = model.forecast([x], horizon=6)
        c = np.atleast_2d(x).shape[0]
        assert point.shape == (c, 6) and quant.shape == (c, 6, 9)
        np.testing.assert_allclose(point, single.point[0, :c], rtol=1e-5, atol=1e-6)
