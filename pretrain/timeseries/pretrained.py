"""The default forecaster that ships inside the package (issue 36): a small patch Transformer that reads a
per-window-normalised context of up to 512 points and emits 64 future values × 9 quantiles in one pass (direct
multi-horizon output); longer horizons roll out 64 at a time, up to ``max_horizon`` (512).

    python -m pretrain.timeseries.corpus --out .cache/ts_corpus                       # rebuild the corpus
    python -m pretrain.timeseries.pretrained --corpus .cache/ts_corpus/corpus.npz \\
        --out /tmp/ts/base.pt --minutes 40 --no-seasonal                                # 1: the base (75 min in all)
    python -m pretrain.timeseries.pretrained --corpus .cache/ts_corpus/corpus.npz --init /tmp/ts/base.pt \\
        --lr 3e-4 --minutes 35 --out pretrain/timeseries/weights/default.pt             # 2: + the seasonal path

    from pretrain.timeseries.pretrained import load_default, predict
    point, quantiles = predict(load_default(), [np.sin(np.arange(200) / 3)], horizon=24)   # [1, 24], [1, 24, 9]

Each context's period is detected from its autocorrelation, and its seasonal-naive continuation feeds the query
tokens and the linear skip (``PatchConfig.seasonal``, ``detect_period``). It is scifolio's own model (no classical
or third-party model behind it) but it does not share weights with the C10 lane's encoder/forecaster
(``forecaster.py``), which keeps serving ``scifolio pretrain``. Every window is
normalised by its own observed mean and standard deviation (scale-free, as Chronos and TimesFM do); NaN values are
missing (an observed-flag channel tells the model, fully missing patches are masked out of attention).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from formats import fs

LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
DEFAULT_WEIGHTS = Path(__file__).resolve().parent / "weights" / "default.pt"
Z_CLIP = 30.0


@dataclass(frozen=True)
class PatchConfig:
    """Shape of the default forecaster."""

    context: int = 512
    """Most past points it reads (a multiple of ``patch``): a season of weekly-hourly data fits three times."""
    patch: int = 16
    """Points per input token and per output block of a query token."""
    horizon: int = 64
    """Values one pass emits (the trained horizon; a multiple of ``patch``)."""
    max_horizon: int = 512
    """Longest horizon served (by rolling out ``horizon`` at a time); longer requests are refused."""
    d_model: int = 64
    layers: int = 3
    heads: int = 4
    quantiles: tuple[float, ...] = LEVELS
    linear_skip: bool = True
    """A linear map from the whole normalised context straight to the output, added to the Transformer's: it
    learns lag structure (a season's copy) in a few hundred steps, where attention alone needs thousands."""
    seasonal: bool = False
    """An explicit seasonal path: each context's period is detected from the autocorrelation of its detrended
    values (``detect_period``), the seasonal-naive continuation of the context (its last period repeated) is embedded into
    the query tokens and fed to the linear skip, so a daily cycle of hourly data is copied at any phase without
    the model having to find the lag itself. False in weights trained before it (they load unchanged)."""


@dataclass(frozen=True)
class FitConfig:
    """Pre-training or fine-tuning on windows cut from series."""

    steps: int = 200
    """Optimizer steps (``minutes`` > 0 instead stops on wall time, with the schedule following elapsed time)."""
    minutes: float = 0.0
    batch: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup: int = 100
    min_context: int = 8
    mixup: float = 0.0
    """Share of windows that are a TSMixup of 2–3 series (Chronos §4.1)."""
    synth: float = 0.0
    """Share of windows drawn from the KernelSynth series (sources named ``kernelsynth:…``)."""
    profile: float = 0.0
    """Share of windows cut from a fresh ``corpus.profile_synth`` series (sharp, drifting sub-daily-style cycles)."""
    group_power: float = 0.5
    """A real source group is drawn with weight (its points) ** ``group_power``: 0.5 = square root, 0 = uniform."""
    seed: int = 0
    threads: int = 1
    log_every: int = 50


class Residual(nn.Module):
    def __init__(self, d_in: int, d_hidden: int, d_out: int) -> None:
        super().__init__()
        self.hidden = nn.Sequential(nn.Linear(d_in, d_hidden), nn.GELU(), nn.Linear(d_hidden, d_out))
        self.skip = nn.Linear(d_in, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.hidden(x) + self.skip(x)


class PatchForecaster(nn.Module):
    """Patch tokens of the normalised context (values + observed flags) and ``horizon / patch`` learned query
    tokens go through one bidirectional Transformer; each query token's output is its block of values × quantiles."""

    def __init__(self, cfg: PatchConfig) -> None:
        super().__init__()
        if cfg.context % cfg.patch or cfg.horizon % cfg.patch:
            raise ValueError("context and horizon must be multiples of patch")
        self.cfg = cfg
        d, p = cfg.d_model, cfg.patch
        self.n_in, self.n_out = cfg.context // p, cfg.horizon // p
        self.embed = Residual(2 * p, 2 * d, d)
        self.pos = nn.Parameter(torch.randn(self.n_in + self.n_out, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, cfg.heads, 4 * d, 0.0, activation="gelu", batch_first=True,
                                           norm_first=True)  # fmt: skip
        self.body = nn.TransformerEncoder(layer, cfg.layers, enable_nested_tensor=False)
        self.ln = nn.LayerNorm(d)
        self.head = Residual(d, 2 * d, p * len(cfg.quantiles))
        n_skip = cfg.context + (cfg.horizon if cfg.seasonal else 0)
        self.skip = nn.Linear(n_skip, cfg.horizon * len(cfg.quantiles)) if cfg.linear_skip else None
        self.season = Residual(p, 2 * d, d) if cfg.seasonal else None

    def forward(self, z: torch.Tensor, observed: torch.Tensor) -> torch.Tensor:
        """``z [B, context]`` normalised values (0 where missing), ``observed [B, context]`` → ``[B, horizon, K]``."""
        b, p = z.shape[0], self.cfg.patch
        zp, op = z.reshape(b, self.n_in, p), observed.reshape(b, self.n_in, p)
        tokens = self.embed(torch.cat([zp, op], dim=-1))
        if self.season is not None:
            sn = seasonal_continuation(z, detect_period(z, observed), self.cfg.horizon)
            queries = self.season(sn.reshape(b, self.n_out, p))
            skip_in = torch.cat([z, sn], dim=1)
        else:
            queries = torch.zeros(b, self.n_out, tokens.shape[-1], dtype=tokens.dtype, device=tokens.device)
            skip_in = z
        h = torch.cat([tokens, queries], dim=1) + self.pos
        pad = torch.cat([op.sum(-1) == 0, torch.zeros(b, self.n_out, dtype=torch.bool, device=z.device)], dim=1)
        out = self.head(self.ln(self.body(h, src_key_padding_mask=pad)[:, self.n_in :]))
        out = out.reshape(b, self.cfg.horizon, len(self.cfg.quantiles))
        if self.skip is not None:
            out = out + self.skip(skip_in).reshape(b, self.cfg.horizon, len(self.cfg.quantiles))
        return out

    def add_seasonal_path(self) -> PatchForecaster:
        """A copy with ``seasonal=True`` that computes exactly what this one does until trained: the new skip
        columns and the season embedding's outputs start at zero (continuing shipped weights)."""
        new = PatchForecaster(dataclasses.replace(self.cfg, seasonal=True))
        state = self.state_dict()
        if self.skip is not None:
            w = torch.zeros_like(new.skip.weight)
            w[:, : self.cfg.context] = state["skip.weight"]
            state["skip.weight"] = w
        missing, unexpected = new.load_state_dict(state, strict=False)
        assert not unexpected and all(k.startswith("season.") for k in missing), (missing, unexpected)
        for lin in (new.season.hidden[-1], new.season.skip):
            nn.init.zeros_(lin.weight)
            nn.init.zeros_(lin.bias)
        return new


def detect_period(
    z: torch.Tensor, observed: torch.Tensor, min_corr: float = 0.2, min_rise: float = 0.2
) -> torch.Tensor:
    """Each row's dominant period ``[B]`` (long), from the autocorrelation of the observed values less their linear
    trend: local maxima between lag 2 and a third of the observed length that reach ``min_corr`` and rise at least
    ``min_rise`` above the lowest autocorrelation at a shorter lag (a random walk's slow decay has no such rise);
    the shortest peak within 80 % of the best rise (a daily cycle, not its weekly multiple), or 1 (no season: the
    last value repeats) when there is none."""
    b, n = z.shape
    t = torch.arange(n, dtype=z.dtype, device=z.device)[None].expand(b, n)
    w = observed
    cnt = w.sum(1, keepdim=True).clamp(min=1)
    tm, zm = (w * t).sum(1, keepdim=True) / cnt, (w * z).sum(1, keepdim=True) / cnt
    slope = (w * (t - tm) * (z - zm)).sum(1, keepdim=True) / (w * (t - tm) ** 2).sum(1, keepdim=True).clamp(min=1e-9)
    x = (z - zm - slope * (t - tm)) * w
    size = 2 * n
    fx, fw = torch.fft.rfft(x, size), torch.fft.rfft(w, size)
    num = torch.fft.irfft(fx * fx.conj(), size)[:, :n]
    pairs = torch.fft.irfft(fw * fw.conj(), size)[:, :n].round()
    acf = (num / pairs.clamp(min=1)) / (num[:, :1] / pairs[:, :1].clamp(min=1)).clamp(min=1e-12)
    lags = torch.arange(n, device=z.device)
    peak = (acf[:, 1:-1] >= acf[:, :-2]) & (acf[:, 1:-1] >= acf[:, 2:])
    peak = torch.cat([torch.zeros_like(peak[:, :1]), peak, torch.zeros_like(peak[:, :1])], dim=1)
    rise = acf - torch.cummin(acf, dim=1).values
    ok = peak & (lags >= 2) & (lags <= (cnt / 3).floor()) & (acf >= min_corr) & (rise >= min_rise)
    score = torch.where(ok, rise, torch.zeros_like(rise))
    best = score.max(1, keepdim=True).values
    first = torch.where(ok & (score >= 0.8 * best), lags, torch.full_like(lags, n)).min(1).values
    return torch.where(best.squeeze(1) > 0, first, torch.ones_like(first))


def seasonal_continuation(z: torch.Tensor, period: torch.Tensor, horizon: int) -> torch.Tensor:
    """``[B, horizon]``: the last ``period`` values of each row repeated (seasonal naive in normalised units)."""
    n = z.shape[1]
    h = torch.arange(horizon, device=z.device)
    p = period.clamp(1, n)[:, None]
    return torch.gather(z, 1, n - p + h[None] % p)


def normalise(ctx: np.ndarray, context: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``ctx [B, context]`` (NaN = missing, left-padded) → (z, observed, loc [B], scale [B]) with each row's
    observed mean and standard deviation (scale 1 where a row is constant or empty)."""
    obs = np.isfinite(ctx)
    n = obs.sum(1)
    filled = np.where(obs, ctx, 0.0)
    # moments of x / max|x|, scaled back: values near 1e300 do not overflow the squares
    peak = np.abs(filled).max(1)
    peak = np.where(peak > 0, peak, 1.0)
    unit = filled / peak[:, None]
    loc_u = unit.sum(1) / np.maximum(n, 1)
    var_u = (np.where(obs, unit - loc_u[:, None], 0.0) ** 2).sum(1) / np.maximum(n, 1)
    loc, scale = loc_u * peak, np.sqrt(var_u) * peak
    scale = np.where(scale > 1e-8 * (np.abs(loc) + 1e-30), scale, np.where(np.abs(loc) > 0, np.abs(loc), 1.0))
    z = np.where(obs, np.clip((ctx - loc[:, None]) / scale[:, None], -Z_CLIP, Z_CLIP), 0.0)
    return z, obs, loc, scale


def left_pad(series: Sequence[np.ndarray], length: int) -> np.ndarray:
    out = np.full((len(series), length), np.nan)
    for i, s in enumerate(series):
        s = np.asarray(s, dtype=np.float64)[-length:]
        if s.size:
            out[i, length - s.size :] = s
    return out


@torch.no_grad()
def predict(
    model: PatchForecaster, series: Sequence[np.ndarray], horizon: int, batch: int = 512
) -> tuple[np.ndarray, np.ndarray]:
    """Forecast univariate series (NaN = missing): (median ``[N, H]``, quantiles ``[N, H, K]``), float64. Horizons
    beyond ``cfg.horizon`` feed the median back ``cfg.horizon`` values at a time; beyond ``cfg.max_horizon`` (or
    below 1) a ValueError."""
    cfg = model.cfg
    if not 1 <= horizon <= cfg.max_horizon:
        raise ValueError(
            f"horizon {horizon} is outside 1..{cfg.max_horizon} (the default model emits {cfg.horizon} values per "
            f"pass and rolls out at most {cfg.max_horizon // cfg.horizon} passes)"
        )
    model.eval()
    mid = int(np.argmin(np.abs(np.asarray(cfg.quantiles) - 0.5)))
    quant = np.zeros((len(series), horizon, len(cfg.quantiles)))
    for i in range(0, len(series), batch):
        ctx = left_pad(series[i : i + batch], cfg.context)
        done = 0
        while done < horizon:
            z, obs, loc, scale = normalise(ctx, cfg.context)
            out = model(torch.from_numpy(z).float(), torch.from_numpy(obs).float()).double().numpy()
            block = loc[:, None, None] + scale[:, None, None] * np.sort(out, axis=-1)
            take = min(cfg.horizon, horizon - done)
            quant[i : i + batch, done : done + take] = block[:, :take]
            done += take
            ctx = np.concatenate([ctx, block[:, :, mid]], axis=1)[:, -cfg.context :]
    return quant[..., mid].copy(), quant


# -- checkpoints ----------------------------------------------------------------------------------------------------


def save(model: PatchForecaster, path: str | os.PathLike[str], meta: dict[str, Any] | None = None) -> None:
    buf = io.BytesIO()
    state = {k: v.detach().float().clone() for k, v in model.state_dict().items()}
    torch.save({"config": dataclasses.asdict(model.cfg), "state": state, "meta": meta or {}}, buf)
    fs.write_bytes(path, buf.getvalue())


def load(path: str | os.PathLike[str]) -> PatchForecaster:
    blob = torch.load(path, weights_only=False, map_location="cpu")
    cfg = PatchConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in blob["config"].items()})
    model = PatchForecaster(cfg)
    model.load_state_dict(blob["state"])
    return model.eval()


def load_default() -> PatchForecaster:
    """The weights shipped in the package (``pretrain/timeseries/weights/default.pt``)."""
    if not DEFAULT_WEIGHTS.exists():
        raise FileNotFoundError(f"{DEFAULT_WEIGHTS} missing: reinstall scifolio or retrain (see this module)")
    return load(DEFAULT_WEIGHTS)


# -- validation on held-out tails of training sources --------------------------------------------------------------

# (label, source or source prefix ending in ":", horizon, season, windows): the last ``windows * horizon`` points of
# every matching corpus series are cut off before training (``split_validation``) and scored like the zero-shot
# benchmark. Recipes are chosen on this, never on the reserved zero-shot data (pmdarima, vega-datasets).
VALIDATION = [
    ("Airline, monthly", "aeon:Airline/Airline.csv:Passengers", 12, 12, 2),
    ("elec_equip, monthly", "statsmodels:elec_equip", 12, 12, 2),
    ("elnino, monthly", "statsmodels:elnino", 12, 12, 2),
    ("co2, weekly", "statsmodels:co2", 52, 52, 2),
    ("solar, half-hourly", "aeon:solar/solar.csv:solar_gen", 48, 48, 2),
    ("sunspots, yearly (11-y cycle)", "statsmodels:sunspots", 11, 11, 2),
    ("macrodata, quarterly", "statsmodels:macrodata:", 8, 4, 1),
    ("M1, yearly non-seasonal", "aeon:m1_yearly:", 6, 1, 1),
]


def _val_match(source: str, key: str) -> bool:
    return source.startswith(key) if key.endswith(":") else source == key


def split_validation(
    series: Sequence[np.ndarray], sources: Sequence[str]
) -> tuple[list[np.ndarray], list[tuple[str, int, int, list[np.ndarray], list[np.ndarray]]]]:
    """(training series with the validation tails cut off, [(label, horizon, season, histories, actuals)])."""
    train = [np.asarray(s) for s in series]
    tasks = []
    for label, key, h, season, n_win in VALIDATION:
        hists, acts = [], []
        for i, src in enumerate(sources):
            s = train[i]
            if not _val_match(src, key) or s.size < n_win * h + 2 * max(season, h):
                continue
            for k in range(n_win, 0, -1):
                hists.append(s[: s.size - k * h])
                acts.append(s[s.size - k * h : s.size - (k - 1) * h])
            train[i] = s[: s.size - n_win * h]
        if not hists:
            raise ValueError(f"validation set {label!r}: no series matches {key!r} in the corpus")
        tasks.append((label, h, season, hists, acts))
    return train, tasks


def validate(model: PatchForecaster, corpus: str, quiet: bool = False) -> dict[str, Any]:
    """MASE per validation set and its ratio to seasonal naive (series' last 1,024 points as history, MASE scale on
    the whole history), geometric mean of the ratios over the sets last."""
    from pretrain.timeseries.corpus import load as load_corpus
    from pretrain.timeseries.metrics import mase, seasonal_naive

    _, tasks = split_validation(*load_corpus(corpus))
    rows = {}
    for label, h, season, hists, acts in tasks:
        capped = [x[-1024:] for x in hists]
        point, _ = predict(model, capped, h)
        ok = [i for i, a in enumerate(acts) if np.isfinite(a).all() and np.isfinite(hists[i][-season - 1 :]).all()]
        ours = float(np.mean([mase(hists[i], acts[i], point[i], season) for i in ok]))
        sn = float(np.mean([mase(hists[i], acts[i], seasonal_naive(capped[i], h, season), season) for i in ok]))
        rows[label] = {"windows": len(ok), "mase": ours, "sn_mase": sn, "ratio": ours / sn}
        if not quiet:
            print(f"{label:<32} {len(ok):>4} windows  MASE {ours:8.3f}  SN {sn:8.3f}  x SN {ours / sn:6.3f}")
    ratios = [r["ratio"] for r in rows.values()]
    geo = float(np.exp(np.mean(np.log(ratios))))
    if not quiet:
        print(f"{'geometric mean of x SN':<32} {geo:.3f} (worst {max(ratios):.3f})")
    return {"sets": rows, "geo_ratio": geo, "worst_ratio": float(max(ratios))}


# -- training -------------------------------------------------------------------------------------------------------


class Windows:
    """Training windows: a series drawn (real ones uniformly over source groups, then over series; KernelSynth with
    probability ``synth``), a cut point, a context of ``min_context``–``context`` points before it and up to
    ``horizon`` targets after it (NaN past the end); with probability ``mixup`` a TSMixup of 2–3 mean-scaled
    windows with Dirichlet weights."""

    def __init__(self, series: Sequence[np.ndarray], sources: Sequence[str], mcfg: PatchConfig, fcfg: FitConfig):
        from pretrain.timeseries.corpus import source_group

        self.m, self.f = mcfg, fcfg
        self.rng = np.random.default_rng(fcfg.seed)
        keep = [i for i, s in enumerate(series) if np.isfinite(s).sum() > fcfg.min_context]
        self.series = [np.asarray(series[i], dtype=np.float64) for i in keep]
        groups: dict[str, list[int]] = {}
        self.synth: list[int] = []
        for j, i in enumerate(keep):
            g = source_group(sources[i])
            (self.synth if g == "kernelsynth" else groups.setdefault(g, [])).append(j)
        self.groups = list(groups.values())
        # a source group's weight grows with the square root of its points: big archives count more, one short
        # series (ShampooSales, 36 points) is not drawn as often as 200 accelerometer recordings
        w = np.array([float(sum(self.series[j].size for j in g)) ** fcfg.group_power for g in self.groups])
        self.group_p = w / w.sum() if len(w) else w
        if not self.groups and not self.synth:
            raise ValueError(f"no series longer than min_context={fcfg.min_context}")

    def _pick(self) -> np.ndarray:
        if self.f.profile and self.rng.random() < self.f.profile:
            from pretrain.timeseries.corpus import profile_synth

            return profile_synth(self.rng)
        if self.synth and (not self.groups or self.rng.random() < self.f.synth):
            return self.series[self.synth[self.rng.integers(len(self.synth))]]
        g = self.groups[self.rng.choice(len(self.groups), p=self.group_p)]
        return self.series[g[self.rng.integers(len(g))]]

    def _cut(self, s: np.ndarray, ctx_len: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        m, n = self.m, s.size
        lo = min(self.f.min_context, n - 1)
        hi = n - m.horizon if self.rng.random() < 0.8 and n - m.horizon > lo else n - 1
        t = int(self.rng.integers(lo, max(lo, hi) + 1))
        if ctx_len is None:
            ctx_len = m.context if self.rng.random() < 0.5 else int(self.rng.integers(lo, m.context + 1))
        ctx = s[max(0, t - ctx_len) : t]
        tgt = np.full(m.horizon, np.nan)
        fut = s[t : t + m.horizon]
        tgt[: fut.size] = fut
        return ctx, tgt

    def _mix(self) -> tuple[np.ndarray, np.ndarray]:
        k = int(self.rng.integers(2, 4))
        w = self.rng.dirichlet([1.5] * k)
        length = int(self.rng.integers(self.f.min_context, self.m.context + 1))
        ctx, tgt = np.zeros(length), np.zeros(self.m.horizon)
        for wi in w:
            c, t = self._cut(self._pick(), length)
            c = left_pad([c], length)[0]
            fin = np.abs(c[np.isfinite(c)])
            sc = float(fin.mean()) if fin.size and fin.mean() > 0 else 1.0
            ctx, tgt = ctx + wi * c / sc, tgt + wi * t / sc
        return ctx, tgt

    def batch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(z ``[B, context]``, observed, normalised targets ``[B, horizon]`` with NaN where missing)."""
        ctxs, tgts = [], []
        for _ in range(self.f.batch):
            c, t = self._mix() if self.rng.random() < self.f.mixup else self._cut(self._pick())
            ctxs.append(c)
            tgts.append(t)
        z, obs, loc, scale = normalise(left_pad(ctxs, self.m.context), self.m.context)
        y = np.clip((np.stack(tgts) - loc[:, None]) / scale[:, None], -Z_CLIP, Z_CLIP)
        return torch.from_numpy(z).float(), torch.from_numpy(obs).float(), torch.from_numpy(y).float()


def quantile_loss(out: torch.Tensor, y: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """Mean pinball loss over the observed targets: ``out [B, H, K]``, ``y [B, H]`` (NaN = missing)."""
    valid = torch.isfinite(y)
    diff = torch.where(valid, y, torch.zeros_like(y))[..., None] - out
    loss = torch.maximum(levels * diff, (levels - 1) * diff).mean(-1)
    return (loss * valid).sum() / valid.sum().clamp(min=1)


def fit(
    model: PatchForecaster,
    series: Sequence[np.ndarray],
    sources: Sequence[str],
    fcfg: FitConfig,
    log_path: str | None = None,
    quiet: bool = True,
    checkpoint: Callable[[int], None] | None = None,
    checkpoint_every: int = 1000,
) -> dict[str, Any]:
    """Train ``model`` in place on windows of ``series``; returns the last metrics line (the lines also go to
    ``log_path`` as JSON lines). ``checkpoint(step)`` runs every ``checkpoint_every`` steps."""
    if fcfg.threads:
        torch.set_num_threads(fcfg.threads)
    torch.manual_seed(fcfg.seed)
    random.seed(fcfg.seed)
    data = Windows(series, sources, model.cfg, fcfg)
    opt = torch.optim.AdamW(model.parameters(), lr=fcfg.lr, weight_decay=fcfg.weight_decay)
    levels = torch.tensor(model.cfg.quantiles)
    t0, step, losses, last = time.time(), 0, [], {}
    lines: list[str] = []
    model.train()
    while True:
        frac = (time.time() - t0) / (60 * fcfg.minutes) if fcfg.minutes > 0 else step / max(fcfg.steps, 1)
        if frac >= 1:
            break
        step += 1
        lr = fcfg.lr * min(1.0, step / max(fcfg.warmup, 1)) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        z, obs, y = data.batch()
        loss = quantile_loss(model(z, obs), y, levels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if checkpoint is not None and step % checkpoint_every == 0:
            checkpoint(step)
            model.train()
        if step % fcfg.log_every == 0:
            last = {"step": step, "loss": float(np.mean(losses)), "lr": lr, "elapsed_s": round(time.time() - t0, 1)}
            losses = []
            lines.append(json.dumps(last))
            if not quiet:
                print(lines[-1], flush=True)
            if log_path:
                fs.write_text(log_path, "\n".join(lines) + "\n")
    if losses:
        last = {"step": step, "loss": float(np.mean(losses)), "lr": lr, "elapsed_s": round(time.time() - t0, 1)}
        lines.append(json.dumps(last))
    if log_path:
        fs.write_text(log_path, "\n".join(lines) + "\n")
    model.eval()
    return last


def pretrain_default(
    corpus: str,
    out: str,
    minutes: float,
    seed: int = 0,
    threads: int = 1,
    init: str | None = None,
    lr: float = 1e-3,
    synth: float = 0.3,
    group_power: float = 0.5,
    seasonal: bool = True,
    profile: float = 0.0,
) -> dict[str, Any]:
    """The recipe of the shipped weights: KernelSynth ``synth`` (30 %), TSMixup 20 %, the rest real series (source
    groups weighted by the square root of their points) minus the validation tails (``VALIDATION``), batch 96, lr
    ``lr`` cosine to lr/10, ``minutes`` of wall time (one torch thread: on a shared 2-core machine two threads were
    9x slower per step). ``init``: continue from a weights file (a new warm-up and cosine) instead of from scratch.
    ``seasonal``: with the explicit seasonal path (added zero-initialised to ``init`` weights that lack it); the
    shipped weights are a ``seasonal=False`` run of 40 minutes continued 35 minutes with it (module docstring)."""
    from pretrain.timeseries.corpus import load as load_corpus

    series, sources = load_corpus(corpus)
    series, _ = split_validation(series, sources)
    torch.manual_seed(seed)
    if init:
        model = load(init)
        model = (model.add_seasonal_path() if seasonal and not model.cfg.seasonal else model).train()
    else:
        model = PatchForecaster(PatchConfig(seasonal=seasonal))
    fcfg = FitConfig(minutes=minutes, batch=96, lr=lr, warmup=200, mixup=0.2, synth=synth, seed=seed,
                     profile=profile, group_power=group_power, threads=threads, log_every=100)  # fmt: skip
    meta = {"corpus": corpus, "fit": dataclasses.asdict(fcfg), "series": len(series), "init": init,
            "validation_tails_held_out": True}  # fmt: skip
    if init:
        prev = torch.load(init, weights_only=False, map_location="cpu").get("meta", {})
        meta["init_meta"] = {k: prev.get(k) for k in ("fit", "last", "step", "init")}
    last = fit(model, series, sources, fcfg, log_path=out + ".metrics.jsonl", quiet=False,
               checkpoint=lambda step: save(model, out, meta | {"step": step}))  # fmt: skip
    meta["last"] = last
    save(model, out, meta)
    return meta


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=".cache/ts_corpus/corpus.npz")
    ap.add_argument("--out", default=str(DEFAULT_WEIGHTS))
    ap.add_argument("--minutes", type=float, default=40.0, help="wall-clock training budget")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--init", default=None, help="continue from this weights file instead of from scratch")
    ap.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (cosine to a tenth of it)")
    ap.add_argument("--synth", type=float, default=0.3, help="share of KernelSynth windows")
    ap.add_argument("--profile", type=float, default=0.0,
                    help="share of windows from generated sub-daily-style cycles (corpus.profile_synth)")  # fmt: skip
    ap.add_argument("--group-power", type=float, default=0.5, help="source group weight = points ** this")
    ap.add_argument(
        "--no-seasonal",
        dest="seasonal",
        action="store_false",
        help="without the explicit seasonal path (PatchConfig.seasonal): the architecture of older weights",
    )
    ap.add_argument("--validate", default=None, metavar="WEIGHTS",
                    help="only score WEIGHTS on the held-out training-source tails (VALIDATION) and exit")  # fmt: skip
    args = ap.parse_args()
    if args.validate:
        torch.set_num_threads(args.threads)
        print(json.dumps(validate(load(args.validate), args.corpus)))
        return 0
    meta = pretrain_default(args.corpus, args.out, args.minutes, args.seed, args.threads, args.init, args.lr,
                            args.synth, args.group_power, args.seasonal, args.profile)  # fmt: skip
    print(json.dumps(meta | {"validation": validate(load(args.out), args.corpus)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# -- run directories: fine-tuning and loading whichever model a run holds -------------------------------------------


def finetune(
    series: Sequence[np.ndarray], out_dir: str, fcfg: FitConfig, data_files: Sequence[str] = (), quiet: bool = True
) -> dict[str, Any]:
    """``scifolio timeseries train --init default``: the shipped weights trained further on ``series``; writes
    ``out_dir/{config.json, model.pt, metrics.jsonl, data.json}`` (``config.json`` has ``kind: pretrained``)."""
    model = load_default()
    os.makedirs(out_dir, exist_ok=True)
    last = fit(model, series, ["user"] * len(series), fcfg, os.path.join(out_dir, "metrics.jsonl"), quiet)
    config = {"kind": "pretrained", "init": "default", "model": dataclasses.asdict(model.cfg),
              "fit": dataclasses.asdict(fcfg)}  # fmt: skip
    save(model, os.path.join(out_dir, "model.pt"), {"init": "default", "last": last})
    fs.write_text(os.path.join(out_dir, "config.json"), json.dumps(config, indent=2) + "\n")
    fs.write_text(os.path.join(out_dir, "data.json"),
                  json.dumps({"files": list(data_files), "series": len(series)}, indent=2) + "\n")  # fmt: skip
    return last


def load_model(model_dir: str | os.PathLike[str] | None):
    """``None`` → the shipped default; a run directory → its model (``kind: pretrained`` → a fine-tuned default,
    otherwise the C10 lane's ``SeriesForecastModel`` via ``train.load_run``)."""
    if model_dir is None:
        return load_default()
    cfg_path = Path(model_dir) / "config.json"
    if cfg_path.exists() and json.loads(cfg_path.read_text()).get("kind") == "pretrained":
        return load(Path(model_dir) / "model.pt")
    from pretrain.timeseries.train import load_run

    return load_run(model_dir)[1]


def forecast_any(model, series: Sequence[np.ndarray], horizon: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Univariate forecasts from either model kind: (points ``[H]``, quantiles ``[H, K]``) per series."""
    if isinstance(model, PatchForecaster):
        point, quant = predict(model, series, horizon)
        return list(point), list(quant)
    from pretrain.timeseries.forecaster import forecast_many

    fcs = forecast_many(model, series, horizon)
    return [p[0] for p, _ in fcs], [q[0] for _, q in fcs]


def quantile_levels(model) -> tuple[float, ...]:
    return model.cfg.quantiles if isinstance(model, PatchForecaster) else model.cfg.forecaster.quantiles
