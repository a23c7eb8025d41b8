"""Small PDFs written with PyMuPDF for the job tests: text, a raster figure, a vector table, an equation."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

LOREM = (
    "We measure the conductivity of doped perovskite films as a function of temperature. The samples were "
    "annealed at 450 C and characterised by X-ray diffraction. Results are shown in the figure below, and the "
    "fitted parameters are listed in the table. The activation energy follows from an Arrhenius fit. "
)


def _raster_png(w: int = 320, h: int = 200, seed: int = 0) -> bytes:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    for i in range(12):
        x = 20 + i * 24
        top = 180 - ((i * 37 + seed * 11) % 150)
        d.rectangle([x, top, x + 16, 180], fill=(40 + 15 * i, 90, 200 - 10 * i))
    d.line([10, 180, 310, 180], fill="black", width=2)
    d.line([10, 10, 10, 180], fill="black", width=2)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def write_paper(path: Path, n_pages: int = 2, seed: int = 0) -> Path:
    import pymupdf

    doc = pymupdf.open()
    for p in range(n_pages):
        page = doc.new_page(width=612, height=792)
        y = 60
        page.insert_text((72, y), f"Section {p + 1}: Results of experiment {seed}", fontsize=14)
        y += 20
        rect = pymupdf.Rect(72, y, 540, y + 150)
        page.insert_textbox(rect, (LOREM * 2) + f" Paper {seed}, page {p}.", fontsize=10)
        y += 160
        fig = pymupdf.Rect(150, y, 462, y + 190)
        page.insert_image(fig, stream=_raster_png(seed=seed + p))
        y += 200
        page.insert_text((150, y + 8), f"Figure {p + 1}. Conductivity versus temperature (sample {seed}).", fontsize=9)
        y += 30
        # a vector-drawn table: ruled grid with numbers
        x0, cols, rows, cw, rh = 150, 4, 4, 78, 16
        for r in range(rows + 1):
            page.draw_line((x0, y + r * rh), (x0 + cols * cw, y + r * rh))
        for c in range(cols + 1):
            page.draw_line((x0 + c * cw, y), (x0 + c * cw, y + rows * rh))
        for r in range(rows):
            for c in range(cols):
                label = ["T (K)", "sigma", "Ea", "n"][c] if r == 0 else f"{(r * 1.7 + c * 0.3 + seed):.2f}"
                page.insert_text((x0 + c * cw + 4, y + r * rh + 12), label, fontsize=8)
        y += rows * rh + 30
        page.insert_text((200, y), "sigma(T) = sigma_0 exp(-E_a / k_B T)        (1)", fontsize=12)
        y += 30
        page.insert_textbox(pymupdf.Rect(72, y, 540, y + 120), LOREM, fontsize=10)
    doc.save(path)
    doc.close()
    return path


def write_corpus(folder: Path) -> Path:
    """3 good papers, a byte-identical duplicate, an empty file, a non-PDF, and a non-PDF-named file ignored."""
    folder.mkdir(parents=True, exist_ok=True)
    write_paper(folder / "a.pdf", n_pages=2, seed=1)
    write_paper(folder / "b.pdf", n_pages=3, seed=2)
    write_paper(folder / "c.pdf", n_pages=1, seed=3)
    shutil.copy(folder / "a.pdf", folder / "a_copy.pdf")
    (folder / "empty.pdf").write_bytes(b"")
    (folder / "notes.pdf").write_bytes(b"these are plain-text notes, not a PDF\n" * 10)
    (folder / "README.txt").write_text("not part of the corpus: directory inputs take PDFs only\n")
    return folder
