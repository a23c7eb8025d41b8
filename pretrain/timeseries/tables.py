"""The forecast contract of ``scifolio timeseries forecast`` (issue 36): long tables in, long tables out, the user's
own ids, column names and timestamps back.

    from pretrain.timeseries.tables import read_inputs, forecast_table, write_table
    names, series = read_inputs(["sales.csv"])           # columns series_id,timestamp,value or unique_id,ds,y
    table = forecast_table(names, series, points, quantiles, levels=(0.1, ..., 0.9))
    write_table(table, "fc.csv")

Input: CSV or parquet with an id column (``series_id`` or ``unique_id``; absent = one series), a time column
(``timestamp`` or ``ds``; absent = row order), a value column (``value`` or ``y``) and optionally ``channel``;
Monash ``.tsf`` files are read with their series names (and ``start_timestamp`` + ``@frequency`` when present).
Output: the input's id / channel / time column names, the same ids verbatim (read as text from CSV), timestamps
that continue each series at its inferred frequency (a ``step`` column 1..H only when the input has no time
column; integer time columns continue as integers), the value column's name for the median, then ``q0.1 … q0.9``.

Rules (documented in README): an id found in two files is an error naming both; a timestamp repeated within a
series is an error; timestamps are parsed as ISO, else as the first value's format, day-first or per value
(``1991 Jul``, ``05/12/2020``, ``13.12.2020``, ``2020Q1`` parse; of several readings the regular one wins); the frequency is pandas' inferred one, or —
when rows are missing — the smallest step (fixed-width data) or a calendar frequency (month/quarter/year/week
starts or ends) on whose grid every timestamp lies: missing grid points are inserted as NaN. Any other spacing is
an "irregular timestamps" error naming the series. NaN values are passed to the model as missing (it masks them;
no imputation); a series without a finite value is an error.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

ID_NAMES = ("series_id", "unique_id")
TIME_NAMES = ("timestamp", "ds")
VALUE_NAMES = ("value", "y")
TSF_FREQ = {"yearly": "YS", "quarterly": "QS", "monthly": "MS", "weekly": "W", "daily": "D", "hourly": "h",
            "half_hourly": "30min", "minutely": "min", "10_minutes": "10min", "4_seconds": "4s"}  # fmt: skip
# Horizon-predictor units of pandas offsets (prefix of the offset's name).
FREQ_UNITS = (("Y", "year"), ("A", "year"), ("Q", "quarter"), ("M", "month"), ("W", "week"), ("B", "day"),
              ("D", "day"), ("h", "hour"), ("H", "hour"), ("min", "minute"), ("T", "minute"), ("s", "second"))  # fmt: skip


class ContractError(ValueError):
    """An input the forecast contract refuses, with a message naming the file / series and the remedy."""

    def __init__(self, message: str, reason: str = "refused") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class Refused:
    """A file (or one series of it) left out of the forecast, and why (the CLI's quarantine row)."""

    item: str
    reason: str
    message: str


@dataclass
class Names:
    """The input's column names (``None``: the column is absent)."""

    id: str | None
    time: str | None
    value: str
    channel: str | None


@dataclass
class InputSeries:
    """One (series, channel) to forecast: values on a regular grid (NaN = missing) and how its time continues."""

    id: Any
    channel: Any
    values: np.ndarray
    file: str
    last: Any = None
    """Last timestamp (pd.Timestamp) or integer time; None = no time column."""
    freq: Any = None
    """pandas offset, pd.Timedelta or integer step."""
    meta: dict[str, Any] = field(default_factory=dict)

    def future(self, horizon: int) -> list[Any]:
        """The next ``horizon`` timestamps (or integer times, or steps 1..H)."""
        if self.last is None:
            return list(range(1, horizon + 1))
        if isinstance(self.freq, (int, np.integer)):
            return [self.last + self.freq * k for k in range(1, horizon + 1)]
        return list(pd.date_range(self.last, periods=horizon + 1, freq=self.freq)[1:])

    @property
    def period_s(self) -> float | None:
        """Seconds per step for fixed-width frequencies (hours, minutes, days …), else None."""
        if self.freq is None or isinstance(self.freq, (int, np.integer)):
            return None
        try:
            return pd.Timedelta(pd.tseries.frequencies.to_offset(self.freq)).total_seconds()
        except (ValueError, TypeError):  # months, quarters, years: no fixed length
            return None

    @property
    def season(self) -> int:
        """MASE's seasonal period by Monash's convention (``formats.series.FREQ_SEASON``): 12 monthly, 4 quarterly,
        24 hourly, 48 half-hourly, 7 daily; 1 when unknown."""
        from formats.series import FREQ_SEASON, FREQ_SECONDS

        if self.meta.get("freq"):
            return FREQ_SEASON.get(self.meta["freq"], 1)
        unit, period = self.freq_unit, self.period_s
        if period is not None:
            names = [n for n, sec in FREQ_SECONDS.items() if abs(sec - period) < 1e-6]
            return FREQ_SEASON.get(names[0], 1) if names else 1
        return {"month": 12, "quarter": 4}.get(unit or "", 1)

    @property
    def freq_unit(self) -> str | None:
        """The horizon predictor's unit for durations in the series' own frequency ("the next 3 months")."""
        if self.freq is None or isinstance(self.freq, (int, np.integer)):
            return None
        name = pd.tseries.frequencies.to_offset(self.freq).rule_code
        for prefix, unit in FREQ_UNITS:
            if name.startswith(prefix):
                return unit
        return None


def _pick(columns: list[str], options: tuple[str, ...], role: str, path: str) -> str | None:
    found = [c for c in columns if c in options]
    if len(found) > 1:
        raise ContractError(f"{path}: both {found} present; keep one {role} column", "columns")
    return found[0] if found else None


def _names(df: pd.DataFrame, path: str) -> Names:
    cols = list(df.columns)
    value = _pick(cols, VALUE_NAMES, "value", path)
    if value is None:
        raise ContractError(f"{path}: no value column (need 'value' or 'y'; columns are {cols})", "no_value_column")
    return Names(
        id=_pick(cols, ID_NAMES, "id", path),
        time=_pick(cols, TIME_NAMES, "time", path),
        value=value,
        channel="channel" if "channel" in cols else None,
    )


def parse_times(col: pd.Series, path: str) -> pd.Series:
    """A time column → integers (kept) or pandas timestamps; ContractError when it does not parse."""
    if pd.api.types.is_integer_dtype(col):
        return col
    if pd.api.types.is_float_dtype(col):
        if col.isna().any() or not np.all(np.mod(col, 1) == 0):
            raise ContractError(f"{path}: numeric time column with missing or fractional values", "bad_timestamp")
        return col.astype("int64")
    if pd.api.types.is_datetime64_any_dtype(col):
        return col
    text = col.astype("string")
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kwargs in ({"format": "ISO8601"}, {}, {"dayfirst": True}, {"format": "mixed"}):
            try:
                out = pd.to_datetime(text, **kwargs)
            except (ValueError, TypeError, OverflowError):
                continue
            if not out.isna().any():
                if kwargs.get("format") == "ISO8601":
                    return out
                found.append(out)
    if found:
        # 01/02/2021 parses month-first and day-first alike: keep the first reading pandas infers a frequency for
        # (over the column's distinct times), else the one with the fewest distinct steps
        return min(found, key=_irregularity)
    bad = text[pd.to_datetime(text, errors="coerce", format="mixed").isna()].head(1).tolist()
    raise ContractError(f"{path}: timestamp {bad[0] if bad else '?'!r} does not parse as a date", "bad_timestamp")


def _irregularity(times: pd.Series) -> tuple[int, int]:
    idx = pd.DatetimeIndex(times.drop_duplicates().sort_values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            regular = len(idx) >= 3 and pd.infer_freq(idx) is not None
        except (ValueError, TypeError):
            regular = False
    return (0 if regular else 1, int(pd.Series(idx).diff().nunique()))


def _calendar_candidates(first: pd.Timestamp) -> list[str]:
    mon = first.strftime("%b").upper()
    day = first.strftime("%a").upper()
    return ["MS", "ME", f"QS-{mon}", f"QE-{mon}", f"YS-{mon}", f"YE-{mon}", f"W-{day}", "B"]


def regular_grid(times: pd.Series, label: str) -> tuple[Any, np.ndarray]:
    """(frequency, grid position of each timestamp) for sorted unique times; ContractError when irregular."""
    n = len(times)
    if pd.api.types.is_integer_dtype(times):
        t = times.to_numpy(np.int64)
        if n == 1:
            return 1, np.zeros(1, np.int64)
        d = np.diff(t)
        step = int(np.gcd.reduce(d))
        if step <= 0 or (t[-1] - t[0]) // step > 4 * n:
            raise ContractError(f"series {label}: irregular integer times (steps {sorted(set(d.tolist()))[:5]})",
                                "irregular_timestamps")  # fmt: skip
        return step, (t - t[0]) // step
    idx = pd.DatetimeIndex(times)
    if n < 2:
        raise ContractError(f"series {label}: one timestamp, the frequency cannot be inferred", "no_frequency")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pandas 3 announces infer_freq returning an offset: both work below
        freq = pd.infer_freq(idx) if n >= 3 else None
    if freq is not None:
        return pd.tseries.frequencies.to_offset(freq), np.arange(n)
    d = np.diff(idx.asi8)
    step = int(np.gcd.reduce(d))
    if step > 0 and d.min() == step and (idx.asi8[-1] - idx.asi8[0]) // step <= 4 * n:
        return pd.Timedelta(step, unit=idx.unit), (idx.asi8 - idx.asi8[0]) // step
    for cand in _calendar_candidates(idx[0]):
        grid = pd.date_range(idx[0], idx[-1], freq=cand)
        if 0 < len(grid) <= 4 * n and idx.isin(grid).all():
            return pd.tseries.frequencies.to_offset(cand), grid.get_indexer(idx)
    raise ContractError(
        f"series {label}: irregular timestamps (no regular frequency fits: steps from {pd.Timedelta(int(d.min()), unit=idx.unit)} "
        f"to {pd.Timedelta(int(d.max()), unit=idx.unit)}); resample it to a regular grid first",
        "irregular_timestamps",
    )


def _read_frame(path: str) -> pd.DataFrame:
    low = path.lower()
    if low.endswith(".parquet"):
        return pd.read_parquet(path)
    head = pd.read_csv(path, nrows=0)
    text_cols = {c: "string" for c in head.columns if c in ID_NAMES or c == "channel"}
    return pd.read_csv(path, dtype=text_cols)


def _tsf(path: str) -> tuple[Names, list[InputSeries]]:
    from formats.series import SeriesError, parse_tsf

    with open(path, encoding="utf-8", errors="replace") as f:
        try:
            records = parse_tsf(f.read(), source=path)
        except SeriesError as e:
            raise ContractError(f"{path}: {e}", e.reason) from None
    out = []
    for r in records:
        vals = np.asarray(r.values[0], dtype=np.float64)
        last, freq = None, None
        start = r.meta.get("start_timestamp")
        if start and r.freq in TSF_FREQ:
            freq = pd.tseries.frequencies.to_offset(TSF_FREQ[r.freq])
            day, _, clock = str(start).partition(" ")  # Monash writes "1979-01-01 00-00-00"
            first = pd.Timestamp(day + (" " + clock.replace("-", ":") if clock else ""))
            last = pd.date_range(first, periods=len(vals), freq=freq)[-1]
        out.append(InputSeries(r.series_id, None, vals, path, last, freq, {"freq": r.freq} if r.freq else {}))
    names = Names("series_id", "timestamp" if out and out[0].last is not None else None, "value", None)
    return names, out


def read_inputs(paths: list[str]) -> tuple[Names, list[InputSeries], list[Refused]]:
    """Every (series, channel) of the files on a regular grid, and the files / series refused with their reason (a
    file that does not read, irregular timestamps, a series without a finite value …). The same id in two files,
    or files with different column names, raise ContractError: the output could not say which is which."""
    names: Names | None = None
    seen: dict[Any, str] = {}
    out: list[InputSeries] = []
    refused: list[Refused] = []
    for path in paths:
        try:
            file_names, series = _read_one(path)
        except ContractError as e:
            refused.append(Refused(path, e.reason, str(e)))
            continue
        for s in [s for s in series if not np.isfinite(s.values).any()]:
            refused.append(Refused(path, "no_finite_value", f"series {s.id!r} ({path}): no finite value"))
        series = [s for s in series if np.isfinite(s.values).any()]
        if names is not None and (names.id, names.time, names.value) != (
            file_names.id,
            file_names.time,
            file_names.value,
        ):
            raise ContractError(f"{path}: columns differ from the first file's ({names} vs {file_names})", "columns")
        # a channel column in some files only: the output has it, empty for the others' series
        names = Names(file_names.id, file_names.time, file_names.value, names.channel if names else None)
        names.channel = names.channel or file_names.channel
        for s in series:
            other = seen.get(s.id)
            if other is not None and other != path:
                raise ContractError(f"series id {s.id!r} is in two files: {other} and {path}", "duplicate_id")
            seen[s.id] = path
        out += series
    if names is None:
        names = Names("series_id", None, "value", None)
    return names, out, refused


def _read_one(path: str) -> tuple[Names, list[InputSeries]]:
    if path.lower().endswith(".tsf"):
        return _tsf(path)
    try:
        df = _read_frame(path)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise ContractError(f"{path}: unreadable ({str(e)[:200]})", "unreadable") from None
    except Exception as e:  # pyarrow's parquet errors are not ValueErrors; the file, not the run, is at fault
        raise ContractError(f"{path}: unreadable ({type(e).__name__}: {str(e)[:200]})", "unreadable") from None
    if df.empty:
        raise ContractError(f"{path}: no rows", "empty")
    names = _names(df, path)
    return names, _series_of(df, names, path)


def _series_of(df: pd.DataFrame, names: Names, path: str) -> list[InputSeries]:
    try:
        values = pd.to_numeric(df[names.value], errors="raise").astype(np.float64)
    except (ValueError, TypeError) as e:
        raise ContractError(f"{path}: non-numeric value ({str(e)[:120]})", "non_numeric_values") from None
    frame = pd.DataFrame({"v": values})
    frame["id"] = df[names.id] if names.id else "0"
    frame["ch"] = df[names.channel] if names.channel else None
    if names.time:
        frame["t"] = parse_times(df[names.time], path)
    out = []
    keys = ["id", "ch"] if names.channel else ["id"]
    for key, g in frame.groupby(keys, sort=False, dropna=False):
        sid, ch = (key[0], key[1]) if names.channel else (key[0] if isinstance(key, tuple) else key, None)
        label = f"{sid!r}" + (f" channel {ch!r}" if names.channel else "") + f" ({path})"
        if not names.time:
            out.append(InputSeries(sid, ch, g["v"].to_numpy(), path))
            continue
        g = g.sort_values("t", kind="stable")
        if g["t"].duplicated().any():
            dup = g["t"][g["t"].duplicated()].iloc[0]
            raise ContractError(f"series {label}: timestamp {dup} appears twice", "duplicate_timestamp")
        freq, pos = regular_grid(g["t"].reset_index(drop=True), label)
        vals = np.full(int(pos[-1]) + 1, np.nan)
        vals[pos] = g["v"].to_numpy()
        meta = {"inserted": int(vals.size - len(g))} if vals.size > len(g) else {}
        last = g["t"].iloc[-1]
        out.append(InputSeries(sid, ch, vals, path, int(last) if isinstance(freq, int) else last, freq, meta))
    return out


def forecast_table(
    names: Names, series: list[InputSeries], points: list[np.ndarray], quantiles: list[np.ndarray], levels
) -> pd.DataFrame:
    """Long output: [id], [channel], time (or ``step``), value, q0.1 … q0.9 — ``points[i] [H]``,
    ``quantiles[i] [H, K]``."""
    cols: dict[str, list] = {}
    if names.id:
        cols[names.id] = []
    if names.channel:
        cols[names.channel] = []
    tname = names.time or "step"
    cols[tname] = []
    cols[names.value] = []
    qnames = [f"q{lv:g}" for lv in levels]
    for q in qnames:
        cols[q] = []
    for s, p, q in zip(series, points, quantiles):
        h = len(p)
        if names.id:
            cols[names.id] += [s.id] * h
        if names.channel:
            cols[names.channel] += [s.channel] * h
        cols[tname] += s.future(h)
        cols[names.value] += np.asarray(p, dtype=np.float64).tolist()
        for k, qn in enumerate(qnames):
            cols[qn] += np.asarray(q, dtype=np.float64)[:, k].tolist()
    return pd.DataFrame(cols)


def write_table(table: pd.DataFrame, path: str) -> None:
    """CSV (timestamps ISO, date only when every time is midnight) or parquet, written atomically."""
    from formats.fs import open_output

    with open_output(path) as f:
        if path.lower().endswith(".parquet"):
            table.to_parquet(f, index=False)
            return
        out = table.copy()
        for c in out.columns:
            if pd.api.types.is_datetime64_any_dtype(out[c]):
                t = out[c]
                midnight = bool(((t - t.dt.normalize()) == pd.Timedelta(0)).all())
                out[c] = t.dt.strftime("%Y-%m-%d") if midnight and t.dt.tz is None else t.map(lambda x: x.isoformat())
        f.write(out.to_csv(index=False).encode("utf-8"))
