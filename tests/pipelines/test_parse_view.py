"""``scifolio parse --view``: every page drawn with its boxes, and an index page listing them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.parsing.fixtures import paper_pdf


@pytest.mark.slow
def test_parse_view_draws_every_page(tmp_path: Path):
    import pyarrow.parquet as pq
    import pymupdf

    from pipelines.cli import main

    pdf = tmp_path / "paper.pdf"
    pdf.write_bytes(paper_pdf())
    out = tmp_path / "out"
    assert main(["parse", str(pdf), "--out", str(out), "--view", "--no-crops"]) == 0
    pngs = sorted((out / "view").glob("*.png"))
    assert len(pngs) == 2  # one per page
    pix = pymupdf.Pixmap(str(pngs[0]))  # a real image of the page at 100 dpi
    assert abs(pix.width - 612 * 100 / 72) < 2
    index = (out / "view" / "index.html").read_text()
    assert all(p.name in index for p in pngs) and "reading order" in index
    kinds = set(pq.read_table(out / "blocks.parquet")["kind"].to_pylist())
    assert {"figure", "table"} <= kinds
