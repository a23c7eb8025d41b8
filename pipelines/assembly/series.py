"""Series files in the corpus job (SPEC C10, issue 22 §3), Beam-free: one file's bytes → series rows + dead letters.

    from pipelines.assembly.series import SeriesBuilder
    result = SeriesBuilder(BuildConfig(tokenizer="tiny/tokenizer")).build(data, "data/sensors.csv")   # a DocResult

A file (CSV/parquet long table or Monash ``.tsf``, read by ``formats.series``) is one *document* of the build: its
id is the sha256 of its bytes, and each series in it becomes one shard row (``chunk_index`` = the series' rank in
sorted id order) holding the record (values, channels, sampling, (μ, σ), source, text context) in the ``series``
part and its segments: the context's tokens (cut to fit the chunk cap) then one atomic ``series`` segment whose
``n_tokens`` is the encoder's token count at ``BuildConfig.series_budget``. A file that does not read, or whose
series hold no finite value at all, is quarantined (stage ``series``) with its reason, like a bad PDF. A timestamp
column that does not parse keeps row order: a warning in the log, the record's meta and the build's metrics,
never a quarantine.

The corpus job (``pipelines/jobs/corpus.py``) runs this in its ``ProcessSeries`` step; ``scifolio build DIR`` takes
every ``.csv``/``.parquet``/``.tsf`` below DIR beside the PDFs.
"""

from __future__ import annotations

import hashlib
import logging
import math
from typing import Any

from formats.records import Dropped
from formats.series import STAGE, SeriesRecord, read_series_bytes, series_token_count
from formats.shards import ChunkRow, Segment
from pipelines.assembly.build import BuildConfig, DocResult, is_infrastructure_error
from pipelines.assembly.interleave import Tokenizer

log = logging.getLogger(__name__)


def pandas_timestamps(strings: list[str]) -> list[float] | None:
    """Anything pandas parses as a date → epoch seconds; None when a value does not parse."""
    import pandas as pd

    try:
        ts = pd.to_datetime(pd.Series(strings), errors="raise", format="mixed")
    except (ValueError, TypeError, OverflowError):
        return None
    return (ts.astype("int64") / 1e9).tolist()


def has_finite(record: SeriesRecord) -> bool:
    return any(math.isfinite(v) for ch in record.values for v in ch)


class SeriesBuilder:
    """One series file's bytes → shard rows. Build once per worker (it loads the tokenizer for the contexts)."""

    def __init__(self, config: BuildConfig, tokenizer: Tokenizer | None = None) -> None:
        self.config = config
        self.tokenizer = tokenizer or Tokenizer(config.tokenizer)

    def build(self, data: bytes, source: str) -> DocResult:
        """Rows of every series in the file, or its dead letter. An unexpected error is a property of the file (a
        final dead letter, reason ``error``, with the traceback), so one bad file never fails the job; an
        infrastructure failure (memory, I/O) raises for the job's retry."""
        try:
            return self._build(data, source)
        except Exception as e:
            if is_infrastructure_error(e):
                raise
            import traceback

            doc_id = hashlib.sha256(data).hexdigest()
            detail = {"source": source, "error": repr(e), "traceback": traceback.format_exc(limit=8)}
            return DocResult(doc_id, source, [], [Dropped(doc_id, STAGE, "error", detail)], {})

    def _build(self, data: bytes, source: str) -> DocResult:
        doc_id = hashlib.sha256(data).hexdigest()
        records, dropped = read_series_bytes(data, source, parse_timestamps=pandas_timestamps)
        if dropped:  # the reader names the path; the build names the file by its content id, like a PDF
            return DocResult(doc_id, source, [], [_rekey(d, doc_id, source) for d in dropped], {})
        usable = [r for r in records if has_finite(r)]
        if not usable:
            detail = {"source": source, "series": len(records), "error": "no finite value in any series"}
            return DocResult(doc_id, source, [], [Dropped(doc_id, STAGE, "no_finite_values", detail)], {})
        stats: dict[str, int] = {"series_files": 1, "series": 0, "series_points": 0, "series_dropped_empty": 0}
        stats["series_dropped_empty"] = len(records) - len(usable)
        rows = []
        for index, record in enumerate(sorted(usable, key=lambda r: r.series_id)):
            warning = record.meta.get("warning")
            if warning:
                log.warning("%s: %s", source, warning)
                stats["series_warnings.timestamp_row_order"] = stats.get("series_warnings.timestamp_row_order", 0) + 1
            rows.append(self.row(doc_id, index, record, source).to_row())
            stats["series"] += 1
            stats["series_points"] += record.length * len(record.channels)
        stats["chunks"] = len(rows)
        stats["tokens"] = sum(r["n_tokens"] for r in rows)
        return DocResult(doc_id, source, rows, [], stats)

    def row(self, doc_id: str, index: int, record: SeriesRecord, source: str) -> ChunkRow:
        """The record's shard row: context tokens (what fits beside the series in a chunk), then the series."""
        cfg = self.config
        q = cfg.series_queries
        budget = max(q, min(cfg.series_budget, cfg.max_tokens) // q * q)  # a series never exceeds the chunk cap
        n_series = series_token_count(record.length, budget, q)
        segments = []
        if record.context.strip():
            ids, offsets = self.tokenizer.encode_batch([record.context])[0]
            keep = max(0, cfg.max_tokens - n_series)
            text = record.context if keep >= len(ids) else record.context[: offsets[keep]]
            if ids[:keep]:
                segments.append(
                    Segment(kind="text", n_tokens=len(ids[:keep]), page_index=0, text=text, token_ids=tuple(ids[:keep]))
                )
        segments.append(Segment(kind="series", n_tokens=n_series, page_index=0, series_id=record.series_id))
        meta: dict[str, Any] = {
            "source": source,
            "kind": "series",
            "name": record.meta.get("name", record.series_id),
            "length": record.length,
            "channels": len(record.channels),
        }
        if record.meta.get("warning"):
            meta["warning"] = record.meta["warning"]
        return ChunkRow(doc_id=doc_id, chunk_index=index, segments=tuple(segments), series=(record,), meta=meta)


def _rekey(d: Dropped, doc_id: str, source: str) -> Dropped:
    return Dropped(doc_id, d.stage, d.reason, {"source": source, **dict(d.detail)})
