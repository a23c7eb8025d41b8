"""Last-window evaluation (SPEC C10 scoring): each series minus its last H points is the history, the last H points
are scored; the lane's model is compared with seasonal naive and statsforecast's AutoETS/AutoARIMA on the same
windows.

    from pretrain.timeseries.evaluate import evaluate
    report = evaluate(model, histories, actuals, horizon=6, season=1)
    print(report.table())

statsforecast is imported only when a classical baseline is asked for (numba compiles on first use, ~30 s).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from pretrain.timeseries.metrics import mase, seasonal_naive, smape, success, wql
from pretrain.timeseries.pretrained import forecast_any

LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


@dataclass
class Scores:
    """Mean MASE / sMAPE over series, WQL over the set, success rate (exactly H finite values)."""

    mase: float
    smape: float
    wql: float
    success: float
    n: int

    def row(self, name: str) -> str:
        return f"{name:<16} {self.mase:>8.3f} {self.wql:>8.3f} {self.smape:>8.2f} {100 * self.success:>8.1f}%"


@dataclass
class Report:
    horizon: int
    season: int
    scores: dict[str, Scores] = field(default_factory=dict)

    def table(self) -> str:
        head = f"{'method':<16} {'MASE':>8} {'WQL':>8} {'sMAPE':>8} {'success':>9}"
        lines = [f"last-window protocol: H={self.horizon}, season={self.season}", head]
        lines += [s.row(name) for name, s in self.scores.items()]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"horizon": self.horizon, "season": self.season} | {k: vars(v) for k, v in self.scores.items()}


def score(
    histories: Sequence[np.ndarray],
    actuals: Sequence[np.ndarray],
    points: Sequence[np.ndarray],
    quantiles: Sequence[np.ndarray] | None,
    horizon: int,
    season: int,
) -> Scores:
    """Scores of one method; a failed forecast (wrong length or non-finite) counts against success and is replaced
    by seasonal naive for the error metrics, so the error metrics stay comparable."""
    ok = [success(np.asarray(p), horizon) for p in points]
    pts = [p if good else seasonal_naive(h, horizon, season) for p, h, good in zip(points, histories, ok)]
    qs = quantiles if quantiles is not None else [np.repeat(np.asarray(p)[:, None], len(LEVELS), 1) for p in pts]
    qs = [q if good else np.repeat(p[:, None], len(LEVELS), 1) for q, p, good in zip(qs, pts, ok)]
    m = [mase(h, a, p, season) for h, a, p in zip(histories, actuals, pts)]
    return Scores(
        mase=float(np.nanmean(m)),
        smape=float(np.mean([smape(a, p) for a, p in zip(actuals, pts)])),
        wql=wql(actuals, qs, LEVELS),
        success=float(np.mean(ok)),
        n=len(points),
    )


def statsforecast_baseline(name: str, season: int) -> Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]:
    """``fit_predict(history, h) → (point [h], quantiles [h, 9])`` with statsforecast's AutoETS or AutoARIMA
    (quantiles from its 20/40/60/80 % prediction intervals)."""
    from statsforecast.models import AutoARIMA, AutoETS

    def fit_predict(y: np.ndarray, h: int) -> tuple[np.ndarray, np.ndarray]:
        y = np.asarray(y, dtype=np.float64)
        y = y[np.isfinite(y)]
        m = season if y.size >= 2 * season else 1
        # R's auto.arima default: approximate the likelihood for long or high-frequency series (a seasonal ARIMA
        # with m = 48 on 2,048 points otherwise takes minutes per fit)
        approx = y.size > 150 or m > 12
        model = AutoETS(season_length=m) if name == "AutoETS" else AutoARIMA(season_length=m, approximation=approx)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = model.forecast(y=y, h=h, level=[20, 40, 60, 80])
        mean = np.asarray(out["mean"], dtype=np.float64)
        cols = [f"lo-{lv}" for lv in (80, 60, 40, 20)] + ["mean"] + [f"hi-{lv}" for lv in (20, 40, 60, 80)]
        return mean, np.stack([np.asarray(out[c], dtype=np.float64) for c in cols], axis=1)

    return fit_predict


def evaluate(
    model,  # SeriesForecastModel, the default PatchForecaster, or None (baselines only)
    histories: Sequence[np.ndarray],
    actuals: Sequence[np.ndarray],
    horizon: int,
    season: int = 1,
    baselines: Sequence[str] = ("AutoETS", "AutoARIMA"),
) -> Report:
    """The lane's model next to seasonal naive and the classical baselines on the same last windows."""
    report = Report(horizon, season)
    if model is not None:
        points, quants = forecast_any(model, histories, horizon)
        report.scores["scifolio"] = score(histories, actuals, points, quants, horizon, season)
    naive = [seasonal_naive(h, horizon, season) for h in histories]
    report.scores["seasonal naive"] = score(histories, actuals, naive, None, horizon, season)
    for name in baselines:
        fit = statsforecast_baseline(name, season)
        pq = [fit(h, horizon) for h in histories]
        report.scores[name] = score(histories, actuals, [p for p, _ in pq], [q for _, q in pq], horizon, season)
    return report
