"""Crops are content-addressed by the sha256 of their PNG bytes, deterministic, and size-capped."""

from __future__ import annotations

import hashlib

import pymupdf

from parsing.crops import render_page, render_region
from tests.parsing.fixtures import paper_pdf

FIGURE = (156, 210, 456, 398)  # where fixtures.paper_pdf places its raster figure


def _page():
    return pymupdf.open(stream=paper_pdf())[0]


def test_identical_render_gives_identical_sha_and_sha_is_png_hash():
    a = render_region(_page(), FIGURE, dpi=100, min_px=8, max_px=4096)
    b = render_region(_page(), FIGURE, dpi=100, min_px=8, max_px=4096)
    assert a is not None and b is not None
    assert a.png == b.png and a.sha256 == b.sha256
    assert a.sha256 == hashlib.sha256(a.png).hexdigest()
    assert a.png.startswith(b"\x89PNG")
    # 300 × 188 pt at 100 DPI; MuPDF rounds the clip outwards by at most a pixel
    assert abs(a.width - 300 * 100 / 72) <= 1.5 and abs(a.height - 188 * 100 / 72) <= 1.5
    other = render_region(_page(), (72, 100, 372, 288), dpi=100, min_px=8, max_px=4096)
    assert other is not None and other.sha256 != a.sha256  # different pixels, different id


def test_size_caps():
    tiny = render_region(_page(), (100, 100, 102, 140), dpi=200, min_px=8, max_px=4096)
    assert tiny is None  # 2 pt wide = 5.6 px < 8 px
    capped = render_region(_page(), FIGURE, dpi=600, min_px=8, max_px=512)
    assert capped is not None and max(capped.width, capped.height) <= 512
    assert capped.dpi < 600
    page = render_page(_page(), dpi=72, max_side=300)
    assert max(page.width, page.height) <= 300
