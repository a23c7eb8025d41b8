"""Per-document build logic on hand-made records: interleave order, chunk rows, work store, shard packing."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from PIL import Image

from formats.records import Block, Crop, Document, Dropped, Page
from formats.shards import SHARD_SCHEMA, ChunkRow, ShardImage
from pipelines.assembly.build import BuildConfig, DocumentBuilder, WorkStore, shard_of, write_shard_from_docs
from pipelines.assembly.interleave import ImageTokenRule, page_segments


def _png(w: int, h: int, colour: int) -> Crop:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (colour, 255 - colour, 128)).save(buf, format="PNG")
    return Crop.from_png(buf.getvalue(), w, h, 200)


def _doc(data: bytes, n_pages: int = 2) -> tuple[Document, list[Page]]:
    doc_id = hashlib.sha256(data).hexdigest()
    pages = []
    for i in range(n_pages):
        blocks = (
            Block("header", (0, 0, 600, 20), "Journal of Tests", reading_order=0),
            Block("title", (50, 40, 550, 60), f"Section {i}", reading_order=1),
            Block(
                "text", (50, 70, 550, 200), f"Paragraph one of page {i}. The rate constant k = 3.2.", reading_order=2
            ),
            Block("figure", (50, 210, 550, 400), "", reading_order=3, crop=_png(140, 84, 10 * i)),
            Block("caption", (50, 405, 550, 420), f"Figure {i}: spectra.", reading_order=4, caption_of=3),
            Block("equation", (100, 430, 500, 460), "E = mc^2", reading_order=5, latex="E=mc^2", crop=None),
            Block("page_number", (290, 780, 310, 790), str(i + 1), reading_order=6),
        )
        pages.append(Page(doc_id, i, 612, 792, blocks, parser="test", source="mem://x.pdf", render=_png(61, 79, 200)))
    return Document(doc_id, "mem://x.pdf", n_pages), pages


def test_page_segments_reading_order_furniture_and_captions():
    _, pages = _doc(b"a")
    segs = page_segments(reversed(pages))  # page order restored
    kinds = [(s.kind, s.page_index) for s in segs]
    assert kinds == [("text", 0), ("image", 0), ("text", 0), ("text", 1), ("image", 1), ("text", 1)]
    assert "Journal of Tests" not in "".join(s.text for s in segs)  # header skipped
    assert segs[0].text.startswith("Section 0\n\nParagraph one")
    # a cropped kind without a crop falls back to its text; captions stay text
    assert "Figure 0: spectra.\n\nE = mc^2" in segs[2].text


def test_equation_crops_keep_their_known_text_beside_the_image():
    """An equation's text is replaced by its image in the segments; the image keeps it (LaTeX first, else the text the
    parse read, marked by where it came from), through the shard row."""
    blocks = (
        Block("equation", (100, 30, 500, 60), "E = mc 2", reading_order=0, latex=" E=mc^2 ", crop=_png(40, 10, 1)),
        Block("equation", (100, 70, 500, 90), "a  +\nb", reading_order=1, crop=_png(40, 10, 2), text_from="ocr"),
        Block("equation", (100, 95, 500, 99), "", reading_order=2, crop=_png(40, 10, 3)),
        Block("figure", (50, 100, 550, 300), "", reading_order=3, crop=_png(60, 40, 4)),
    )
    segs = page_segments([Page("d", 0, 612, 792, blocks, parser="test")])
    images = [s.image for s in segs if s.kind == "image"]
    assert [(i.kind, i.text, i.text_from) for i in images] == [
        ("equation", "E=mc^2", "latex"), ("equation", "a + b", "ocr"), ("equation", "", ""), ("figure", "", "")
    ]  # fmt: skip
    assert not any("mc" in s.text for s in segs if s.kind == "text")
    assert ShardImage.from_row(images[1].to_row()) == images[1]


def test_builder_rows_round_trip_and_image_bytes(tiny_tokenizer):
    data = b"%PDF-fake-1"
    document, pages = _doc(data, 3)
    builder = DocumentBuilder(
        BuildConfig(tokenizer=tiny_tokenizer, max_tokens=64, overlap=8, image_tokens=ImageTokenRule(max_tokens=32))
    )
    result = builder.build(data, "mem://x.pdf", [document, *pages, Dropped(f"{document.doc_id}:9", "parse", "timeout")])
    assert result.rows and result.stats["chunks"] == len(result.rows)
    assert [d.reason for d in result.dropped] == ["timeout"]
    chunks = [ChunkRow.from_row(row) for row in result.rows]
    for k, (row, chunk) in enumerate(zip(result.rows, chunks)):
        assert chunk.chunk_id == f"{document.doc_id}:{k}" and chunk.n_tokens <= 64
        assert chunk.to_row() == row
        shas = {s.image_sha256 for s in chunk.segments if s.kind == "image"}
        assert shas == {img.sha256 for img in chunk.images}  # self-contained: every image's bytes are there
        for img in chunk.images:
            assert hashlib.sha256(img.png).hexdigest() == img.sha256
        assert {r.page_index for r in chunk.page_renders} == {s.page_index for s in chunk.segments}
        assert {p.page_index for p in chunk.pages} == {s.page_index for s in chunk.segments}
        assert all(p.width > 0 and p.blocks for p in chunk.pages)  # page size and boxes travel with the chunk
    # all text tokens of the document appear, in order, once the overlaps are removed
    ids = []
    for chunk in chunks:
        flat = [t for s in chunk.segments for t in (s.token_ids if s.kind == "text" else [None] * s.n_tokens)]
        ids.extend(flat[chunk.meta["overlap"] :])
    assert len(ids) == chunks[-1].meta["end"]


def test_builder_open_failure_and_empty_document(tiny_tokenizer):
    builder = DocumentBuilder(BuildConfig(tokenizer=tiny_tokenizer))
    data = b"not a pdf"
    doc_id = hashlib.sha256(data).hexdigest()
    r = builder.build(data, "x", [Dropped(doc_id, "open", "not_pdf")])
    assert r.rows == [] and [d.reason for d in r.dropped] == ["not_pdf"]
    document = Document(doc_id, "x", 1)
    blank = Page(doc_id, 0, 612, 792, (), parser="test")
    r = builder.build(data, "x", [document, blank])
    assert r.rows == [] and [(d.stage, d.reason) for d in r.dropped] == [("interleave", "empty_document")]


def test_work_store_and_deterministic_shards(tmp_path: Path, tiny_tokenizer):
    builder = DocumentBuilder(
        BuildConfig(tokenizer=tiny_tokenizer, max_tokens=64, overlap=8, image_tokens=ImageTokenRule(max_tokens=32))
    )
    store = WorkStore(tmp_path / "work")
    ids = []
    for i in range(5):
        data = f"%PDF-{i}".encode()
        document, pages = _doc(data, 1 + i % 2)
        assert store.done(document.doc_id) is None
        summary = store.save(builder.build(data, f"mem://{i}", [document, *pages]))
        assert store.done(document.doc_id) == summary
        ids.append(document.doc_id)
    a = write_shard_from_docs(store, tmp_path / "a", 0, 1, ids)
    b = write_shard_from_docs(store, tmp_path / "b", 0, 1, list(reversed(ids)) + ids[:2])  # order/dupes irrelevant
    assert a == b
    table = pq.read_table(tmp_path / "a" / a["file"])
    assert table.schema.equals(SHARD_SCHEMA, check_metadata=False)
    assert table["doc_id"].to_pylist() == sorted(table["doc_id"].to_pylist())
    assert a["rows"] == table.num_rows and a["tokens"] == sum(table["n_tokens"].to_pylist())
    assert {shard_of(d, 4) for d in ids} <= set(range(4))


@pytest.mark.parametrize("w,h,expected", [(28, 28, 4), (280, 56, 20), (10_000, 10_000, 16384), (29, 29, 4)])
def test_image_token_rule(w, h, expected):
    assert ImageTokenRule()(w, h) == expected
