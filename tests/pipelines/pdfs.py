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


_WORDS = (
    "film oxide grain boundary diffusion anneal conductivity mobility carrier density substrate lattice strain "
    "phonon scattering spectrum peak width model parameter energy activation barrier defect vacancy dopant "
    "thickness deposition pressure surface roughness interface contact resistance voltage hysteresis stability "
    "crystal phase transition magnetic susceptibility entropy electron recombination lifetime absorption band gap"
).split()


def prose(seed: int, n_words: int = 90) -> str:
    """Seeded scientific-sounding text: each paper its own words, so different papers are not near-duplicates."""
    import random

    rng = random.Random(seed)
    words = [rng.choice(_WORDS) for _ in range(n_words)]
    return " ".join(" ".join(words[i : i + 12]).capitalize() + "." for i in range(0, n_words, 12))


def draw_table(page, y: float, seed: int, x0: float = 150) -> float:
    """A vector-drawn table at height ``y``: a ruled 4 x 4 grid, a header row and seeded numbers. Returns its
    bottom edge."""
    cols, rows, cw, rh = 4, 4, 78, 16
    for r in range(rows + 1):
        page.draw_line((x0, y + r * rh), (x0 + cols * cw, y + r * rh))
    for c in range(cols + 1):
        page.draw_line((x0 + c * cw, y), (x0 + c * cw, y + rows * rh))
    for r in range(rows):
        for c in range(cols):
            label = ["T (K)", "sigma", "Ea", "n"][c] if r == 0 else f"{(r * 1.7 + c * 0.3 + seed):.2f}"
            page.insert_text((x0 + c * cw + 4, y + r * rh + 12), label, fontsize=8)
    return y + rows * rh


def write_paper(path: Path, n_pages: int = 2, seed: int = 0) -> Path:
    import pymupdf

    doc = pymupdf.open()
    for p in range(n_pages):
        page = doc.new_page(width=612, height=792)
        y = 60
        page.insert_text((72, y), f"Section {p + 1}: Results of experiment {seed}", fontsize=14)
        y += 20
        rect = pymupdf.Rect(72, y, 540, y + 150)
        page.insert_textbox(rect, LOREM + prose(seed * 100 + p) + f" Paper {seed}, page {p}.", fontsize=10)
        y += 160
        fig = pymupdf.Rect(150, y, 462, y + 190)
        page.insert_image(fig, stream=_raster_png(seed=seed + p))
        y += 200
        page.insert_text((150, y + 8), f"Figure {p + 1}. Conductivity versus temperature (sample {seed}).", fontsize=9)
        y += 30
        y = draw_table(page, y, seed) + 30
        page.insert_text((200, y), "sigma(T) = sigma_0 exp(-E_a / k_B T)        (1)", fontsize=12)
        y += 30
        page.insert_textbox(pymupdf.Rect(72, y, 540, y + 120), prose(seed * 100 + p + 50, 60), fontsize=10)
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


