"""Pages the parser produces round-trip through their rows with their real crops and render."""

from __future__ import annotations

from formats.records import Page, sha256_hex
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
