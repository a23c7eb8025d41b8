"""Both layout backends find the fixture's figure, table and equation where they were drawn."""

from __future__ import annotations

import pytest

from parsing import Document, Page, ParseConfig
from parsing.geometry import iou
from tests.parsing.fixtures import paper_pdf

FIGURE = (156, 210, 456, 398)
TABLE = (110, 115, 510, 255)


@pytest.mark.parametrize(("backend", "label"), [("mineru", "mineru-flash"), ("pymupdf", "pymupdf-layout")])
def test_backend_finds_figure_table_equation(parser, backend, label):
    recs = list(parser.iter_parse(paper_pdf(), "paper.pdf", ParseConfig(backend=backend)))
    assert isinstance(recs[0], Document) and recs[0].n_pages == 2
    pages = [r for r in recs if isinstance(r, Page)]
    assert [p.page_index for p in pages] == [0, 1]
    assert {p.parser for p in pages} == {label}
    p0, p1 = pages

    figures = [b for b in p0.blocks if b.kind == "figure"]
    assert len(figures) == 1 and iou(figures[0].bbox, FIGURE) > 0.8, figures
    assert figures[0].crop is not None and figures[0].crop.width > 100
    caption = [b for b in p0.blocks if b.kind == "caption" and b.text.startswith("Figure 1")]
    assert caption and caption[0].caption_of == figures[0].reading_order
    equations = [b for b in p0.blocks if b.kind == "equation"]
    assert len(equations) == 1 and equations[0].crop is not None
    assert 540 < equations[0].bbox[3] and equations[0].bbox[1] < 560  # around the baseline at y=560

    tables = [b for b in p1.blocks if b.kind == "table"]
    assert len(tables) == 1 and iou(tables[0].bbox, TABLE) > 0.7, tables
    assert tables[0].crop is not None
    assert "Accuracy" in (tables[0].html or tables[0].text)
    tcap = [b for b in p1.blocks if b.kind == "caption" and b.text.startswith("Table 1")]
    assert tcap and tcap[0].caption_of == tables[0].reading_order

    for p in pages:  # reading order is a permutation 0..n-1 in block order; text reads top to bottom
        assert [b.reading_order for b in p.blocks] == list(range(len(p.blocks)))
        assert all(0 <= b.bbox[0] < b.bbox[2] <= p.width and 0 <= b.bbox[1] < b.bbox[3] <= p.height for b in p.blocks)
    kinds = [k for k, _ in p0.content()]
    assert kinds.index("image") > 0  # the figure sits after the introduction text


def test_crops_are_deterministic_across_runs(parser):
    a = list(parser.iter_parse(paper_pdf(), "paper.pdf", ParseConfig(backend="pymupdf")))
    b = list(parser.iter_parse(paper_pdf(), "paper.pdf", ParseConfig(backend="pymupdf")))
    sha = lambda recs: [c.sha256 for r in recs if isinstance(r, Page) for c in r.crops]  # noqa: E731
    assert sha(a) and sha(a) == sha(b)