# ----------------------------------------------------------------------------------------- hostile inputs
def _raw_pdf(objs: dict[int, bytes], root: int = 1) -> bytes:
    """A classic PDF (header, objects, xref table, trailer) from numbered object bodies."""
    out = bytearray(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
    offsets = {}
    for n in sorted(objs):
        offsets[n] = len(out)
        out += b"%d 0 obj\n" % n + objs[n] + b"\nendobj\n"
    size = max(objs) + 1
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % size
    for n in range(1, size):
        out += (b"%010d 00000 n \n" % offsets[n]) if n in offsets else b"0000000000 65535 f \n"
    out += b"trailer\n<< /Size %d /Root %d 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (size, root, xref)
    return bytes(out)


def _stream(dict_body: bytes, data: bytes) -> bytes:
    return b"<< " + dict_body + b" /Length %d >>\nstream\n" % len(data) + data + b"\nendstream"


def hanging_pdf(n_pages: int = 1, hanging: tuple[int, ...] = (0,), depth: int = 40) -> bytes:
    """A PDF whose pages in ``hanging`` never finish drawing: each draws a form XObject that draws the next one
    twice, ``depth`` levels deep (2^(depth-1) fills: MuPDF's text extraction and rendering, and pdfium, run
    for days on depth 40; depth 20 takes seconds). The other pages carry ordinary text. No hook involved: it
    is the "billion laughs" of PDF, a file as a hostile crawler result could be."""
    objs: dict[int, bytes] = {
        1: b"<< /Type /Catalog /Pages 2 0 R >>",
        3: b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    }
    form0 = 10
    for k in range(depth):
        last = k == depth - 1
        body = b"0 0 1 1 re f" if last else b"q 0.5 0 0 0.5 0 0 cm /X0 Do Q q 0.5 0 0 0.5 306 396 cm /X0 Do Q"
        res = b"<< >>" if last else b"<< /XObject << /X0 %d 0 R >> >>" % (form0 + k + 1)
        objs[form0 + k] = _stream(b"/Type /XObject /Subtype /Form /BBox [0 0 612 792] /Resources " + res, body)
    lines = [
        b"Page %d of a document built to test the page timeout of the parser.",
        b"The parser must give up on the pages that never finish drawing, and keep the others.",
        b"A page that draws a form which draws the next form twice, forty levels deep, never ends.",
        b"Every other page of the document carries ordinary text like this paragraph.",
    ]
    # body text in the middle of the page (a layout model takes lines at the very top for a header)
    return _text_pages(objs, form0 + depth, n_pages, hanging, lines, 460, b"q /X0 Do Q", b"/X0 %d 0 R" % form0)


def _text_pages(
    objs: dict[int, bytes],
    first: int,
    n_pages: int,
    bad: tuple[int, ...],
    lines: list[bytes],
    top: int,
    draw: bytes,
    xobjects: bytes,
) -> bytes:
    """A hostile test PDF's pages (objects from ``first`` on) and page tree: every page carries ``lines`` of text
    at ``top`` (``%d`` in the first line is the page number); the pages in ``bad`` also run ``draw`` with
    ``xobjects`` as their XObject resources."""
    kids = []
    for p in range(n_pages):
        page_obj, content_obj = first + 2 * p, first + 2 * p + 1
        body = [lines[0] % (p + 1), *lines[1:]]
        text = b"BT /F0 11 Tf 72 %d Td 14 TL " % top + b" ".join(b"(%s) Tj T*" % line for line in body) + b" ET"
        objs[content_obj] = _stream(b"", text + (b" " + draw if p in bad else b""))
        res = b"/Font << /F0 3 0 R >>" + (b" /XObject << " + xobjects + b" >>" if p in bad else b"")
        objs[page_obj] = (
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R /Resources << " % content_obj
            + res
            + b" >> >>"
        )
        kids.append(b"%d 0 R" % page_obj)
    objs[2] = b"<< /Type /Pages /Kids [" + b" ".join(kids) + b"] /Count %d >>" % n_pages
    return _raw_pdf(objs)


def _zeros_flate2(n_bytes: int) -> bytes:
    """``n_bytes`` zero bytes compressed twice with Flate (the first pass is itself runs of equal bytes): about
    a million to one, so a gigapixel image costs a few hundred bytes of file."""
    import zlib

    c = zlib.compressobj(9)
    chunk = bytes(1 << 22)
    parts = [c.compress(chunk) for _ in range(n_bytes // len(chunk))]
    parts += [c.compress(bytes(n_bytes % len(chunk))), c.flush()]
    return zlib.compress(b"".join(parts), 9)


def hanging_render_pdf(n_pages: int, hanging: tuple[int, ...], images: int = 400, side: int = 30_000) -> bytes:
    """A PDF whose pages in ``hanging`` read like any other page (their text and content stream end at once) but
    take minutes to render: each draws ``images`` distinct 1-bit images of ``side``² pixels, compressed to a few
    hundred bytes each (``_zeros_flate2``); MuPDF decodes every pixel of each to draw it (about a second per
    30,000² image here). The other pages carry ordinary text. No hook involved: rendering such a page is where
    a parse worker's thread used to hang outside the page timeout."""
    data = _zeros_flate2(side * side // 8)
    image = _stream(
        b"/Type /XObject /Subtype /Image /Width %d /Height %d /ColorSpace /DeviceGray /BitsPerComponent 1 "
        b"/Filter [/FlateDecode /FlateDecode]" % (side, side),
        data,
    )
    objs: dict[int, bytes] = {
        1: b"<< /Type /Catalog /Pages 2 0 R >>",
        3: b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    }
    first_image = 10
    for k in range(images):
        objs[first_image + k] = image
    names = b" ".join(b"/Im%d %d 0 R" % (k, first_image + k) for k in range(images))
    draws = b" ".join(b"q 300 0 0 200 %d %d cm /Im%d Do Q" % (150 + k % 8, 100 + k % 5, k) for k in range(images))
    lines = [
        b"Page %d of a document built to test the page timeout of the parser's renders.",
        b"Some pages of it draw hundreds of gigapixel images: their text reads at once, their pixels do not.",
        b"The parser must quarantine those pages after the page timeout and keep all the others.",
        b"Every other page of the document carries ordinary text like this paragraph.",
    ]
    return _text_pages(objs, first_image + images, n_pages, hanging, lines, 660, draws, names)


def zero_pages_pdf() -> bytes:
    return _raw_pdf({1: b"<< /Type /Catalog /Pages 2 0 R >>", 2: b"<< /Type /Pages /Kids [] /Count 0 >>"})


def huge_page_pdf(side_pt: float = 20_000 * 72) -> bytes:
    """One page of 20,000 in × 20,000 in (rendering it at crop DPI would need terabytes)."""
    content = _stream(b"", b"BT /F0 12 Tf 72 72 Td (A very large page.) Tj ET")
    page = b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 %d %d] /Contents 4 0 R >>" % (side_pt, side_pt)
    return _raw_pdf(
        {1: b"<< /Type /Catalog /Pages 2 0 R >>", 2: b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>", 3: page, 4: content}
    )


def encrypted_pdf(tmp: Path) -> bytes:
    import pymupdf

    write_paper(tmp, n_pages=1, seed=7)
    doc = pymupdf.open(tmp)
    data = doc.tobytes(encryption=pymupdf.PDF_ENCRYPT_AES_256, user_pw="secret", owner_pw="owner")
    doc.close()
    return data


def write_hostile(folder: Path) -> dict[str, tuple[str, int]]:
    """Hostile files, each with the reason it must be quarantined for and its number of hanging pages:
    file name -> (stage.reason, hanging pages)."""
    folder.mkdir(parents=True, exist_ok=True)
    good = write_paper(folder / ".good.tmp", n_pages=2, seed=11).read_bytes()
    files = {
        "hang_one_page.pdf": (hanging_pdf(1, (0,)), "parse.timeout", 1),
        "hang_page_2_of_3.pdf": (hanging_pdf(3, (1,)), "parse.timeout", 1),
        "corrupt.pdf": (b"%PDF-1.7\n" + bytes(range(256)) * 40 + b"\n%%EOF\n", "open.corrupt", 0),
        "truncated.pdf": (good[: len(good) // 2], "open.truncated", 0),
        "encrypted.pdf": (encrypted_pdf(folder / ".enc.tmp"), "open.encrypted", 0),
        "zero_pages.pdf": (zero_pages_pdf(), "open.zero_pages", 0),
        "huge_page.pdf": (huge_page_pdf(), "open.page_too_large", 0),
        "empty.pdf": (b"", "open.empty", 0),
        "not_a_pdf.pdf": (b"<html><body>404 not found</body></html>\n" * 20, "open.not_pdf", 0),
    }
    for tmp in (".good.tmp", ".enc.tmp"):
        (folder / tmp).unlink(missing_ok=True)
    out = {}
    for name, (data, reason, hanging) in files.items():
        (folder / name).write_bytes(data)
        out[name] = (reason, hanging)
    return out
