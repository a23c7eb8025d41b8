from __future__ import annotations

from formats.records import Block, Crop, Dropped, Page, sha256_hex
from tests.parsing.fixtures import paper_pdf


def test_page_with_real_crops_round_trips(parser):
    from parsing import ParseConfig

    recs = list(parser.iter_parse(paper_pdf(), "paper.pdf", ParseConfig(backend="pymupdf", page_render_dpi=36)))
    pages = [r for r in recs if isinstance(r, Page)]
    assert pages and any(p.crops for p in pages)
    for page in pages:
        back = Page.from_row(page.to_row())
        assert back == page
        assert [c.sha256 for c in back.crops] == [sha256_hex(c.png) for c in page.crops]
        assert back.render is not None and back.render.png.startswith(b"\x89PNG")


def test_block_and_dropped_round_trip():
    crop = Crop.from_png(b"\x89PNG fake", 3, 4, 200)
    b = Block("table", (1, 2, 3, 4), text="a|b", reading_order=5, html="<table></table>", crop=crop, caption_of=None)
    assert Block.from_row(b.to_row()) == b
    d = Dropped("doc:3", "parse", "timeout", {"source": "x.pdf", "pages_missing": [3, 4]})
    assert Dropped.from_row(d.to_row()) == d
