"""Real series that ship inside wheels, read offline without importing their packages (issue 22 §5).

    from pretrain.timeseries.datasets import m1_yearly, airline, daphnet
    records = m1_yearly()            # 181 SeriesRecords, yearly, Monash horizon 6

aeon 1.6.0 ships the files (M1 yearly .tsf, Airline, Daphnet) but pins pandas < 3.1, which the project's constraints
exclude, so aeon is not installed: ``make install`` downloads its wheel (``pip download --no-deps aeon==1.6.0 -d
.cache/wheels``) and the files are read straight out of the zip. An installed aeon is used instead when present
(located with ``importlib.util.find_spec``, which does not import it — aeon pulls numba). Nothing is committed.
"""

from __future__ import annotations

import csv
import glob
import importlib.util
import io
import math
import os
import zipfile
from pathlib import Path

from formats.series import SeriesRecord, parse_tsf

ROOT = Path(__file__).resolve().parents[2]
WHEEL_DIRS = (os.environ.get("SCIFOLIO_WHEELS", ""), str(ROOT / ".cache" / "wheels"))
M1_YEARLY = "aeon/datasets/data/m1_yearly_dataset/m1_yearly_dataset.tsf"
AIRLINE = "aeon/datasets/data/Airline/Airline.csv"
DAPHNET = "aeon/datasets/data/Daphnet_S06R02E0/S06R02E0.csv"


class DataUnavailable(FileNotFoundError):
    pass


def aeon_file(member: str) -> bytes:
    """The bytes of ``aeon/...`` from an installed aeon or a downloaded aeon wheel."""
    spec = importlib.util.find_spec("aeon")
    if spec is not None and spec.submodule_search_locations:
        path = Path(list(spec.submodule_search_locations)[0]).parent / member
        if path.exists():
            return path.read_bytes()
    for d in WHEEL_DIRS:
        for wheel in sorted(glob.glob(os.path.join(d, "aeon-*.whl"))) if d else []:
            with zipfile.ZipFile(wheel) as z:
                if member in z.namelist():
                    return z.read(member)
    raise DataUnavailable(
        f"{member} not found: run `make install` or `.venv/bin/pip download --no-deps aeon==1.6.0 -d .cache/wheels`"
    )


def available() -> bool:
    try:
        aeon_file(AIRLINE)
    except DataUnavailable:
        return False
    return True


def m1_yearly() -> list[SeriesRecord]:
    """Monash M1 yearly: 181 series, 15–58 points, horizon 6."""
    return parse_tsf(aeon_file(M1_YEARLY).decode("utf-8"), source="aeon:" + M1_YEARLY)


def airline() -> SeriesRecord:
    """Box–Jenkins airline passengers, monthly 1949–1960 (144 points)."""
    rows = list(csv.DictReader(io.StringIO(aeon_file(AIRLINE).decode("utf-8"))))
    vals = tuple(float(r["Passengers"]) for r in rows)
    return SeriesRecord(
        "airline", (vals,), ("value",), "aeon:" + AIRLINE, freq="monthly", sampling_period_s=30.4375 * 86400
    )


def daphnet(max_rows: int | None = None) -> SeriesRecord:
    """Daphnet freezing-of-gait accelerometers: 9 channels (ankle, leg, trunk × 3 axes), 64 Hz."""
    reader = csv.DictReader(io.StringIO(aeon_file(DAPHNET).decode("utf-8")))
    names = [n for n in reader.fieldnames or [] if n not in ("timestamp", "is_anomaly")]
    cols: list[list[float]] = [[] for _ in names]
    for i, row in enumerate(reader):
        if max_rows is not None and i >= max_rows:
            break
        for c, n in zip(cols, names):
            v = row[n]
            c.append(float(v) if v not in ("", None) else math.nan)
    return SeriesRecord(
        "daphnet", tuple(tuple(c) for c in cols), tuple(names), "aeon:" + DAPHNET, sampling_period_s=1 / 64
    )
