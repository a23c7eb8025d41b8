"""Series files → series records (SPEC C10, issue 22 §3): CSV/parquet long tables and Monash ``.tsf``.

    from formats.series import read_series_file
    records, dropped = read_series_file("data/sensors.csv")     # ([SeriesRecord], [Dropped])
    write_series("out/series/part-00000.parquet", records)

Tables: one row per observation, ``series_id, value`` in time order, optional ``channel`` (a series is multichannel
when rows carry several channel names), ``context`` (text about the series: its first non-empty cell is kept) and
``timestamp`` (an integer index, or a string pyarrow parses as a
timestamp; the caller may pass ``parse_timestamps`` — e.g. pandas' ``to_datetime`` — for anything else). A
timestamp column that does not parse falls back to row order with a warning in the record's ``meta``; it never
quarantines the file. A file that cannot be read, has no ``series_id``/``value`` columns, non-numeric values or no
observations becomes a ``Dropped`` with a reason (stage ``series``), like a bad PDF.

``.tsf`` header comments (``# ...`` lines before ``@data``) become every series' text context. The corpus job
(``scifolio build``) stores records in the shards (``formats/shards.py``, a ``series`` part) with
``read_series_bytes``; ``scifolio timeseries`` reads files with ``read_series_file``.

Stdlib + pyarrow only: every stage (and worker image) can import it.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from formats import fs
from formats.records import Dropped, sha256_hex

STAGE = "series"
SERIES_SUFFIXES = (".csv", ".parquet", ".tsf")
# Seconds per step of Monash/pandas frequency names (months and years are mean lengths).
FREQ_SECONDS: dict[str, float] = {
    "yearly": 365.25 * 86400,
    "quarterly": 91.3125 * 86400,
    "monthly": 30.4375 * 86400,
    "weekly": 7 * 86400,
    "daily": 86400,
    "hourly": 3600,
    "half_hourly": 1800,
    "minutely": 60,
    "4_seconds": 4,
    "10_minutes": 600,
}
# The seasonal period MASE uses for each frequency (Monash's convention).
FREQ_SEASON: dict[str, int] = {
    "yearly": 1,
    "quarterly": 4,
    "monthly": 12,
    "weekly": 1,
    "daily": 7,
    "hourly": 24,
    "half_hourly": 48,
    "minutely": 60,
    "10_minutes": 144,
    "4_seconds": 1,
}

SERIES_SCHEMA = pa.schema(
    [
        ("series_id", pa.string()),
        ("values", pa.list_(pa.list_(pa.float64()))),
        ("channels", pa.list_(pa.string())),
        ("freq", pa.string()),
        ("sampling_period_s", pa.float64()),
        ("mu", pa.list_(pa.float64())),
        ("sigma", pa.list_(pa.float64())),
        ("source", pa.string()),
        ("context", pa.string()),
        ("meta", pa.string()),
    ]
)


@dataclass(frozen=True)
class SeriesRecord:
    """One (possibly multichannel) series: ``values[c][t]`` (NaN = missing), channel names, sampling, per-channel
    (μ, σ) over the finite values, where it came from and an optional text context."""

    series_id: str
    values: tuple[tuple[float, ...], ...]
    channels: tuple[str, ...]
    source: str
    freq: str = ""
    sampling_period_s: float | None = None
    context: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return max((len(v) for v in self.values), default=0)

    @property
    def season(self) -> int:
        return FREQ_SEASON.get(self.freq, 1)

    def stats(self) -> tuple[list[float], list[float]]:
        """Per-channel (μ, σ) over finite values (population σ; NaN for a channel with none). Moments are taken of
        x / max|x| and scaled back, so values near 1e300 do not overflow the squares."""
        mus, sigmas = [], []
        for ch in self.values:
            fin = [v for v in ch if math.isfinite(v)]
            if not fin:
                mus.append(math.nan)
                sigmas.append(math.nan)
                continue
            peak = max(abs(v) for v in fin) or 1.0
            mu_s = math.fsum(v / peak for v in fin) / len(fin)
            mus.append(mu_s * peak)
            sigmas.append(math.sqrt(math.fsum((v / peak - mu_s) ** 2 for v in fin) / len(fin)) * peak)
        return mus, sigmas

    def to_row(self) -> dict[str, Any]:
        mu, sigma = self.stats()
        return {
            "series_id": self.series_id,
            "values": [list(v) for v in self.values],
            "channels": list(self.channels),
            "freq": self.freq,
            "sampling_period_s": self.sampling_period_s,
            "mu": mu,
            "sigma": sigma,
            "source": self.source,
            "context": self.context,
            "meta": json.dumps(dict(self.meta), sort_keys=True, default=str),
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> SeriesRecord:
        return cls(
            series_id=row["series_id"],
            values=tuple(tuple(float("nan") if v is None else float(v) for v in ch) for ch in row["values"]),
            channels=tuple(row["channels"]),
            source=row.get("source") or "",
            freq=row.get("freq") or "",
            sampling_period_s=row.get("sampling_period_s"),
            context=row.get("context") or "",
            meta=json.loads(row.get("meta") or "{}"),
        )


def series_token_count(length: int, budget: int, queries: int) -> int:
    """Tokens the series encoder makes of a length-T series: Q per patch of L = ⌈Q·T/budget⌉ points, so never more
    than ``budget`` (SPEC C10; the same arithmetic as ``pretrain.timeseries.encoder.token_count``, which a test
    checks). The corpus job counts a series segment's ``n_tokens`` with it."""
    t = max(1, int(length))
    patch = max(1, -(-queries * t // budget))
    return queries * max(1, -(-t // patch))


def is_series_file(path: str) -> bool:
    return path.lower().endswith(SERIES_SUFFIXES)


def read_series_file(
    path: str | os.PathLike[str], parse_timestamps: Callable[[list[str]], list[float] | None] | None = None
) -> tuple[list[SeriesRecord], list[Dropped]]:
    """Every series in a file, or the reason the file was dropped (never raises for a bad file)."""
    path = str(path)
    try:
        data = fs.read_bytes(path)
    except (OSError, ValueError) as e:
        return [], [Dropped(path, STAGE, "unreadable", {"error": str(e)[:300]})]
    return read_series_bytes(data, path, parse_timestamps)


def read_series_bytes(
    data: bytes, path: str, parse_timestamps: Callable[[list[str]], list[float] | None] | None = None
) -> tuple[list[SeriesRecord], list[Dropped]]:
    """:func:`read_series_file` on bytes already read (the corpus job reads them once, to hash them too); the
    format follows ``path``'s suffix. Dead letters name ``path``."""
    item = path
    file_id = sha256_hex(data)[:16]
    try:
        if path.lower().endswith(".tsf"):
            return parse_tsf(data.decode("utf-8", errors="replace"), source=path), []
        if path.lower().endswith(".parquet"):
            table = pq.read_table(pa.BufferReader(data))
        else:
            table = pcsv.read_csv(pa.BufferReader(data))
        records = table_to_records(table, source=path, parse_timestamps=parse_timestamps, file_id=file_id)
    except SeriesError as e:
        return [], [Dropped(item, STAGE, e.reason, {"error": str(e)[:300]})]
    except (pa.ArrowException, UnicodeDecodeError, ValueError) as e:
        return [], [Dropped(item, STAGE, "unparseable", {"error": str(e)[:300]})]
    return records, []


class SeriesError(ValueError):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def table_to_records(
    table: pa.Table,
    source: str,
    parse_timestamps: Callable[[list[str]], list[float] | None] | None = None,
    file_id: str = "",
) -> list[SeriesRecord]:
    """A long table (``series_id, value[, timestamp][, channel]``) → records, grouped by series then channel (both
    in sorted order). Sorting and grouping run in Arrow, so a 10⁷-row file costs its values once as Python floats."""
    names = {n.lower(): n for n in table.column_names}
    if "value" not in names:
        raise SeriesError("no_value_column", f"columns {table.column_names}: need 'value'")
    n = table.num_rows
    if n == 0:
        raise SeriesError("empty", "no rows")
    try:
        values = pc.cast(table[names["value"]], pa.float64())
    except pa.ArrowInvalid as e:
        raise SeriesError("non_numeric_values", str(e)) from None

    def text(col: str, fill: str) -> pa.ChunkedArray | pa.Array:
        if col not in names:
            return pc.fill_null(pa.nulls(n, pa.string()), fill)
        return pc.fill_null(table[names[col]].cast(pa.string()), fill)

    meta: dict[str, Any] = {}
    order = None
    if "timestamp" in names:
        order = _timestamps(table[names["timestamp"]], parse_timestamps)
        if order is None:
            meta["warning"] = "timestamp column did not parse; kept row order"
    rows = pa.array(range(n), pa.int64())
    keyed = pa.table(
        {
            "sid": text("series_id", "0"),
            "ch": text("channel", "value"),
            "ord": order if order is not None else pc.cast(rows, pa.float64()),
            "row": rows,
            "v": values,
            "ctx": text("context", ""),
        }
    ).sort_by([("sid", "ascending"), ("ch", "ascending"), ("ord", "ascending"), ("row", "ascending")])
    sid_col, ch_col = keyed["sid"].combine_chunks(), keyed["ch"].combine_chunks()
    key = pc.binary_join_element_wise(pc.cast(sid_col, pa.string()), pc.cast(ch_col, pa.string()), "\x00")
    runs = pc.run_end_encode(key)
    ends = runs.run_ends.to_pylist()
    v_col, ord_col = keyed["v"].combine_chunks(), keyed["ord"].combine_chunks()
    ctx_col = keyed["ctx"].combine_chunks()
    contexts: dict[str, str] = {}
    is_time = "timestamp" in names and _is_time(table[names["timestamp"]])
    groups: dict[str, list[tuple[str, tuple[float, ...], pa.Array]]] = {}
    start = 0
    for end in ends:
        sid, ch = sid_col[start].as_py(), ch_col[start].as_py()
        vals = tuple(math.nan if v is None else v for v in v_col.slice(start, end - start).to_pylist())
        groups.setdefault(sid, []).append((ch, vals, ord_col.slice(start, end - start)))
        if "context" in names and not contexts.get(sid):  # the series' first non-empty `context` cell
            found = pc.filter(ctx := ctx_col.slice(start, end - start), pc.not_equal(ctx, ""))
            contexts[sid] = found[0].as_py() if len(found) else ""
        start = end
    records = []
    for sid, chans in groups.items():
        t_len = max(len(v) for _, v, _ in chans)
        cols = tuple(v + (math.nan,) * (t_len - len(v)) for _, v, _ in chans)  # ragged channels: NaN-padded at the end
        rec_meta = dict(meta)
        period = None
        if order is not None and len(chans[0][2]) > 1:
            o = chans[0][2]
            diffs = pc.filter(d := pc.subtract(o.slice(1), o.slice(0, len(o) - 1)), pc.greater(d, 0))
            if len(diffs):
                period = pc.quantile(diffs, q=0.5, interpolation="higher")[0].as_py()
                rec_meta["timestamp_unit"] = "s" if is_time else "index"
        if not any(math.isfinite(v) for c in cols for v in c):
            rec_meta["warning_values"] = "no finite value"
        records.append(
            SeriesRecord(
                series_id=f"{file_id}:{sid}" if file_id else sid,
                values=cols,
                channels=tuple(ch for ch, _, _ in chans),
                source=source,
                sampling_period_s=period if rec_meta.get("timestamp_unit") == "s" else None,
                context=contexts.get(sid, ""),
                meta={**rec_meta, "name": sid},
            )
        )
    return records


def _is_time(col: pa.ChunkedArray) -> bool:
    return not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type))


def _timestamps(
    col: pa.ChunkedArray, parse: Callable[[list[str]], list[float] | None] | None
) -> pa.ChunkedArray | pa.Array | None:
    """Sort keys (float64): integers as they are, timestamps as epoch seconds; None when the column does not parse."""
    if pa.types.is_integer(col.type) or pa.types.is_floating(col.type):
        return None if col.null_count else pc.cast(col, pa.float64())
    if pa.types.is_timestamp(col.type) or pa.types.is_date(col.type):
        secs = pc.cast(pc.cast(col, pa.timestamp("s")), pa.int64())
        return None if secs.null_count else pc.cast(secs, pa.float64())
    strings = col.cast(pa.string())
    try:
        secs = pc.cast(pc.cast(strings, pa.timestamp("s")), pa.int64())
        if not secs.null_count:
            return pc.cast(secs, pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    if parse is not None:
        try:
            parsed = parse(strings.to_pylist())
        except (ValueError, TypeError, OverflowError):
            return None
        return None if parsed is None else pa.array(parsed, pa.float64())
    return None


_TSF_ATTR = re.compile(r"^@(\w+)\s*(.*)$")


def parse_tsf(text: str, source: str = "") -> list[SeriesRecord]:
    """Monash ``.tsf``: ``@attribute`` lines name the fields before the series, ``@frequency``/``@horizon`` apply to
    all, ``@data`` is followed by ``attr1:attr2:...:v1,v2,...`` lines (``?`` = missing)."""
    attrs: list[str] = []
    freq, horizon = "", None
    records: list[SeriesRecord] = []
    comments: list[str] = []  # the header's comment lines: the series' text context
    in_data = False
    for n, raw in enumerate(text.splitlines()):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            if not in_data and line.lstrip("#").strip():
                comments.append(line.lstrip("#").strip())
            continue
        if not in_data:
            m = _TSF_ATTR.match(line)
            if not m:
                raise SeriesError("bad_tsf_header", f"line {n + 1}: {line[:60]!r}")
            key, rest = m.group(1).lower(), m.group(2).strip()
            if key == "attribute":
                attrs.append(rest.split()[0])
            elif key == "frequency":
                freq = rest
            elif key == "horizon":
                horizon = int(rest)
            elif key == "data":
                in_data = True
            continue
        parts = line.split(":", len(attrs))
        if len(parts) != len(attrs) + 1:
            raise SeriesError("bad_tsf_row", f"line {n + 1}: expected {len(attrs)} attributes before the values")
        fields = dict(zip(attrs, parts[:-1]))
        try:
            vals = tuple(math.nan if v.strip() == "?" else float(v) for v in parts[-1].split(","))
        except ValueError as e:
            raise SeriesError("non_numeric_values", f"line {n + 1}: {e}") from None
        name = fields.get("series_name", str(len(records)))
        records.append(
            SeriesRecord(
                series_id=name,
                values=(vals,),
                channels=("value",),
                source=source,
                freq=freq,
                sampling_period_s=FREQ_SECONDS.get(freq),
                context=" ".join(comments)[:2000],
                meta={k: v for k, v in fields.items() if k != "series_name"}
                | ({"horizon": horizon} if horizon else {}),
            )
        )
    if not in_data:
        raise SeriesError("bad_tsf_header", "no @data line")
    if not records:
        raise SeriesError("empty", "no series after @data")
    return records


def records_to_table(records: Iterable[SeriesRecord]) -> pa.Table:
    return pa.Table.from_pylist([r.to_row() for r in records], schema=SERIES_SCHEMA)


def write_series(path: str | os.PathLike[str], records: Sequence[SeriesRecord]) -> dict[str, Any]:
    """One parquet file of series records, committed whole (``fs.open_output`` is atomic)."""
    table = records_to_table(records)
    with fs.open_output(path) as f:
        pq.write_table(table, f, compression="zstd")
    return {"file": os.path.basename(str(path)), "series": table.num_rows}


def read_series(path: str | os.PathLike[str]) -> list[SeriesRecord]:
    with fs.open_input(path) as f:
        table = pq.read_table(f, schema=SERIES_SCHEMA)
    return [SeriesRecord.from_row(r) for r in table.to_pylist()]
