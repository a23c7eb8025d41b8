"""Forecast scores (SPEC C10; pure numpy): MASE with the data's seasonal period, sMAPE, WQL, success rate, and the
seasonal-naive baseline — all on the last-window protocol (train on a series minus its last H points, score them).

    from pretrain.timeseries.metrics import mase, seasonal_naive
    mase(history, actual, forecast, season=1)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def seasonal_naive(history: np.ndarray, horizon: int, season: int = 1) -> np.ndarray:
    """Repeat the last season of ``history`` (the last value when season = 1 or the series is shorter)."""
    h = np.asarray(history, dtype=np.float64)
    h = h[np.isfinite(h)]
    if h.size == 0:
        return np.zeros(horizon)
    m = season if h.size >= season else 1
    last = h[-m:]
    return np.array([last[i % m] for i in range(horizon)])


def mase(history: np.ndarray, actual: np.ndarray, forecast: np.ndarray, season: int = 1) -> float:
    """Mean absolute error over the in-sample seasonal-naive MAE (Hyndman & Koehler); the scale uses the training
    part only. Falls back to season 1 when the history is no longer than the season (Monash/GluonTS convention)."""
    h = np.asarray(history, dtype=np.float64)
    h = h[np.isfinite(h)]
    m = season if h.size > season else 1
    scale = np.mean(np.abs(h[m:] - h[:-m])) if h.size > m else np.nan
    err = np.mean(np.abs(np.asarray(actual, dtype=np.float64) - np.asarray(forecast, dtype=np.float64)))
    return float(err / scale) if scale and np.isfinite(scale) and scale > 0 else float("nan")


def smape(actual: np.ndarray, forecast: np.ndarray) -> float:
    """Symmetric MAPE in percent (0–200), 0/0 terms count 0."""
    a, f = np.asarray(actual, dtype=np.float64), np.asarray(forecast, dtype=np.float64)
    den = np.abs(a) + np.abs(f)
    term = np.where(den > 0, 2 * np.abs(f - a) / np.where(den > 0, den, 1), 0.0)
    return float(100 * term.mean())


def wql(actuals: Sequence[np.ndarray], quantiles: Sequence[np.ndarray], levels: Sequence[float]) -> float:
    """Weighted quantile loss over a set of series: Σ 2·pinball / Σ|y|, averaged over the quantile levels.
    ``quantiles[i]`` is ``[H, K]``; a point forecast given as ``[H, 1]`` with level 0.5 is scored as its median."""
    lv = np.asarray(levels, dtype=np.float64)
    num, den = np.zeros(len(lv)), 0.0
    for y, q in zip(actuals, quantiles):
        y = np.asarray(y, dtype=np.float64)
        diff = y[:, None] - np.asarray(q, dtype=np.float64)
        num += (2 * np.maximum(lv * diff, (lv - 1) * diff)).sum(0)
        den += np.abs(y).sum()
    return float((num / den).mean()) if den > 0 else float("nan")


def success(forecast: np.ndarray, horizon: int) -> bool:
    """SPEC C10's success: exactly ``horizon`` finite values."""
    f = np.asarray(forecast)
    return f.ndim == 1 and f.shape[0] == horizon and bool(np.isfinite(f).all())
