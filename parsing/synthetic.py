"""Synthetic scientific pages with known figure / table / display-equation boxes, written with PyMuPDF.

    python benchmarks/layout.py --synthetic 200          # score the parser on 200 pages + their scans

Each page is drawn from a seeded random layout: one or two columns, several fonts and sizes, paragraphs,
numbered multi-line display equations, ruled and unruled (booktabs-style) tables, vector plots, raster
images, captions above tables and below figures, some landscape pages. ``scanned(pdf)`` rasterises a
document into image-only pages (a "scan" with no text layer). The boxes are what a careful reader would
draw: a figure is its drawing or image, a table its cells and rules, an equation its lines without the
"(n)" number. This set measures generalisation; nothing is fitted on it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from parsing.geometry import BBox

WORDS = (
    "model data layer result method training error sample field energy network measure spectrum boundary "
    "operator estimate signal density region function theorem solution process system value phase"
).split()
FONTS = ("tiro", "helv", "cour", "tibo")
MATH = ("±", "·", "×", "²", "³", "/", "'")
"""Operators the Base-14 fonts can draw (WinAnsi): the equations' glyphs stay in the text layer."""


@dataclass(frozen=True)
class Truth:
    """A reference box of a page: kind (figure, table, equation) and PDF-point box (top-left origin)."""

    kind: str
    bbox: BBox


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def _paragraph(page, rng: random.Random, x0: float, y: float, x1: float, size: float, font: str, lines: int) -> float:
    import pymupdf

    per_line = (x1 - x0) / (0.5 * size)
    text = ""
    while len(text) < 0.85 * lines * per_line:
        text += _sentence(rng, rng.randint(6, 14)) + " "
    h = (lines + 3) * size * 1.3
    rect = pymupdf.Rect(x0, y, x1, y + h)
    left = page.insert_textbox(rect, text.strip(), fontsize=size, fontname=font, align=pymupdf.TEXT_ALIGN_JUSTIFY)
    return y + (h - left if left >= 0 else 0) + size * 0.6


def _equation(page, rng: random.Random, x0: float, y: float, x1: float, size: float, number: int) -> tuple[float, BBox]:
    import pymupdf

    n_lines = rng.choice((1, 1, 2, 3))
    box = None
    for k in range(n_lines):
        terms = [f"{rng.choice('xyzfgu')}{rng.choice(MATH)}{rng.randint(1, 9)}" for _ in range(rng.randint(3, 6))]
        s = ("= " if k else f"{rng.choice('EFLH')}({rng.choice('xtk')}) = ") + " + ".join(terms)
        width = pymupdf.get_text_length(s, fontname="tiit", fontsize=size)
        sx = (x0 + x1) / 2 - width / 2
        base = y + size * (1.3 * k + 1)
        page.insert_text((sx, base), s, fontsize=size, fontname="tiit")
        line = (sx, base - size * 0.85, sx + width, base + size * 0.3)
        box = line if box is None else (min(box[0], line[0]), box[1], max(box[2], line[2]), line[3])
    assert box is not None
    page.insert_text((x1 - 3 * size, box[3] - size * 0.3), f"({number})", fontsize=size * 0.9, fontname="tiro")
    return box[3] + size, box


def _table(page, rng: random.Random, x0: float, y: float, x1: float, size: float, ruled: bool) -> tuple[float, BBox]:
    cols = rng.randint(3, 6)
    rows = rng.randint(3, 8)
    width = min(x1 - x0, cols * rng.uniform(50, 80))
    tx0 = (x0 + x1) / 2 - width / 2
    col_w = width / cols
    row_h = size * 1.6
    for r in range(rows):
        for c in range(cols):
            cell = (
                rng.choice(WORDS).capitalize() if r == 0 or c == 0 else f"{rng.uniform(0, 100):.{rng.randint(1, 3)}f}"
            )
            page.insert_text(
                (tx0 + c * col_w + 4, y + r * row_h + size * 1.15), cell[:10], fontsize=size, fontname="helv"
            )
    bottom = y + rows * row_h
    if ruled:
        for r in range(rows + 1):
            page.draw_line((tx0, y + r * row_h), (tx0 + width, y + r * row_h), width=0.5)
        for c in range(cols + 1):
            page.draw_line((tx0 + c * col_w, y), (tx0 + c * col_w, bottom), width=0.5)
    else:  # booktabs: top, mid and bottom rules only
        for yy, w in ((y, 1.0), (y + row_h, 0.5), (bottom, 1.0)):
            page.draw_line((tx0, yy), (tx0 + width, yy), width=w)
    return bottom + size, (tx0, y, tx0 + width, bottom)


