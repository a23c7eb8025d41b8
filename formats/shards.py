"""The corpus shard format: one parquet row per chunk, self-contained; its schema, writer, lister and reader.

A shard never needs another file to be read: the chunk's segments carry token ids, its images carry
their PNG bytes, and optional page renders feed the next-patch pre-training objective.

Every consumer (retrieval, pre-training, the report, the index job) reads shards through this module: it
names a build output directory ``OUT`` (the folder given to ``scifolio build --out``, holding
``manifest.json`` and ``shards/``), lists its shards with :func:`list_shards` and reads typed rows with
:class:`ShardFile`. No module outside ``formats/`` names a shard column.

    from formats.shards import ShardFile, list_shards
    for path in list_shards("out"):
        for chunk in ShardFile(path).iter_chunks(parts=("segments", "images")):
            print(chunk.chunk_id, chunk.n_tokens, [i.sha256 for i in chunk.images])
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from formats import fs
from formats.manifest import MANIFEST_NAME, SHARDS_DIR, Manifest
from formats.series import SERIES_SCHEMA, SeriesRecord

SCHEMA_VERSION = "4"
"""2: page provenance carries the page size and its layout boxes. 3: series rows: a ``series`` column of series
records (``formats/series.py``) and segments of kind ``series`` naming one by ``series_id``. 4: an equation image
keeps its known text and where it came from (``ShardImage.text``, ``text_from``). Older files read unchanged (the
new columns and fields come back empty)."""

SEGMENT_TYPE = pa.struct(
    [
        ("kind", pa.string()),  # "text" | "image" | "series"
        ("text", pa.string()),
        ("token_ids", pa.list_(pa.uint32())),
        ("image_sha256", pa.string()),
        ("n_tokens", pa.int64()),
        ("page_index", pa.int32()),
        ("series_id", pa.string()),  # kind "series": the row's series record it stands for (schema 3)
    ]
)
# A series record (values per channel, channels, sampling, (mu, sigma), source, text context) as a struct.
SERIES_TYPE = pa.struct(list(SERIES_SCHEMA))
IMAGE_TYPE = pa.struct(
    [
        ("sha256", pa.string()),
        ("png", pa.binary()),
        ("width", pa.int32()),
        ("height", pa.int32()),
        ("kind", pa.string()),  # figure | table | equation
        ("text", pa.string()),  # an equation's known text (schema 4)
        ("text_from", pa.string()),  # latex | backend | text-layer-math | ocr (schema 4)
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
PAGE_INFO_TYPE = pa.struct(
    [
        ("page_index", pa.int32()),
        ("parser", pa.string()),
        ("scores", pa.string()),  # JSON of Page.scores
        ("width", pa.float32()),  # PDF points
        ("height", pa.float32()),
        ("blocks", pa.string()),  # JSON list of {kind, bbox, crop}: the page's layout boxes in reading order
    ]
)

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
        ("series", pa.list_(SERIES_TYPE)),
        ("sample_weight", pa.float32()),
        ("meta", pa.string()),
    ],
    metadata={"scifolio.schema_version": SCHEMA_VERSION},
)


@dataclass(frozen=True)
class Segment:
    """A run of text tokens, one atomic image or one atomic series, with the page it came from (0 for a series)."""

    kind: str  # "text" | "image" | "series"
    n_tokens: int
    page_index: int
    text: str = ""
    token_ids: tuple[int, ...] = ()
    image_sha256: str | None = None
    series_id: str | None = None

    def to_row(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "text": self.text,
            "token_ids": list(self.token_ids),
            "image_sha256": self.image_sha256,
            "n_tokens": self.n_tokens,
            "page_index": self.page_index,
            "series_id": self.series_id,
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
            series_id=row.get("series_id"),
        )


@dataclass(frozen=True)
class ShardImage:
    """An image a chunk's segments reference, PNG bytes included."""

    sha256: str
    png: bytes
    width: int
    height: int
    kind: str  # figure | table | equation
    text: str = ""
    """An equation's text where the parse knew it (its text is replaced by the image in the segments): the backend's
    LaTeX, the glyphs of the PDF's text layer, or OCR's reading; empty otherwise."""
    text_from: str = ""
    """Where ``text`` came from: ``latex``, ``backend``, ``text-layer-math`` or ``ocr`` (``Block.text_from``)."""

    def to_row(self) -> dict[str, Any]:
        return {
            "sha256": self.sha256,
            "png": self.png,
            "width": self.width,
            "height": self.height,
            "kind": self.kind,
            "text": self.text,
            "text_from": self.text_from,
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ShardImage:
        return cls(
            row["sha256"],
            bytes(row["png"]),
            int(row["width"]),
            int(row["height"]),
            row.get("kind") or "",
            row.get("text") or "",
            row.get("text_from") or "",
        )


@dataclass(frozen=True)
class PageRender:
    """A whole-page render (``scifolio build --page-renders``), input of the next-patch objective."""

    page_index: int
    png: bytes
    width: int
    height: int
    dpi: int

    def to_row(self) -> dict[str, Any]:
        return {
            "page_index": self.page_index,
            "png": self.png,
            "width": self.width,
            "height": self.height,
            "dpi": self.dpi,
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> PageRender:
        return cls(int(row["page_index"]), bytes(row["png"]), int(row["width"]), int(row["height"]), int(row["dpi"]))


@dataclass(frozen=True)
class LayoutBox:
    """One block of a parsed page as the report draws it."""

    kind: str
    bbox: tuple[float, float, float, float]
    crop: str | None = None
    """sha256 of the block's crop, when it was cropped."""


@dataclass(frozen=True)
class PageInfo:
    """Provenance of a page a chunk touches: parser backend, stage scores (``Page.scores``), size and boxes."""

    page_index: int
    parser: str
    scores: Mapping[str, Any] = field(default_factory=dict)
    width: float = 0.0
    height: float = 0.0
    blocks: tuple[LayoutBox, ...] = ()

    def to_row(self) -> dict[str, Any]:
        return {
            "page_index": self.page_index,
            "parser": self.parser,
            "scores": json.dumps(dict(self.scores), default=str),
            "width": self.width,
            "height": self.height,
            "blocks": json.dumps([{"kind": b.kind, "bbox": list(b.bbox), "crop": b.crop} for b in self.blocks]),
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> PageInfo:
        blocks = tuple(
            LayoutBox(b["kind"], tuple(b["bbox"]), b.get("crop")) for b in json.loads(row.get("blocks") or "[]")
        )
        return cls(
            int(row["page_index"]),
            row.get("parser") or "",
            json.loads(row.get("scores") or "{}"),
            float(row.get("width") or 0.0),
            float(row.get("height") or 0.0),
            blocks,
        )


@dataclass(frozen=True)
class ChunkRow:
    """One shard row. ``images`` holds every image a segment references, PNG bytes included."""

    doc_id: str
    chunk_index: int
    segments: tuple[Segment, ...]
    images: tuple[ShardImage, ...] = ()
    page_renders: tuple[PageRender, ...] = ()
    pages: tuple[PageInfo, ...] = ()
    series: tuple[SeriesRecord, ...] = ()
    """The series records the row's ``series`` segments name (a series row from ``scifolio build``)."""
    sample_weight: float = 1.0
    meta: Mapping[str, Any] = field(default_factory=dict)
    n_tokens_stored: int | None = None
    """``n_tokens`` as read from a shard (set by the reader when segments were not read)."""

    @property
    def chunk_id(self) -> str:
        return chunk_id(self.doc_id, self.chunk_index)

    @property
    def n_tokens(self) -> int:
        if self.n_tokens_stored is not None:
            return self.n_tokens_stored
        return sum(s.n_tokens for s in self.segments)

    def image_ids(self) -> list[str]:
        """sha256 of every image segment, in order."""
        return [s.image_sha256 for s in self.segments if s.kind == "image" and s.image_sha256]

    def to_row(self) -> dict[str, Any]:
        return {
            "chunk_id": self.chunk_id,
            "doc_id": self.doc_id,
            "chunk_index": self.chunk_index,
            "n_tokens": self.n_tokens,
            "segments": [s.to_row() for s in self.segments],
            "images": [i.to_row() for i in self.images],
            "page_renders": [r.to_row() for r in self.page_renders],
            "pages": [p.to_row() for p in self.pages],
            "series": [r.to_row() for r in self.series],
            "sample_weight": float(self.sample_weight),
            "meta": json.dumps(dict(self.meta), sort_keys=True, default=str),
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ChunkRow:
        """A (possibly partial) row: parts that were not read come back empty."""
        weight = row.get("sample_weight")
        return cls(
            doc_id=row["doc_id"],
            chunk_index=int(row["chunk_index"]),
            segments=tuple(Segment.from_row(s) for s in row.get("segments") or ()),
            images=tuple(ShardImage.from_row(i) for i in row.get("images") or ()),
            page_renders=tuple(PageRender.from_row(r) for r in row.get("page_renders") or ()),
            pages=tuple(PageInfo.from_row(p) for p in row.get("pages") or ()),
            series=tuple(SeriesRecord.from_row(r) for r in row.get("series") or ()),
            sample_weight=1.0 if weight is None else float(weight),
            meta=json.loads(row["meta"]) if row.get("meta") else {},
            n_tokens_stored=int(row["n_tokens"]) if row.get("n_tokens") is not None else None,
        )


def chunk_id(doc_id: str, chunk_index: int) -> str:
    """The content-derived chunk id (DESIGN: ``f"{doc_id}:{chunk_index}"``)."""
    return f"{doc_id}:{chunk_index}"


def rows_to_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=SHARD_SCHEMA)


def file_sha256(path: str | os.PathLike[str], bufsize: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with fs.open_input(path) as f:
        while chunk := f.read(bufsize):
            h.update(chunk)
    return h.hexdigest()


def shard_name(index: int, n_shards: int) -> str:
    return f"shard-{index:05d}-of-{n_shards:05d}.parquet"


SHARD_NAME = re.compile(r"^shard-\d{5}-of-\d{5}\.parquet$")


def entry_for(
    path: str | os.PathLike[str], rows: int, tokens: int, sha256: str | None = None, size: int | None = None
) -> dict[str, Any]:
    """The manifest entry of a written shard file (hashed from disk unless the writer hashed what it wrote)."""
    return {
        "file": os.path.basename(str(path)),
        "rows": rows,
        "tokens": tokens,
        "sha256": file_sha256(path) if sha256 is None else sha256,
        "bytes": fs.size(path) if size is None else size,
    }


class _Hashing:
    """A write-only file that hashes and counts the bytes going through it, so a writer knows the sha256 of
    what it wrote without reading the file back."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.sha = hashlib.sha256()
        self.size = 0
        self.closed = False

    def write(self, data: Any) -> int:
        self.sha.update(data)
        self.size += len(data)
        self.f.write(data)
        return len(data)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self.f.flush()

    def close(self) -> None:  # the underlying file is committed by its own context manager
        self.closed = True


def write_shard(
    path: str | os.PathLike[str], rows: Iterable[Mapping[str, Any] | ChunkRow], row_group_size: int = 64
) -> dict[str, Any]:
    """Write rows to ``path`` (committed whole) and return its manifest entry."""
    rows = [r.to_row() if isinstance(r, ChunkRow) else r for r in rows]
    table = rows_to_table(rows)
    with fs.open_output(path) as f:
        pq.write_table(table, f, row_group_size=row_group_size, compression="zstd")
    return entry_for(path, table.num_rows, int(sum(r["n_tokens"] for r in rows)))


class ShardWriter:
    """Stream tables of chunk rows into one shard file (committed whole on ``close``)."""

    def __init__(self, path: str | os.PathLike[str], row_group_size: int = 64) -> None:
        self.path = str(path)
        self.row_group_size = row_group_size
        self._out = fs.open_output(self.path)
        self._file = _Hashing(self._out.__enter__())
        self._writer = pq.ParquetWriter(self._file, SHARD_SCHEMA, compression="zstd")
        self.rows = self.tokens = 0

    def write_table(self, table: pa.Table) -> None:
        table = table.cast(SHARD_SCHEMA) if table.schema != SHARD_SCHEMA else table
        self._writer.write_table(table, row_group_size=self.row_group_size)
        self.rows += table.num_rows
        self.tokens += int(pc.sum(table["n_tokens"]).as_py() or 0)

    def close(self) -> dict[str, Any]:
        self._writer.close()
        self._out.__exit__(None, None, None)
        return entry_for(self.path, self.rows, self.tokens, self._file.sha.hexdigest(), self._file.size)


def read_table(path: str | os.PathLike[str]) -> pa.Table:
    """A whole shard file (or a per-document part in the same schema) as an Arrow table."""
    with fs.open_input(path) as f:
        return pq.read_table(f, schema=SHARD_SCHEMA)


# --- finding shards ---------------------------------------------------------------------------------------------


def shards_dir(out: str | os.PathLike[str]) -> str:
    return fs.join(out, SHARDS_DIR)


def list_shards(out: str | os.PathLike[str]) -> list[str]:
    """The shard files of a build output directory ``OUT`` (local path or fsspec URL), in the manifest's order.

    ``OUT`` is what ``scifolio build --out`` wrote: ``OUT/manifest.json`` and ``OUT/shards/``. Without a
    manifest (a run still in progress, or shards copied by hand) the shard files under ``OUT/shards`` are
    listed in name order. Anything else is an error that says what was expected."""
    out = str(out).rstrip("/")
    if fs.exists(fs.join(out, MANIFEST_NAME)):
        manifest = Manifest.read(out)
        return [fs.join(out, SHARDS_DIR, e.file) for e in manifest.shards]
    found = [p for p in fs.glob(fs.join(out, SHARDS_DIR, "*.parquet")) if not os.path.basename(p).startswith(".")]
    if found:
        return found
    hint = ""
    if fs.glob(fs.join(out, "*.parquet")) or os.path.basename(out) == SHARDS_DIR:
        hint = " (it looks like a shards folder itself: pass its parent, the folder given to `scifolio build --out`)"
    raise FileNotFoundError(
        f"{out} is not a build output directory: no {MANIFEST_NAME} and no {SHARDS_DIR}/*.parquet{hint}"
    )


def relative_name(path: str, out: str | os.PathLike[str]) -> str:
    """``path`` relative to ``OUT/shards`` (how the index records where a crop lives)."""
    base = shards_dir(out).rstrip("/")
    path = str(path)
    if path.startswith(base + "/") or path.startswith(base + os.sep):
        return path[len(base) + 1 :]
    return os.path.basename(path)


# --- reading shards ----------------------------------------------------------------------------------------------

# Cheap columns read with every part; the parts are the heavy, nested ones a reader asks for by name.
_KEY_COLUMNS = ("chunk_id", "doc_id", "chunk_index", "n_tokens", "sample_weight")
PARTS = ("segments", "images", "page_renders", "pages", "series", "meta")


class ShardFile:
    """Typed, streaming reads of one shard file; only the columns a caller needs are decoded."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)

    def _columns(self, parts: Sequence[str], present: Sequence[str] | None = None) -> list[str]:
        """Columns to decode; ``present``: the file's columns (a part an older schema lacks reads as empty)."""
        unknown = set(parts) - set(PARTS)
        if unknown:
            raise ValueError(f"unknown shard parts {sorted(unknown)}; choose from {PARTS}")
        cols = [*_KEY_COLUMNS, *parts]
        return cols if present is None else [c for c in cols if c in present]

    def iter_chunks(self, parts: Sequence[str] = PARTS, batch_size: int = 16) -> Iterator[ChunkRow]:
        """Rows in file order as :class:`ChunkRow`; parts not asked for come back empty."""
        with fs.open_input(self.path) as f:
            pf = pq.ParquetFile(f)
            cols = self._columns(parts, pf.schema_arrow.names)
            for batch in pf.iter_batches(batch_size=batch_size, columns=cols):
                for row in batch.to_pylist():
                    yield ChunkRow.from_row(row)

    def read_chunks(self, parts: Sequence[str] = PARTS) -> list[ChunkRow]:
        return list(self.iter_chunks(parts, batch_size=64))

    def sample_weights(self) -> tuple[list[str], list[float]]:
        """(chunk ids, each row's own ``sample_weight``) in file order: the cheap columns only."""
        with fs.open_input(self.path) as f:
            t = pq.read_table(f, columns=["chunk_id", "sample_weight"])
        own = [1.0 if w is None else float(w) for w in t.column("sample_weight").to_pylist()]
        return t.column("chunk_id").to_pylist(), own

    def doc_ids(self) -> set[str]:
        with fs.open_input(self.path) as f:
            t = pq.read_table(f, columns=["doc_id"])
        return set(pc.unique(t.column("doc_id")).to_pylist())

    def chunk(self, row: int, parts: Sequence[str] = PARTS) -> ChunkRow:
        """One row by its position in the file (reads only the row group that holds it)."""
        with fs.open_input(self.path) as f:
            pf = pq.ParquetFile(f)
            start = 0
            for g in range(pf.num_row_groups):
                n = pf.metadata.row_group(g).num_rows
                if row < start + n:
                    cols = self._columns(parts, pf.schema_arrow.names)
                    rec = pf.read_row_group(g, columns=cols).slice(row - start, 1).to_pylist()[0]
                    return ChunkRow.from_row(rec)
                start += n
        raise IndexError(f"{self.path} has {start} rows, not {row + 1}")

    def series_count(self) -> int:
        """Series records in the file, from the parquet footer's statistics where it has them (no values decoded),
        else by reading the records' ids; 0 for a file of an older schema."""
        with fs.open_input(self.path) as f:
            pf = pq.ParquetFile(f)
            if "series" not in pf.schema_arrow.names:
                return 0
            meta = pf.metadata
            leaf = next(
                (i for i in range(meta.num_columns) if meta.schema.column(i).path == "series.list.element.series_id"),
                None,
            )
            total = 0
            for g in range(meta.num_row_groups):
                stats = meta.row_group(g).column(leaf).statistics if leaf is not None else None
                if stats is None or not stats.has_null_count:
                    break
                total += stats.num_values  # non-null ids: one per record (an empty list stores a null)
            else:
                return total
            t = pf.read(columns=["series"])
        return int(pc.sum(pc.list_value_length(t.column("series"))).as_py() or 0)

    @property
    def num_rows(self) -> int:
        with fs.open_input(self.path) as f:
            return pq.ParquetFile(f).metadata.num_rows


def table_chunks(table: pa.Table, parts: Sequence[str] = PARTS) -> Iterator[ChunkRow]:
    """The rows of an in-memory table in the shard schema (what a shard writer holds) as :class:`ChunkRow`,
    decoding only ``parts`` besides the key columns."""
    cols = ShardFile("")._columns(parts)
    for batch in table.select(cols).to_batches(max_chunksize=64):
        for row in batch.to_pylist():
            yield ChunkRow.from_row(row)


def iter_chunks(path: str | os.PathLike[str], parts: Sequence[str] = PARTS) -> Iterator[ChunkRow]:
    return ShardFile(path).iter_chunks(parts)
