"""Crops out of corpus shards, with provenance and context text (no Beam: the ingest job adapts this).

An image's context is the text of the segments around its image segment in the chunk (the caption usually
sits right before or after the figure), which the reranker reads when no generated caption exists.

    python -c "from retrieval.crops import iter_crops; print(next(iter_crops('out/shards/shard-00000-of-00001.parquet')))"
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONTEXT_CHARS = 600  # characters of text taken on each side of an image


@dataclass(frozen=True)
class CropItem:
    """One image of one shard row, ready to embed."""

    sha256: str
    png: bytes
    width: int
    height: int
    kind: str
    doc_id: str
    page_index: int
    source: str  # shard file path relative to the shards directory
    row: int  # row number of the chunk inside the shard file
    context: str


def image_context(segments: Sequence[Mapping[str, Any]], sha256: str, chars: int = CONTEXT_CHARS) -> tuple[int, str]:
    """(page_index, context) for the first image segment showing ``sha256``: up to ``chars`` characters of
    the text just before it and just after it, other images skipped. (-1, "") when no segment shows it."""
    for i, seg in enumerate(segments):
        if seg["kind"] == "image" and seg.get("image_sha256") == sha256:
            before: list[str] = []
            n = 0
            for s in reversed(segments[:i]):
                if s["kind"] == "text" and s.get("text"):
                    before.insert(0, s["text"])
                    n += len(s["text"])
                    if n >= chars:
                        break
            after: list[str] = []
            n = 0
            for s in segments[i + 1 :]:
                if s["kind"] == "text" and s.get("text"):
                    after.append(s["text"])
                    n += len(s["text"])
                    if n >= chars:
                        break
            left = " ".join(before)[-chars:]
            right = " ".join(after)[:chars]
            return int(seg.get("page_index") or 0), f"{left} [IMAGE] {right}".strip()
    return -1, ""


def iter_crops(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None) -> Iterator[CropItem]:
    """Every image of a shard file once per row it appears in (callers dedupe by sha256 if they wish).

    ``root``: the shards directory; ``source`` is stored relative to it so the index stays valid when the
    directory moves (the service resolves thumbnails against its own ``--shards`` directory)."""
    import pyarrow.parquet as pq

    path = Path(path)
    source = str(path.relative_to(root)) if root is not None else path.name
    pf = pq.ParquetFile(path)
    row = 0
    for batch in pf.iter_batches(batch_size=16, columns=["doc_id", "segments", "images"]):
        for rec in batch.to_pylist():
            segments = rec["segments"] or []
            for img in rec["images"] or []:
                page_index, context = image_context(segments, img["sha256"])
                yield CropItem(
                    sha256=img["sha256"],
                    png=bytes(img["png"]),
                    width=int(img["width"]),
                    height=int(img["height"]),
                    kind=img.get("kind") or "",
                    doc_id=rec["doc_id"],
                    page_index=page_index,
                    source=source,
                    row=row,
                    context=context,
                )
            row += 1


def list_shards(shards_dir: str | os.PathLike[str]) -> list[Path]:
    """Shard parquet files under a directory, sorted (hidden tmp files of an in-progress write skipped)."""
    root = Path(shards_dir)
    return sorted(p for p in root.rglob("*.parquet") if not p.name.startswith("."))


def read_image(shards_dir: str | os.PathLike[str], source: str, row: int, sha256: str) -> bytes:
    """PNG bytes of a crop, from the shard row its index entry points at. ``source`` must stay inside
    ``shards_dir`` (the HTTP service passes user-supplied values through here)."""
    import pyarrow.parquet as pq

    root = Path(shards_dir).resolve()
    path = (root / source).resolve()
    if root not in path.parents or not path.is_file():
        raise FileNotFoundError(f"no shard {source!r} under {root}")
    pf = pq.ParquetFile(path)
    # Find the row group holding ``row`` so only that group is read.
    start = 0
    for g in range(pf.num_row_groups):
        n = pf.metadata.row_group(g).num_rows
        if row < start + n:
            rec = pf.read_row_group(g, columns=["images"]).slice(row - start, 1).to_pylist()[0]
            for img in rec["images"] or []:
                if img["sha256"] == sha256:
                    return bytes(img["png"])
            break
        start += n
    raise FileNotFoundError(f"crop {sha256} not in {source} row {row}")
