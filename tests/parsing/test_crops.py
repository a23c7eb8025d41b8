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


def test_crops_from_one_display_list_equal_per_box_page_renders():
    """``crop_blocks`` renders every box of a page from one display list; the PNGs (and so the ids) are the
    ones a separate ``page.get_pixmap(clip=box)`` per box gives."""
    from formats.records import Block
    from parsing.config import ParseConfig
    from parsing.crops import crop_blocks
    from parsing.geometry import pad

    page = _page()
    cfg = ParseConfig()
    boxes = [FIGURE, (72, 100, 372, 288), (60, 60, 540, 90), page.rect]
    blocks = crop_blocks(page, [Block("figure", b) for b in boxes], cfg, page.get_displaylist())
    w, h = page.rect.width, page.rect.height
    for b, box in zip(blocks, boxes):
        zoom = cfg.dpi / 72
        clip = pymupdf.Rect(pad(tuple(box), cfg.pad, w, h)) & page.rect
        pix = page.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom), clip=clip, alpha=False, colorspace=pymupdf.csRGB)
        assert b.crop is not None and b.crop.png == pix.tobytes("png")
        assert b.crop.sha256 == hashlib.sha256(pix.tobytes("png")).hexdigest()


def _bilevel_scan_pdf() -> bytes:
    """A page that is one 1-bit image at ~300 DPI with text-like strokes, like a fax-compressed scan."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    w, h = 2124, 2971
    img = np.ones((h, w), bool)
    for _ in range(3000):
        x, y = rng.integers(0, w - 40), rng.integers(0, h - 8)
        img[y : y + rng.integers(2, 8), x : x + rng.integers(2, 40)] = False
    buf = io.BytesIO()
    Image.fromarray(img).convert("1").save(buf, "PNG")
    doc = pymupdf.open()
    page = doc.new_page(width=509.76, height=713.04)
    page.insert_image(page.rect, stream=buf.getvalue())
    return doc.tobytes()


def test_page_crops_do_not_depend_on_what_was_rendered_before():
    """MuPDF reuses a 1-bit image decoded by an earlier render at another resolution (the OCR path renders
    scans at 150 DPI first), which changes crop pixels; ``finish_page`` empties that cache first, so a page's
    crops depend on the page alone, whichever process renders it after whatever."""
    from formats.records import Block, Document
    from parsing.backends import ParsedPage
    from parsing.config import ParseConfig
    from parsing.core import finish_page

    data = _bilevel_scan_pdf()
    box = (54.9, 292.7, 148.3, 303.5)

    def crop(pre_render: bool, clean: bool) -> str:
        page = pymupdf.open(stream=data, filetype="pdf")[0]
        if pre_render:
            page.get_pixmap(matrix=pymupdf.Matrix(150 / 72, 150 / 72))
        if not clean:
            c = render_region(page, box, 200, 8, 4096)
            assert c is not None
            return c.sha256
        out = finish_page(
            page, Document("d" * 64, "x.pdf", 1), ParsedPage("t", [Block("equation", box)]), ParseConfig()
        )
        c = next(b.crop for b in out.blocks if b.kind == "equation")
        assert c is not None
        return c.sha256

    assert crop(True, clean=False) != crop(False, clean=False)  # the effect is real (what the test guards)
    assert crop(True, clean=True) == crop(False, clean=True)
