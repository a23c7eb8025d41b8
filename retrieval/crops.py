"""Crops out of corpus shards, with provenance and context text (no Beam: the ingest job adapts this).

An image's context is the text of the segments around its image segment in the chunk (the caption usually
sits right before or after the figure), which the reranker reads when no generated caption exists. Its caption
and the body sentences citing it ("as Fig. 3 shows, …") come from the citation resolver (``retrieval.citations``)
run over the documents of the shard file: the text channels of the index embed them.

    python -c "from retrieval.crops import iter_crops; print(next(iter_crops('out/shards/shard-00000-of-00001.parquet', 'out')))"
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from formats.shards import Segment, ShardFile, relative_name, shards_dir

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
    caption: str = ""  # the caption line the citation resolver found next to it ("Figure 3: …")
    citing: tuple[str, ...] = ()  # body sentences of the document(s) that cite it


def image_context(segments: Sequence[Segment], sha256: str, chars: int = CONTEXT_CHARS) -> tuple[int, str]:
    """(page_index, context) for the first image segment showing ``sha256``: up to ``chars`` characters of
    the text just before it and just after it, other images skipped. (-1, "") when no segment shows it."""
    for i, seg in enumerate(segments):
        if seg.kind == "image" and seg.image_sha256 == sha256:
            before: list[str] = []
            n = 0
            for s in reversed(segments[:i]):
                if s.kind == "text" and s.text:
                    before.insert(0, s.text)
                    n += len(s.text)
                    if n >= chars:
                        break
            after: list[str] = []
            n = 0
            for s in segments[i + 1 :]:
                if s.kind == "text" and s.text:
                    after.append(s.text)
                    n += len(s.text)
                    if n >= chars:
                        break
            left = " ".join(before)[-chars:]
            right = " ".join(after)[:chars]
            return seg.page_index, f"{left} [IMAGE] {right}".strip()
    return -1, ""


def iter_crops(path: str | os.PathLike[str], out: str | os.PathLike[str] | None = None) -> Iterator[CropItem]:
    """Every image of a shard file once per row it appears in (callers dedupe by sha256 if they wish).

    ``out``: the build output directory; ``source`` is stored relative to its ``shards/`` folder so the index
    stays valid when the directory moves (the service resolves thumbnails against its own ``--shards``)."""
    from retrieval.citations import crop_citations, resolve_chunks

    source = relative_name(str(path), out) if out is not None else os.path.basename(str(path))
    shard = ShardFile(path)
    cited = crop_citations(resolve_chunks(shard.iter_chunks(parts=("segments", "images"))))
    for row, chunk in enumerate(shard.iter_chunks(parts=("segments", "images"))):
        for img in chunk.images:
            page_index, context = image_context(chunk.segments, img.sha256)
            caption, citing = cited.get(img.sha256, ("", ()))
            yield CropItem(
                sha256=img.sha256,
                png=img.png,
                width=img.width,
                height=img.height,
                kind=img.kind,
                doc_id=chunk.doc_id,
                page_index=page_index,
                source=source,
                row=row,
                context=context,
                caption=caption,
                citing=citing,
            )


def read_image(out: str | os.PathLike[str], source: str, row: int, sha256: str) -> bytes:
    """PNG bytes of a crop, from the shard row its index entry points at. ``source`` must stay inside
    ``OUT/shards`` (the HTTP service passes user-supplied values through here)."""
    root = Path(shards_dir(out)).resolve()
    path = (root / source).resolve()
    if root not in path.parents or not path.is_file():
        raise FileNotFoundError(f"no shard {source!r} under {root}")
    try:
        chunk = ShardFile(path).chunk(row, parts=("images",))
    except IndexError:
        chunk = None
    for img in chunk.images if chunk else ():
        if img.sha256 == sha256:
            return img.png
    raise FileNotFoundError(f"crop {sha256} not in {source} row {row}")
