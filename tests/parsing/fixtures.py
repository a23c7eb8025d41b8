"""Tiny PDFs written with PyMuPDF for the parsing tests (no third-party files).

``paper_pdf()`` is a two-page article: title, paragraphs, a raster figure with caption, a ruled (vector) table
with caption, a display equation. ``scanned_pdf()`` is that first page as an image-only page (a scan).
Bad inputs (empty, garbage, truncated, encrypted, zero-page, huge page) exercise validation.
"""

from __future__ import annotations

import functools

LOREM = (
    "Layout analysis of scientific documents separates running text from figures, tables and equations. "
    "Each region is then cropped and interleaved with the surrounding paragraphs in reading order, so a "
    "language model sees images where the author placed them. We evaluate the approach on a corpus of "
    "articles and report the accuracy of region detection together with throughput on commodity machines."
)


def _plot_png(width: int = 480, height: int = 300) -> bytes:
    """A raster 'plot': a colour gradient, a sine curve and two axes (deterministic pixels)."""
    import numpy as np
    import pymupdf

    img = np.full((height, width, 3), 255, dtype=np.uint8)
    xs = np.arange(width)
    img[::3, :, 0] = (255 - xs * 120 // width).astype(np.uint8)
    img[::3, :, 1] = 230
    curve = (height / 2 - np.sin(xs / 30.0) * height / 3).astype(int)
    for dy in range(-2, 3):
        img[np.clip(curve + dy, 0, height - 1), xs] = (200, 0, 0)
    img[height - 10, :] = 0
    img[:, 10] = 0
    pix = pymupdf.Pixmap(pymupdf.csRGB, width, height, img.tobytes(), False)
    return pix.tobytes("png")


def _paragraph(page, rect, text: str, size: float = 10) -> None:
    import pymupdf

    page.insert_textbox(pymupdf.Rect(rect), text, fontsize=size, fontname="tiro", align=pymupdf.TEXT_ALIGN_JUSTIFY)


@functools.cache
def paper_pdf() -> bytes:
    """Two US-letter pages: p0 title/text/figure/caption/equation, p1 table/caption/text."""
    import pymupdf

    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    page.insert_text((72, 80), "Region Detection in Scientific Articles", fontsize=18, fontname="tibo")
    _paragraph(page, (72, 100, 540, 200), "1 Introduction\n" + LOREM + " " + LOREM)
    page.insert_image(pymupdf.Rect(156, 210, 456, 398), stream=_plot_png())
    _paragraph(page, (72, 404, 540, 430), "Figure 1: Detection accuracy as a function of page complexity.", 9)
    _paragraph(page, (72, 440, 540, 520), LOREM)
    page.insert_text((250, 560), "E = m c² + ∑ᵢ pᵢ² / 2m", fontsize=14, fontname="tiro")
    page.insert_text((510, 560), "(1)", fontsize=10, fontname="tiro")
    _paragraph(page, (72, 580, 540, 700), LOREM + " " + LOREM)

    page = doc.new_page(width=612, height=792)
    _paragraph(page, (72, 72, 540, 110), "Table 1: Results per document class and backend.", 9)
    rows = [("Class", "Pages", "Figures", "Tables", "Accuracy")] + [
        (f"Class {i}", str(10 * i + 3), str(i * 2), str(i), f"0.{80 + i}") for i in range(1, 7)
    ]
    x0, y0, col_w, row_h = 110, 115, 80, 20
    for r, row in enumerate(rows):
        for c, cell in enumerate(row):
            page.insert_text(
                (x0 + c * col_w + 6, y0 + r * row_h + 14), cell, fontsize=9, fontname="tibo" if r == 0 else "tiro"
            )
    for r in range(len(rows) + 1):
        page.draw_line((x0, y0 + r * row_h), (x0 + col_w * 5, y0 + r * row_h), width=0.8 if r in (0, 1) else 0.4)
    for c in range(6):
        page.draw_line((x0 + c * col_w, y0), (x0 + c * col_w, y0 + row_h * len(rows)), width=0.4)
    _paragraph(page, (72, 280, 540, 420), "2 Results\n" + LOREM + " " + LOREM)
    _paragraph(page, (72, 430, 540, 560), LOREM)
    return doc.tobytes()


@functools.cache
def scanned_pdf(dpi: int = 150) -> bytes:
    """A small scanned page: a heading and a paragraph rendered to an image, placed on an image-only page.

    Kept small (a half-letter page, few lines) because CPU OCR costs seconds per line-heavy page.
    """
    import pymupdf

    src = pymupdf.open()
    page = src.new_page(width=420, height=240)
    page.insert_text((36, 50), "Scanned Results", fontsize=16, fontname="tibo")
    _paragraph(page, (36, 70, 384, 200), "The detector finds figures and tables on scanned pages as well.", 11)
    png = page.get_pixmap(dpi=dpi).tobytes("png")
    doc = pymupdf.open()
    doc.new_page(width=420, height=240).insert_image(pymupdf.Rect(0, 0, 420, 240), stream=png)
    return doc.tobytes()


@functools.cache
def scanned_equation_pdf(dpi: int = 150) -> bytes:
    """A scanned page: prose, a centred display equation numbered (2), prose; rendered to an image-only page."""
    import pymupdf

    src = pymupdf.open()
    page = src.new_page(width=612, height=792)
    _paragraph(page, (72, 290, 540, 420), LOREM, 11)
    page.insert_text((180, 470), "f(x) = a x + b y - z", fontsize=18, fontname="tiit")
    page.insert_text((470, 470), "(2)", fontsize=12, fontname="tiro")
    _paragraph(page, (72, 510, 540, 640), LOREM, 11)
    png = page.get_pixmap(dpi=dpi).tobytes("png")
    doc = pymupdf.open()
    doc.new_page(width=612, height=792).insert_image(pymupdf.Rect(0, 0, 612, 792), stream=png)
    return doc.tobytes()


def one_line_pdf(text: str = "hello world", width: float = 612, height: float = 792) -> bytes:
    import pymupdf

    doc = pymupdf.open()
    doc.new_page(width=width, height=height).insert_text((36, 72), text)
    return doc.tobytes()


def encrypted_pdf() -> bytes:
    import pymupdf

    doc = pymupdf.open(stream=one_line_pdf())
    return doc.tobytes(encryption=pymupdf.PDF_ENCRYPT_AES_256, user_pw="secret", owner_pw="owner")


def owner_only_encrypted_pdf() -> bytes:
    """Encrypted with an empty user password (only permissions restricted): must open."""
    import pymupdf

    doc = pymupdf.open(stream=one_line_pdf())
    return doc.tobytes(encryption=pymupdf.PDF_ENCRYPT_AES_256, owner_pw="owner", permissions=0)


def zero_page_pdf() -> bytes:
    """A syntactically valid PDF whose page tree is empty (written by hand: writers refuse to save it)."""
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [] /Count 0 >>"]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objs, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    for off in offsets:
        out += b"%010d 00000 n \n" % off
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return bytes(out)


def truncated_pdf() -> bytes:
    """The first 60% of a real document: a cut download (no %%EOF, broken xref)."""
    data = paper_pdf()
    return data[: int(len(data) * 0.6)]


def huge_page_pdf() -> bytes:
    """One page of 200 in × 600 in: three times the default page-area limit."""
    return one_line_pdf(width=14400, height=14400 * 3)


GARBAGE = b"\x89PNG\r\n\x1a\n this is not a pdf at all " * 20


def _grid_table(page, x0: float, y0: float, cols: int, rows: int, col_w: float, row_h: float, size: float) -> tuple:
    """A ruled table of text cells (a head row, then numbers); returns its box."""
    for r in range(rows):
        for c in range(cols):
            cell = f"Col {c + 1}" if r == 0 else (f"Row {r}" if c == 0 else f"{(r * 7 + c * 3) % 97}.{r + c}")
            page.insert_text(
                (x0 + c * col_w + 5, y0 + r * row_h + row_h * 0.7),
                cell,
                fontsize=size,
                fontname="tibo" if r == 0 else "tiro",
            )
    for r in range(rows + 1):
        page.draw_line(
            (x0, y0 + r * row_h), (x0 + cols * col_w, y0 + r * row_h), width=0.8 if r in (0, 1, rows) else 0.4
        )
    for c in range(cols + 1):
        page.draw_line((x0 + c * col_w, y0), (x0 + c * col_w, y0 + rows * row_h), width=0.4)
    return (x0, y0, x0 + cols * col_w, y0 + rows * row_h)


@functools.cache
def image_only_table_pdf() -> tuple[bytes, tuple]:
    """One image-only page (no text layer) whose only object is a ruled table: (pdf, table box in points)."""
    import pymupdf

    src = pymupdf.open()
    page = src.new_page(width=612, height=792)
    box = _grid_table(page, 96, 200, 5, 12, 84, 22, 10)
    png = page.get_pixmap(dpi=150, colorspace=pymupdf.csGRAY).tobytes("png")
    doc = pymupdf.open()
    doc.new_page(width=612, height=792).insert_image(pymupdf.Rect(0, 0, 612, 792), stream=png)
    return doc.tobytes(), box


@functools.cache
def landscape_table_pdf() -> tuple[bytes, tuple]:
    """One landscape page that is one big vector table (text cells and drawn rules): (pdf, table box)."""
    import pymupdf

    doc = pymupdf.open()
    page = doc.new_page(width=792, height=612)
    page.insert_text((60, 50), "Table 3: Measurements per site and season.", fontsize=10, fontname="tiro")
    box = _grid_table(page, 60, 66, 8, 20, 84, 24, 9)
    return doc.tobytes(), box
