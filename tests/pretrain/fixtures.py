"""Synthetic corpus shards for the pre-training tests, written with the real shard writer.

Token ids follow a learnable rule (each sample counts up from a random start with a random stride), so a
working trainer must make the text loss fall. Page renders are drawn with PIL: text-like dark lines on white,
plus blank pages that the foreground mask must remove entirely.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from formats.shards import ChunkRow, PageRender, Segment, ShardImage, shard_name, write_shard


def png_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def text_page(rng: np.random.Generator, width: int = 144, height: int = 192) -> Image.Image:
    """A white page with a column of dark 'text lines' of varying length."""
    img = Image.new("L", (width, height), 255)
    draw = ImageDraw.Draw(img)
    y = 12
    while y < height - 16:
        x1 = int(rng.integers(width // 2, width - 10))
        draw.rectangle([10, y, x1, y + 4], fill=int(rng.integers(0, 60)))
        y += 10
    return img.convert("RGB")


def blank_page(width: int = 144, height: int = 192) -> Image.Image:
    return Image.new("RGB", (width, height), (255, 255, 255))


def figure(rng: np.random.Generator, size: int = 48) -> Image.Image:
    arr = (rng.random((size, size, 3)) * 255).astype(np.uint8)
    return Image.fromarray(arr)


def make_rows(
    n_docs: int, vocab: int, seed: int = 0, tokens: tuple[int, int] = (60, 200), pages: bool = True
) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for d in range(n_docs):
        doc_id = hashlib.sha256(f"doc{seed}-{d}".encode()).hexdigest()
        n = int(rng.integers(*tokens))
        start, stride = int(rng.integers(3, vocab)), int(rng.integers(1, 4))
        ids = [3 + (start + i * stride) % (vocab - 3) for i in range(n)]
        cut = n // 2
        fig = png_bytes(figure(rng))
        sha = hashlib.sha256(fig).hexdigest()
        segments = (
            Segment(kind="text", n_tokens=cut, page_index=0, token_ids=tuple(ids[:cut])),
            Segment(kind="image", n_tokens=int(rng.integers(4, 20)), page_index=0, image_sha256=sha),
            Segment(kind="text", n_tokens=n - cut, page_index=1, token_ids=tuple(ids[cut:])),
        )
        renders = []
        if pages:
            for p in range(2):
                img = blank_page() if (d + p) % 5 == 4 else text_page(rng)
                renders.append(PageRender(p, png_bytes(img), img.width, img.height, 72))
        row = ChunkRow(
            doc_id=doc_id,
            chunk_index=0,
            segments=segments,
            images=(ShardImage(sha, fig, 48, 48, "figure"),),
            page_renders=tuple(renders),
        )
        rows.append(row.to_row())
    return rows


def write_corpus(
    out: Path, n_docs: int = 24, n_shards: int = 2, vocab: int = 1024, seed: int = 0, pages: bool = True
) -> Path:
    """``n_shards`` parquet shards in ``out/shards`` (a build output directory without a manifest, which the
    lister reads in name order; the real job's manifest is covered by tests/test_chain.py)."""
    rows = make_rows(n_docs, vocab, seed, pages=pages)
    for s in range(n_shards):
        part = rows[s::n_shards]
        write_shard(out / "shards" / shard_name(s, n_shards), part, row_group_size=8)
    return out
