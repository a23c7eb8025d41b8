"""Shard schema and writer: one parquet row per chunk, self-contained (no Beam import).

A shard never needs another file to be read: the chunk's segments carry token ids, its images carry
their PNG bytes, and optional page renders feed the next-patch pre-training objective.

    import pyarrow.parquet as pq
    table = pq.read_table("out/shards/shard-00000-of-00001.parquet")
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA_VERSION = "1"

SEGMENT_TYPE = pa.struct(
    [
        ("kind", pa.string()),  # "text" | "image"
        ("text", pa.string()),
        ("token_ids", pa.list_(pa.uint32())),
        ("image_sha256", pa.string()),
        ("n_tokens", pa.int64()),
        ("page_index", pa.int32()),
    ]
)
IMAGE_TYPE = pa.struct(
    [
        ("sha256", pa.string()),
        ("png", pa.binary()),
        ("width", pa.int32()),
        ("height", pa.int32()),
        ("kind", pa.string()),  # figure | table | equation
    ]
)
PAGE_RENDER_TYPE = pa.struct(
    [
        ("page_index", pa.int32()),
        ("png", pa.binary()),
        ("width", pa.int32()),
        ("height", pa.int32()),
        ("dpi", pa.int32()),
    ]
)
# Per-page provenance of the pages a chunk touches: parser backend and stage scores (JSON).
PAGE_INFO_TYPE = pa.struct([("page_index", pa.int32()), ("parser", pa.string()), ("scores", pa.string())])

SHARD_SCHEMA = pa.schema(
    [
        ("chunk_id", pa.string()),
        ("doc_id", pa.string()),
        ("chunk_index", pa.int32()),
        ("n_tokens", pa.int64()),
        ("segments", pa.list_(SEGMENT_TYPE)),
        ("images", pa.list_(IMAGE_TYPE)),
        ("page_renders", pa.list_(PAGE_RENDER_TYPE)),
        ("pages", pa.list_(PAGE_INFO_TYPE)),
        ("sample_weight", pa.float32()),
        ("meta", pa.string()),
    ],
    metadata={"scifolio.schema_version": SCHEMA_VERSION},
)


@dataclass(frozen=True)
class Segment:
    """A run of text tokens or one atomic image, with the page it came from."""

    kind: str  # "text" | "image"
    n_tokens: int
    page_index: int
    text: str = ""
    token_ids: tuple[int, ...] = ()
    image_sha256: str | None = None

    def to_row(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "text": self.text,
            "token_ids": list(self.token_ids),
            "image_sha256": self.image_sha256,
            "n_tokens": self.n_tokens,
            "page_index": self.page_index,
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Segment:
        return cls(
            kind=row["kind"],
            n_tokens=int(row["n_tokens"]),
            page_index=int(row["page_index"]),
            text=row.get("text") or "",
            token_ids=tuple(row.get("token_ids") or ()),
            image_sha256=row.get("image_sha256"),
        )


@dataclass(frozen=True)
class ChunkRow:
    """One shard row. ``images`` holds every image a segment references, PNG bytes included."""

    doc_id: str
    chunk_index: int
    segments: tuple[Segment, ...]
    images: tuple[Mapping[str, Any], ...] = ()
    page_renders: tuple[Mapping[str, Any], ...] = ()
    pages: tuple[Mapping[str, Any], ...] = ()
    sample_weight: float = 1.0
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def chunk_id(self) -> str:
        return f"{self.doc_id}:{self.chunk_index}"

    @property
    def n_tokens(self) -> int:
        return sum(s.n_tokens for s in self.segments)

    def to_row(self) -> dict[str, Any]:
        return {
            "chunk_id": self.chunk_id,
            "doc_id": self.doc_id,
            "chunk_index": self.chunk_index,
            "n_tokens": self.n_tokens,
            "segments": [s.to_row() for s in self.segments],
            "images": [dict(i) for i in self.images],
            "page_renders": [dict(r) for r in self.page_renders],
            "pages": [dict(p) for p in self.pages],
            "sample_weight": float(self.sample_weight),
            "meta": json.dumps(dict(self.meta), sort_keys=True, default=str),
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ChunkRow:
        return cls(
            doc_id=row["doc_id"],
            chunk_index=int(row["chunk_index"]),
            segments=tuple(Segment.from_row(s) for s in row["segments"]),
            images=tuple(row.get("images") or ()),
            page_renders=tuple(row.get("page_renders") or ()),
            pages=tuple(row.get("pages") or ()),
            sample_weight=float(row.get("sample_weight", 1.0)),
            meta=json.loads(row["meta"]) if row.get("meta") else {},
        )


def rows_to_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=SHARD_SCHEMA)


def file_sha256(path: str | os.PathLike[str], bufsize: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(bufsize):
            h.update(chunk)
    return h.hexdigest()


def write_shard(
    path: str | os.PathLike[str], rows: Iterable[Mapping[str, Any]], row_group_size: int = 64
) -> dict[str, Any]:
    """Write rows to ``path`` atomically (tmp file + rename) and return its manifest entry."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = list(rows)
    table = rows_to_table(rows)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    pq.write_table(table, tmp, row_group_size=row_group_size, compression="zstd")
    os.replace(tmp, path)
    return {
        "file": path.name,
        "rows": table.num_rows,
        "tokens": int(sum(r["n_tokens"] for r in rows)),
        "sha256": file_sha256(path),
        "bytes": path.stat().st_size,
    }


def read_shard(path: str | os.PathLike[str], columns: Sequence[str] | None = None) -> pa.Table:
    return pq.read_table(path, columns=list(columns) if columns else None, schema=SHARD_SCHEMA if not columns else None)


def iter_chunks(path: str | os.PathLike[str]) -> Iterable[ChunkRow]:
    pf = pq.ParquetFile(path)
    for batch in pf.iter_batches(batch_size=16):
        for row in batch.to_pylist():
            yield ChunkRow.from_row(row)
