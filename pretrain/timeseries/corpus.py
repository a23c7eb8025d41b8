"""The default forecaster's pre-training corpus (issue 36): real series that ship inside installed packages, read
offline, plus KernelSynth-style Gaussian-process samples; TSMixup is applied on the fly by the trainer
(``pretrained.py``). Every source and its licence: ``pretrain/timeseries/SOURCES.md``.

    python -m pretrain.timeseries.corpus --out .cache/ts_corpus        # rebuilds .cache/ts_corpus/corpus.npz

Series from ``pmdarima`` and ``vega-datasets`` are reserved for the zero-shot check (benchmarks/timeseries.py
--task zeroshot): this module never reads them (a test checks that no source names them).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import time
import warnings
from collections.abc import Iterator

import numpy as np

from pretrain.timeseries.datasets import aeon_file

AEON = "aeon/datasets/data/"
# aeon CSV files: (member, value columns; None = every numeric column but the first).
AEON_CSV = {
    "Airline/Airline.csv": ["Passengers"],
    "Lynx/Lynx.csv": None,
    "ShampooSales/ShampooSales.csv": ["Sales"],
    "PBS_dataset/PBS_dataset.csv": ["Scripts"],
    "solar/solar.csv": ["solar_gen"],
    "Uschange/Uschange.csv": ["Consumption", "Income", "Production", "Savings", "Unemployment"],
    "Longley/Longley.csv": None,
    "KDD-TSAD_135/135_UCR_Anomaly_InternalBleeding16_TRAIN.csv": None,
    "segmentation/ElectricDevices.csv": None,
    "Daphnet_S06R02E0/S06R02E0.csv": None,
}
# aeon .ts archives (UCR/UEA): every instance and dimension is a short series; at most CAP_PER_ARCHIVE of each.
AEON_TS = [
    "ACSF1/ACSF1_TRAIN.ts", "ACSF1/ACSF1_TEST.ts", "ArrowHead/ArrowHead_TRAIN.ts", "BasicMotions/BasicMotions_TRAIN.ts",
    "CardanoSentiment/CardanoSentiment_TRAIN.ts", "Covid3Month/Covid3Month_TRAIN.ts", "GunPoint/GunPoint_TRAIN.ts",
    "ItalyPowerDemand/ItalyPowerDemand_TEST.ts", "JapaneseVowels/JapaneseVowels_TRAIN.ts",
    "OSULeaf/OSULeaf_TRAIN.ts", "PickupGestureWiimoteZ/PickupGestureWiimoteZ_TRAIN.ts",
]  # fmt: skip
CAP_PER_ARCHIVE = 200
RESERVED = ("pmdarima", "vega_datasets", "vega-datasets")


def _aeon_csv(member: str, cols: list[str] | None) -> Iterator[tuple[str, np.ndarray]]:
    rows = list(csv.reader(io.StringIO(aeon_file(AEON + member).decode("utf-8"))))
    head, body = rows[0], rows[1:]
    names = cols if cols is not None else [h for h in head[1:] if h not in ("timestamp", "is_anomaly", "YEAR")]
    for name in names:
        j = head.index(name)
        vals = []
        for r in body:
            try:
                vals.append(float(r[j]))
            except (ValueError, IndexError):
                vals.append(math.nan)
        a = np.asarray(vals)
        if member.startswith("Daphnet"):
            # 64 Hz accelerometers: the raw stream and an 8x-decimated one (a slower view of the same motion)
            yield f"aeon:{member}:{name}", a[:16384]
            yield f"aeon:{member}:{name}/8", a[::8]
        elif np.isfinite(a).sum() >= 8:
            yield f"aeon:{member}:{name}", a


def _aeon_ts(member: str) -> Iterator[tuple[str, np.ndarray]]:
    text = aeon_file(AEON + member).decode("utf-8", errors="replace")
    n = 0
    in_data = False
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not in_data:
            in_data = line.lower().startswith("@data")
            continue
        for d, dim in enumerate(line.split(":")[:-1]):  # the last field is the class label
            try:
                a = np.array([math.nan if v in ("?", "NaN") else float(v) for v in dim.split(",") if v])
            except ValueError:
                continue
            if a.size >= 8 and n < CAP_PER_ARCHIVE:
                yield f"aeon:{member}#{n}.{d}", a
                n += 1


def _statsmodels() -> Iterator[tuple[str, np.ndarray]]:
    import statsmodels.datasets as smd

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield "statsmodels:co2", smd.co2.load_pandas().data["co2"].to_numpy(float)
        yield "statsmodels:sunspots", smd.sunspots.load_pandas().data["SUNACTIVITY"].to_numpy(float)
        yield "statsmodels:nile", smd.nile.load_pandas().data["volume"].to_numpy(float)
        from statsmodels.datasets import elec_equip  # not re-exported by statsmodels.datasets

        yield "statsmodels:elec_equip", elec_equip.load().data.iloc[:, 0].to_numpy(float)  # euro-area monthly index
        el = smd.elnino.load_pandas().data.drop(columns="YEAR").to_numpy(float)
        yield "statsmodels:elnino", el.reshape(-1)  # 61 years x 12 months, row-major = chronological
        macro = smd.macrodata.load_pandas().data
        for c in macro.columns[2:]:
            yield f"statsmodels:macrodata:{c}", macro[c].to_numpy(float)
        for c in ("Dp", "R"):
            yield f"statsmodels:interest_inflation:{c}", smd.interest_inflation.load_pandas().data[c].to_numpy(float)
        dd = smd.danish_data.load_pandas().data
        for c in dd.columns:
            yield f"statsmodels:danish_data:{c}", dd[c].to_numpy(float)
        fert = smd.fertility.load_pandas().data
        years = [c for c in fert.columns if c.isdigit()]
        for _, row in fert.iterrows():
            a = row[years].to_numpy(float)
            if np.isfinite(a).sum() >= 20:
                yield f"statsmodels:fertility:{row['Country Code']}", a


def real_series() -> list[tuple[str, np.ndarray]]:
    """Every real training series as (source, values), NaN = missing."""
    from pretrain.timeseries.datasets import m1_yearly

    out: list[tuple[str, np.ndarray]] = []
    for member, cols in AEON_CSV.items():
        out += list(_aeon_csv(member, cols))
    for member in AEON_TS:
        out += list(_aeon_ts(member))
    out += [(f"aeon:m1_yearly:{r.series_id}", np.asarray(r.values[0])) for r in m1_yearly()]
    out += list(_statsmodels())
    assert not any(any(x in s for x in RESERVED) for s, _ in out)
    return out


# -- KernelSynth (Ansari et al. 2024, Chronos §4.2): GP samples from random compositions of a kernel bank ---------

PERIODS = (4, 7, 12, 14, 24, 30, 48, 52, 60, 96, 168, 336, 365)


def _kernel(rng: np.random.Generator, x: np.ndarray, length: int) -> np.ndarray:
    d = x[:, None] - x[None, :]
    kind = rng.choice(["const", "white", "linear", "rbf", "rq", "periodic", "periodic", "periodic"])
    if kind == "const":
        return np.full_like(d, rng.choice([0.1, 1.0, 10.0]))
    if kind == "white":
        return np.eye(len(x)) * rng.choice([0.01, 0.1, 1.0])
    if kind == "linear":
        s0 = rng.choice([0.0, 1.0, 10.0])
        return s0**2 + np.outer(x, x)
    if kind == "rbf":
        ls = rng.choice([0.02, 0.1, 1.0, 10.0])
        return np.exp(-0.5 * (d / ls) ** 2)
    if kind == "rq":
        a, ls = rng.choice([0.1, 1.0, 10.0]), rng.choice([0.05, 0.3, 1.0])
        return (1 + d**2 / (2 * a * ls**2)) ** (-a)
    p = rng.choice(PERIODS) / length
    ls = rng.choice([0.5, 1.0, 3.0])
    return np.exp(-2 * np.sin(np.pi * np.abs(d) / p) ** 2 / ls**2)


def kernel_synth(rng: np.random.Generator, length: int = 640, max_kernels: int = 5) -> np.ndarray:
    """One GP sample on [0, 1]: 1–``max_kernels`` kernels from the bank combined by random + or ×."""
    x = np.linspace(0, 1, length)
    k = _kernel(rng, x, length)
    for _ in range(rng.integers(0, max_kernels)):
        other = _kernel(rng, x, length)
        k = k + other if rng.random() < 0.5 else k * other
    for jitter in (1e-6, 1e-4, 1e-2):
        try:
            chol = np.linalg.cholesky(k + jitter * np.eye(length))
            break
        except np.linalg.LinAlgError:
            continue
    else:
        w, v = np.linalg.eigh(k)
        chol = v * np.sqrt(np.clip(w, 0, None))
    return chol @ rng.standard_normal(length)


PROFILE_PERIODS = (7, 12, 24, 24, 48, 48, 96, 144, 168)


def profile_synth(rng: np.random.Generator, length: int = 1024) -> np.ndarray:
    """One sub-daily-style series: a non-sinusoidal cycle (a Fourier series with decaying harmonics, a clipped
    daylight bump, or a squared-off wave) of a period in ``PROFILE_PERIODS``, optionally modulated by a 7-cycle
    "week" and by a random scale per cycle ("cloudy days"), on a slowly drifting level and amplitude, plus AR(1)
    noise, optionally clipped at zero. KernelSynth's periodic kernel gives smooth, sine-like cycles of fixed
    amplitude; electricity, solar and temperature records are sharper and drift, and the default model's weakest
    validation set is the half-hourly solar one."""
    from scipy.signal import lfilter

    p = int(rng.choice(PROFILE_PERIODS))
    t = np.arange(length)
    phase = 2 * np.pi * (t % p) / p
    kind = rng.choice(["fourier", "fourier", "bump", "square"])
    if kind == "fourier":
        ks = np.arange(1, int(rng.integers(2, 7)) + 1)
        amp = ks ** -rng.uniform(0.5, 2.0) * rng.uniform(0.3, 1.0, ks.size)
        shape = (amp[:, None] * np.cos(ks[:, None] * phase[None] + rng.uniform(0, 2 * np.pi, ks.size)[:, None])).sum(0)
    elif kind == "bump":
        centre, width = rng.uniform(0.3, 0.7) * p, rng.uniform(0.08, 0.25) * p
        shape = np.exp(-0.5 * (((t % p) - centre) / width) ** 2)
    else:
        shape = np.tanh(rng.uniform(2, 8) * np.cos(phase + rng.uniform(0, 2 * np.pi)))
    shape = shape / (shape.std() + 1e-9)
    if rng.random() < 0.4:
        week = 1 + rng.uniform(0.1, 0.5) * rng.standard_normal(7)
        shape = shape * week[(t // p) % 7]
    if rng.random() < 0.4:
        shape = shape * np.exp(rng.uniform(0.05, 0.4) * rng.standard_normal(length // p + 1))[t // p]
    drift = np.cumsum(rng.standard_normal(length)) * rng.uniform(0.0, 0.1)
    amp_drift = np.exp(np.cumsum(rng.standard_normal(length)) * rng.uniform(0.0, 0.01))
    level = drift + rng.uniform(-0.01, 0.01) * t * rng.integers(0, 2)
    phi, sigma = rng.uniform(0.0, 0.9), rng.uniform(0.02, 0.5)
    noise = lfilter([1.0], [1.0, -phi], rng.standard_normal(length) * sigma)
    y = amp_drift * shape + level + noise
    if kind == "bump" or rng.random() < 0.15:
        y = np.maximum(y - np.quantile(y, rng.uniform(0.0, 0.4)), 0.0)
    return y * rng.uniform(0.5, 100.0) + rng.uniform(-10.0, 100.0) * rng.integers(0, 2)


def build(out_dir: str, n_synth: int = 1000, seed: int = 0) -> dict:
    """Write ``out_dir/corpus.npz`` (values concatenated, offsets, sources) and ``out_dir/corpus.json`` (counts)."""
    from formats import fs

    t0 = time.time()
    real = real_series()
    rng = np.random.default_rng(seed)
    synth = [(f"kernelsynth:{i}", kernel_synth(rng)) for i in range(n_synth)]
    items = real + synth
    values = np.concatenate([a.astype(np.float32) for _, a in items])
    offsets = np.cumsum([0] + [a.size for _, a in items]).astype(np.int64)
    os.makedirs(out_dir, exist_ok=True)
    buf = io.BytesIO()
    np.savez_compressed(buf, values=values, offsets=offsets, sources=np.array([s for s, _ in items]))
    fs.write_bytes(os.path.join(out_dir, "corpus.npz"), buf.getvalue())
    groups: dict[str, list[int]] = {}
    for s, a in real:
        groups.setdefault(source_group(s), []).append(a.size)
    summary = {
        "real_series": len(real),
        "real_points": int(sum(a.size for _, a in real)),
        "kernelsynth_series": n_synth,
        "groups": {g: {"series": len(v), "points": int(sum(v))} for g, v in sorted(groups.items())},
        "seconds": round(time.time() - t0, 1),
    }
    fs.write_text(os.path.join(out_dir, "corpus.json"), json.dumps(summary, indent=2) + "\n")
    return summary


def source_group(source: str) -> str:
    """``aeon:Lynx/Lynx.csv:0`` → ``aeon:Lynx``; ``statsmodels:macrodata:cpi`` → ``statsmodels:macrodata``."""
    kind, _, rest = source.partition(":")
    if kind == "kernelsynth":
        return kind
    return f"{kind}:{rest.split('/')[0].split(':')[0].split('#')[0]}"


def load(path: str) -> tuple[list[np.ndarray], list[str]]:
    """The corpus written by ``build``: (series, sources)."""
    with np.load(path) as z:
        values, offsets, sources = z["values"], z["offsets"], z["sources"]
    return [values[offsets[i] : offsets[i + 1]].astype(np.float64) for i in range(len(sources))], list(sources)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".cache/ts_corpus")
    ap.add_argument("--synth", type=int, default=1000, help="KernelSynth samples")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(json.dumps(build(args.out, args.synth, args.seed), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
