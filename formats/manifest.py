"""``OUT/manifest.json``: what a corpus build wrote, typed. Written by the job, read by the report, the
pre-training loader and the index job.

    from formats.manifest import Manifest
    m = Manifest.read("out")            # out/manifest.json
    print(m.totals.chunks, [s.file for s in m.shards])
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from formats import fs

MANIFEST_NAME = "manifest.json"
SHARDS_DIR = "shards"
QUARANTINE_DIR = "quarantine"


@dataclass(frozen=True)
class ShardEntry:
    """One shard file of the build."""

    file: str
    """File name inside ``OUT/shards``."""
    rows: int
    """Chunks in the file."""
    tokens: int
    """Tokens of those chunks, image tokens included."""
    sha256: str
    """Of the file's bytes."""
    bytes: int


@dataclass(frozen=True)
class QuarantineEntry:
    """One stage's dead-letter file ``OUT/quarantine/<stage>.jsonl``."""

    stage: str
    file: str
    count: int


@dataclass(frozen=True)
class Totals:
    """Every input file (a PDF or a series file) is exactly one of: in the shards, quarantined (a final dead letter
    at document level, duplicates included), or retryable: ``input_files = documents_in_shards + documents_quarantined +
    documents_retryable``."""

    input_files: int | None
    """Files the job was given (None when they could not be counted, e.g. remote globs)."""
    documents_in_shards: int
    documents_quarantined: int
    chunks: int
    tokens: int
    documents_retryable: int = 0
    """Documents that failed for an infrastructure reason and were not marked done (a rerun retries them)."""
    documents_failed: int = 0
    """Of the quarantined documents, those that failed for a content reason (duplicates are not failures)."""
    documents_filtered: int = 0
    """Of the quarantined documents, those removed by policy (duplicate, near-duplicate, benchmark overlap, no
    page above the visual-gain threshold): outcomes, not failures."""
    pages: int = 0
    """Pages of the documents that were opened and built (kept, dropped or filtered)."""
    pages_failed: int = 0
    """Page-level dead letters of a content failure (timeout, crash, backend or render error) in built documents."""
    pages_filtered: int = 0
    """Page-level dead letters of policy (visual gain below its threshold): outcomes, not failures."""
    series_files: int = 0
    """Of the documents in the shards, the series files (CSV/parquet/.tsf; a "document" is any input file)."""
    series: int = 0
    """Series records in the shards (a file may hold several)."""
    series_points: int = 0
    """Their values, channels × steps summed."""
    series_files_quarantined: int = 0
    """Of the quarantined documents, series files the reader rejected (stage ``series``)."""


@dataclass(frozen=True)
class Manifest:
    schema_version: str
    created_at: str
    inputs: list[str]
    config: dict[str, Any]
    """The build config (``BuildConfig.config_dict()``)."""
    config_hash: str
    """Keys resumption: a rerun with another config or parser version starts afresh."""
    parser_version: str
    parser_backends: dict[str, str]
    shards: list[ShardEntry]
    totals: Totals
    dropped_by_reason: dict[str, int]
    """``stage.reason`` → count over every dead letter."""
    quarantine: list[QuarantineEntry]
    metrics: dict[str, int]
    """Beam counters of the run."""
    elapsed_s: float
    visual_gain: dict[str, Any] | None = None
    """Per-domain ΔH histograms and kept/dropped counts, when the build scored pages."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Keys this version does not know (kept on read, written back)."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        extra = d.pop("extra")
        return {**d, **extra}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Manifest:
        known = {f.name for f in fields(cls)} - {"extra"}
        return cls(
            schema_version=str(d["schema_version"]),
            created_at=d.get("created_at", ""),
            inputs=list(d.get("inputs", [])),
            config=dict(d.get("config", {})),
            config_hash=d["config_hash"],
            parser_version=d.get("parser_version", ""),
            parser_backends=dict(d.get("parser_backends", {})),
            shards=[ShardEntry(**e) for e in d.get("shards", [])],
            totals=Totals(**d["totals"]),
            dropped_by_reason=dict(d.get("dropped_by_reason", {})),
            quarantine=[QuarantineEntry(**e) for e in d.get("quarantine", [])],
            metrics=dict(d.get("metrics", {})),
            elapsed_s=float(d.get("elapsed_s", 0.0)),
            visual_gain=d.get("visual_gain"),
            extra={k: v for k, v in d.items() if k not in known},
        )

    @staticmethod
    def path(out: str | os.PathLike[str]) -> str:
        return fs.join(out, MANIFEST_NAME)

    @classmethod
    def read(cls, out: str | os.PathLike[str]) -> Manifest:
        """The manifest of build output directory ``out``; a clear error when there is none."""
        path = cls.path(out)
        if not fs.exists(path):
            raise FileNotFoundError(f"{path} not found: run `scifolio build ... --out {out}` first")
        return cls.from_dict(json.loads(fs.read_text(path)))

    def write(self, out: str | os.PathLike[str]) -> str:
        path = self.path(out)
        fs.write_text(path, json.dumps(self.to_dict(), indent=2, default=str))
        return path