def _plot(page, rng: random.Random, x0: float, y: float, x1: float, height: float) -> tuple[float, BBox]:
    import math

    width = min(x1 - x0, rng.uniform(0.6, 1.0) * (x1 - x0))
    px0 = (x0 + x1) / 2 - width / 2
    ax0, ay1 = px0 + 18, y + height - 14
    page.draw_line((ax0, y), (ax0, ay1), width=0.8)
    page.draw_line((ax0, ay1), (px0 + width, ay1), width=0.8)
    for k in range(6):  # ticks and their labels
        tx = ax0 + k * (width - 20) / 5
        page.draw_line((tx, ay1), (tx, ay1 + 3), width=0.5)
        page.insert_text((tx - 3, ay1 + 11), str(k), fontsize=6, fontname="helv")
    for series in range(rng.randint(1, 3)):
        f, ph = rng.uniform(0.5, 3), rng.uniform(0, 3)
        pts = [
            (ax0 + t * (width - 22) / 40, y + height / 2 - math.sin(f * t / 6 + ph) * (height / 2 - 18) + series * 4)
            for t in range(41)
        ]
        page.draw_polyline(pts, color=((series * 0.4) % 1, 0.2, 1 - series * 0.3), width=1.2)
    return y + height + 4, (px0, y, px0 + width, y + height)


def _image(page, rng: random.Random, x0: float, y: float, x1: float, height: float) -> tuple[float, BBox]:
    import numpy as np
    import pymupdf

    width = min(x1 - x0, rng.uniform(0.5, 0.9) * (x1 - x0))
    ix0 = (x0 + x1) / 2 - width / 2
    w_px, h_px = 160, max(40, int(160 * height / width))
    g = np.random.default_rng(rng.randint(0, 2**31))
    img = (g.random((h_px // 8 + 1, w_px // 8 + 1, 3)) * 255).astype(np.uint8).repeat(8, 0).repeat(8, 1)[:h_px, :w_px]
    pix = pymupdf.Pixmap(pymupdf.csRGB, w_px, h_px, np.ascontiguousarray(img).tobytes(), False)
    rect = pymupdf.Rect(ix0, y, ix0 + width, y + height)
    page.insert_image(rect, stream=pix.tobytes("png"))
    return y + height + 4, tuple(rect)  # type: ignore[return-value]


def _caption_text(page, rng: random.Random, x0: float, y: float, x1: float, label: str, size: float) -> float:
    import pymupdf

    text = f"{label}: {_sentence(rng, rng.randint(5, 10))}"
    rect = pymupdf.Rect(x0, y, x1, y + size * 4)
    left = page.insert_textbox(rect, text, fontsize=size * 0.9, fontname="tiro")
    return y + size * 4 - max(left, 0) + 2


def page_of(doc, rng: random.Random, landscape: bool | None = None, columns: int | None = None) -> list[Truth]:
    """Add one random page to ``doc``; returns its reference boxes."""
    landscape = rng.random() < 0.15 if landscape is None else landscape
    w, h = (792.0, 612.0) if landscape else (612.0, 792.0)
    page = doc.new_page(width=w, height=h)
    columns = (1 if landscape else rng.choice((1, 2))) if columns is None else columns
    size = rng.choice((9.0, 10.0, 11.0))
    font = rng.choice(FONTS[:2])
    margin, gutter = 54.0, 18.0
    col_w = (w - 2 * margin - (columns - 1) * gutter) / columns
    truths: list[Truth] = []
    numbers = {"Figure": 0, "Table": 0, "eq": 0}
    for c in range(columns):
        x0 = margin + c * (col_w + gutter)
        x1 = x0 + col_w
        y = margin
        while True:
            choice = rng.choices(("para", "eq", "table", "plot", "image"), weights=(4, 2, 1, 1, 1))[0]
            need = {"para": 60, "eq": 50, "table": 160, "plot": 190, "image": 190}[choice]
            if y + need > h - margin:
                break
            if choice == "para":
                y = _paragraph(page, rng, x0, y, x1, size, font, rng.randint(2, 6))
            elif choice == "eq":
                numbers["eq"] += 1
                y, box = _equation(page, rng, x0, y, x1, size + 1, numbers["eq"])
                truths.append(Truth("equation", box))
            elif choice == "table":
                numbers["Table"] += 1
                y = _caption_text(page, rng, x0, y, x1, f"Table {numbers['Table']}", size)
                y, box = _table(page, rng, x0, y, x1, size * 0.85, ruled=rng.random() < 0.5)
                truths.append(Truth("table", box))
            else:
                numbers["Figure"] += 1
                draw = _plot if choice == "plot" else _image
                y, box = draw(page, rng, x0, y + 4, x1, rng.uniform(100, 150))
                truths.append(Truth("figure", box))
                y = _caption_text(page, rng, x0, y, x1, f"Figure {numbers['Figure']}", size) + 4
    return truths


def synthetic_pdf(n_pages: int, seed: int = 0) -> tuple[bytes, dict[int, list[Truth]]]:
    """A document of ``n_pages`` random pages and its reference boxes per page."""
    import pymupdf

    rng = random.Random(seed)
    doc = pymupdf.open()
    truth = {i: page_of(doc, rng) for i in range(n_pages)}
    return doc.tobytes(), truth


def scanned(pdf: bytes, dpi: int = 150) -> bytes:
    """``pdf`` with every page replaced by its render at ``dpi``: image-only pages, same size and boxes."""
    import pymupdf

    src = pymupdf.open(stream=pdf)
    out = pymupdf.open()
    for p in src:
        png = p.get_pixmap(dpi=dpi, colorspace=pymupdf.csGRAY).tobytes("png")
        out.new_page(width=p.rect.width, height=p.rect.height).insert_image(p.rect, stream=png)
    return out.tobytes()
