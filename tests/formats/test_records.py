"""Records round-trip through their rows (the parser-produced case is tests/parsing/test_parse_records.py)."""

from __future__ import annotations

from formats.records import Block, Crop, Document, Dropped, Page


def test_block_and_dropped_round_trip():
    crop = Crop.from_png(b"\x89PNG fake", 3, 4, 200)
    b = Block("table", (1, 2, 3, 4), text="a|b", reading_order=5, html="<table></table>", crop=crop, caption_of=None)
    assert Block.from_row(b.to_row()) == b
    d = Dropped("doc:3", "parse", "timeout", {"source": "x.pdf", "pages_missing": [3, 4]})
    assert Dropped.from_row(d.to_row()) == d


def test_document_and_page_round_trip():
    doc = Document("d" * 64, "x.pdf", 3, {"title": "T"})
    assert Document.from_row(doc.to_row()) == doc
    crop = Crop.from_png(b"\x89PNG fake", 3, 4, 200)
    page = Page(
        doc.doc_id,
        1,
        612.0,
        792.0,
        (Block("figure", (1, 2, 3, 4), reading_order=0, crop=crop), Block("text", (5, 6, 7, 8), "hi", 1)),
        scores={"visual_gain": {"delta_h_nats": 0.3}},
        parser="pymupdf-layout",
        render=Crop.from_png(b"\x89PNG page", 10, 12, 72),
    )
    assert Page.from_row(page.to_row()) == page
