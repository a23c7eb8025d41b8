"""Self-labelled layout data: display-equation boxes read from digital PDFs' text layer, paired with page images
degraded the way scans are, split by document (issue 39).

    python benchmarks/layout.py --self-label ../shared/samples --out /tmp/selflabel      # write the data set
    python benchmarks/layout.py --self-label ../shared/devset/pdfs --out /tmp/sl --truth ../shared/devset
                                                           # ... and score the labels against reference boxes

A digital paper typeset from LaTeX says where its display equations are: glyphs in math fonts (or math
symbols) on rows of their own, indented from the text column or numbered "(n)" at its right edge. Those rows
grouped (with the limits, delimiters and "otherwise" words set between them, without the "(n)" number) are
one equation box, the convention of the development set's references. Figures are labelled only where the
text layer makes them certain: a raster image (no text over it) with a "Figure n" caption line touching it.
Tables are not labelled (ruled grids and theorem frames look alike to the drawing log). Pages where the text
layer is unusable (image-only, or no line at all) give no labels; a page with labels and one without are both
kept (the empty page teaches "no equation here").

Each page is rendered at a random resolution, then degraded: a small skew (boxes rotated with it), blur,
Gaussian noise and JPEG compression (``Degrade``). The document, not the page, picks the split (a hash of
its file name), so no paper has pages on both sides of a train/test line. ``DIR/<split>/labels.jsonl``
holds one line per page: the image path, the page size in points, pixels per point, the degradation drawn,
and the boxes in image pixels.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from parsing.geometry import (
    BBox,
    area,
    box_gap,
    containment,
    group_adjacent,
    horizontal_overlap,
    intersection,
    union,
)
from parsing.layout_rules import _EQ_NUMBER, _FIGURE_LABEL, _WORD, Line, PageInfo, _vertical_overlap

if TYPE_CHECKING:
    import pymupdf
    from PIL import Image

SPLITS = (("train", 0.8), ("val", 0.9), ("test", 1.0))
"""A document's split: the first whose bound exceeds its name's hash in [0, 1)."""


@dataclass(frozen=True)
class Label:
    """One labelled box of a page, in PDF points (top-left origin)."""

    kind: str
    bbox: BBox


# ---- labels from the text layer ------------------------------------------------------------------------
def _words(text: str) -> list[str]:
    """Words of two letters or more ("x²" is a variable with an exponent, not a word)."""
    return [w for w in _WORD.findall(text) if w.isalpha()]


def _mathy(ln: Line) -> bool:
    """A line that belongs to a formula: mostly math-font glyphs or math symbols, or a short piece of one (a
    limit, a subscript, a big delimiter) in a math font; never a line of several words."""
    words = _words(ln.text)
    if len(words) >= 3 and ln.math_frac < 0.4:
        return False
    if ln.math_font and (ln.math_frac >= 0.4 or len(ln.text.strip()) <= 3 or len(words) <= 2 and ln.math_frac >= 0.2):
        return True  # (operator names such as "argmin", "exp" are set in the roman text font)
    return ln.math and not any(len(w) >= 3 for w in words)


def _prose(ln: Line) -> bool:
    """A line of running text: three words or more, little of it mathematics."""
    return len(_words(ln.text)) >= 3 and ln.math_frac < 0.5


def display_equations(info: PageInfo) -> list[BBox]:
    """Display-equation boxes of a page from its text layer (see the module docstring).

    Math lines are grouped when they touch (gap under 0.6 line heights). A group is a display when no line of
    running text shares its rows (beside it in the same column: inline math continues a sentence), it holds a
    math-font glyph or a math symbol, and it is set apart: numbered "(n)" on one of its rows at the right, or indented from the
    column's text on the left by 1.5 line heights or more. Short words between its parts ("otherwise", "if")
    join it; the number does not."""
    lh = info.line_height
    numbers = [ln for ln in info.lines if _EQ_NUMBER.match(ln.text.strip().lstrip(",.;:").strip())]
    math = [ln for ln in info.lines if _mathy(ln) and ln not in numbers]
    prose = [ln for ln in info.lines if _prose(ln)]
    # math lines that touch: one group
    by_root = {g[0]: [math[i] for i in g] for g in group_adjacent([ln.bbox for ln in math], 0.6 * lh, [])}
    # groups whose boxes touch are one (a sum's limits under a fraction, a brace beside its cases), and so are
    # groups on one row less than two line heights apart (the spaces of "x = 1,  y = 2", "otherwise")
    groups = list(by_root.values())
    merged = True
    while merged:
        merged = False
        for i in range(len(groups)):
            for j in range(i + 1, len(groups)):
                a, b = union([ln.bbox for ln in groups[i]]), union([ln.bbox for ln in groups[j]])
                row = _vertical_overlap(a, b) >= 0.3 and max(a[0], b[0]) - min(a[2], b[2]) <= 2 * lh
                if row or box_gap(a, b) <= 0.6 * lh:
                    groups[i] = groups[i] + groups.pop(j)
                    merged = True
                    break
            if merged:
                break
    drawn = info.images + [p for p in info.paths if min(p[2] - p[0], p[3] - p[1]) >= 2.0]
    out: list[BBox] = []
    for g in groups:
        box = union([ln.bbox for ln in g])
        if any(intersection(d, box) >= 0.3 * area(box) for d in info.images) or (
            sum(1 for d in drawn if intersection(d, box) > 0) >= 3
        ):
            continue  # labels in a figure
        if not any(ln.math_font for ln in g) and not any(ln.math for ln in g):
            continue
        if sum(len(ln.text.strip()) for ln in g) < 4 or box[2] - box[0] < 2 * lh:
            continue  # a stray symbol
        beside = [
            p
            for p in prose
            if _vertical_overlap(p.bbox, box) >= 0.5
            and max(p.bbox[0], box[0]) - min(p.bbox[2], box[2]) < 0.5 * lh  # touching or overlapping in x
        ]
        if beside:
            continue  # inline math inside a sentence
        numbered = any(  # the number on one of its rows (or just under its last: a multi-line display)
            box[1] <= (n.bbox[1] + n.bbox[3]) / 2 <= box[3] + 0.5 * lh
            and n.bbox[2] > box[2]
            and n.bbox[0] > (box[0] + box[2]) / 2
            and n.bbox[0] - box[2] < 0.5 * info.width
            for n in numbers
        )
        near = [p.bbox for p in prose if abs(p.bbox[1] - box[1]) < 10 * lh and horizontal_overlap(p.bbox, box) > 0]
        col_left = min((b[0] for b in near), default=None)
        indented = col_left is not None and box[0] - col_left >= 1.5 * lh
        if not (numbered or indented):
            continue
        # short words set inside the display ("otherwise", "if", "for all")
        for ln in info.lines:
            if ln in g or ln in numbers or _prose(ln):
                continue
            inside_x = ln.bbox[0] >= box[0] - 0.5 * lh and ln.bbox[2] <= box[2] + 0.5 * lh
            if inside_x and containment(ln.bbox, box) < 0.5 and _vertical_overlap(ln.bbox, box) >= 0.6:
                box = union([box, ln.bbox])
        out.append(box)
    # a group inside another's box (a fraction bar's pieces) is part of it
    return [b for b in out if not any(o is not b and containment(b, o) >= 0.8 for o in out)]


def captioned_figures(info: PageInfo) -> list[BBox]:
    """Raster figures the text layer makes certain: images at least 28 pt a side with no text over them but
    short labels (a line of text over an image makes it a background; touching images form one figure), whose box has a "Figure n" caption line within two line heights
    below or above it, overlapping it in x."""
    from parsing.geometry import clusters

    page_area = info.width * info.height
    cand = [
        im
        for im in info.images
        if min(im[2] - im[0], im[3] - im[1]) >= 28
        and (im[2] - im[0]) * (im[3] - im[1]) < 0.6 * page_area
        and not any(containment(ln.bbox, im) >= 0.5 and len(ln.text.strip()) > 8 for ln in info.lines)
    ]
    if not cand:
        return []
    captions = [ln for ln in info.lines if _FIGURE_LABEL.match(ln.text)]
    out = []
    for g in clusters((0.0, 0.0, info.width, info.height), cand, 4.0, cell=2.0):
        box = union([cand[i] for i in g])
        for c in captions:
            gap = max(c.bbox[1] - box[3], box[1] - c.bbox[3])
            if -1 <= gap <= 2 * info.line_height and horizontal_overlap(c.bbox, box) > 0:
                out.append(box)
                break
    return out


def page_labels(page: pymupdf.Page) -> list[Label] | None:
    """The page's labels, or None when its text layer cannot label it (no text lines: a scan)."""
    from parsing.layout_rules import page_info
    from parsing.postprocess import page_elements

    text = page.get_text("dict", flags=0)
    graphics, _, paths = page_elements(page, text)
    info = page_info(page, graphics, paths, text)
    if not info.lines:
        return None
    return [Label("equation", b) for b in display_equations(info)] + [
        Label("figure", b) for b in captioned_figures(info)
    ]


# ---- degradation ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Degrade:
    """How one page image was degraded (drawn per page by ``Degrade.draw``)."""

    dpi: float
    """Render resolution (dots per inch)."""
    skew_deg: float
    """Rotation, degrees counter-clockwise, about the image centre (white fill)."""
    blur: float
    """Gaussian blur radius, pixels."""
    noise: float
    """Standard deviation of additive Gaussian noise, grey levels."""
    jpeg: int
    """JPEG quality."""

    @staticmethod
    def draw(rng: random.Random) -> Degrade:
        return Degrade(
            dpi=rng.uniform(90, 200),
            skew_deg=rng.uniform(-1.5, 1.5),
            blur=rng.choice((0.0, rng.uniform(0.3, 1.2))),
            noise=rng.uniform(0.0, 12.0),
            jpeg=rng.randint(25, 90),
        )


def rotate_box(box: BBox, deg: float, cx: float, cy: float) -> BBox:
    """The axis-aligned box around ``box`` rotated by ``deg`` (counter-clockwise on screen, as PIL's
    ``Image.rotate``) about (cx, cy), in image coordinates (y down)."""
    a = math.radians(deg)
    cos, sin = math.cos(a), math.sin(a)
    xs, ys = [], []
    for x, y in ((box[0], box[1]), (box[2], box[1]), (box[0], box[3]), (box[2], box[3])):
        dx, dy = x - cx, y - cy
        xs.append(cx + dx * cos + dy * sin)
        ys.append(cy - dx * sin + dy * cos)
    return (min(xs), min(ys), max(xs), max(ys))


def degraded_image(page: pymupdf.Page, d: Degrade, seed: int) -> tuple[Image.Image, float]:
    """The page rendered at ``d.dpi`` in grey and degraded by ``d``; returns (image, pixels per point). Boxes
    map to it by scaling with pixels per point, then ``rotate_box`` about the image centre."""
    import numpy as np
    import pymupdf
    from PIL import Image, ImageFilter

    zoom = d.dpi / 72.0
    pix = page.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom), colorspace=pymupdf.csGRAY, alpha=False)
    img = Image.frombytes("L", (pix.width, pix.height), pix.samples)
    if d.skew_deg:
        img = img.rotate(d.skew_deg, resample=Image.BILINEAR, fillcolor=255)
    if d.blur:
        img = img.filter(ImageFilter.GaussianBlur(d.blur))
    if d.noise:
        arr = np.asarray(img, dtype=np.float32)
        arr += np.random.default_rng(seed).normal(0.0, d.noise, arr.shape)
        img = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
    return img, zoom


def degraded_pdf(pdf: bytes, seed: int = 0, skew: bool = False) -> bytes:
    """``pdf`` with every page replaced by a degraded render (image-only pages of the same size), for scoring
    a parser on scans of pages whose reference boxes are known. ``skew=False`` keeps the boxes where they
    were (a skewed page moves them by a few points)."""
    import io

    import pymupdf

    src = pymupdf.open(stream=pdf)
    out = pymupdf.open()
    rng = random.Random(seed)
    for p in src:
        d = Degrade.draw(rng)
        if not skew:
            d = Degrade(d.dpi, 0.0, d.blur, d.noise, d.jpeg)
        img, _ = degraded_image(p, d, rng.randint(0, 2**31))
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=d.jpeg)
        out.new_page(width=p.rect.width, height=p.rect.height).insert_image(p.rect, stream=buf.getvalue())
    return out.tobytes()


def split_of(name: str) -> str:
    """The split of a document, from a hash of its file name (stable across runs and machines)."""
    h = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") / 2**64
    return next(s for s, bound in SPLITS if h < bound)


# ---- the data set --------------------------------------------------------------------------------------
def label_pdf(path: Path) -> Iterator[tuple[int, list[Label] | None]]:
    """(page index, labels or None) for every page of a PDF."""
    import pymupdf

    with pymupdf.open(path) as doc:
        for page in doc:
            yield page.number, page_labels(page)


def write_dataset(pdfs: list[Path], out: Path, seed: int = 0) -> dict[str, int]:
    """Write the degraded page images and their labels under ``out`` (see the module docstring); returns
    counts (pages, labelled boxes per kind, skipped pages, pages per split)."""
    import pymupdf

    counts: dict[str, int] = {}
    rng = random.Random(seed)
    files = {}
    try:
        for path in pdfs:
            split = split_of(path.name)
            (out / split / "images").mkdir(parents=True, exist_ok=True)
            if split not in files:
                files[split] = (out / split / "labels.jsonl").open("w")
            with pymupdf.open(path) as doc:
                for page in doc:
                    labels = page_labels(page)
                    if labels is None:
                        counts["skipped_pages"] = counts.get("skipped_pages", 0) + 1
                        continue
                    d = Degrade.draw(rng)
                    img, zoom = degraded_image(page, d, rng.randint(0, 2**31))
                    name = f"{path.stem[:60]}_p{page.number:04d}.jpg"
                    img.save(out / split / "images" / name, "JPEG", quality=d.jpeg)
                    cx, cy = img.width / 2, img.height / 2
                    boxes = [
                        {
                            "kind": lb.kind,
                            "bbox_pt": [round(v, 2) for v in lb.bbox],
                            "bbox_px": [
                                round(v, 1)
                                for v in rotate_box(tuple(v * zoom for v in lb.bbox), d.skew_deg, cx, cy)  # type: ignore[arg-type]
                            ],
                        }
                        for lb in labels
                    ]
                    row = {
                        "image": f"images/{name}",
                        "pdf": path.name,
                        "page": page.number,
                        "width_pt": page.rect.width,
                        "height_pt": page.rect.height,
                        "px_per_pt": zoom,
                        "size_px": [img.width, img.height],
                        "degrade": asdict(d),
                        "boxes": boxes,
                    }
                    files[split].write(json.dumps(row) + "\n")
                    counts["pages"] = counts.get("pages", 0) + 1
                    counts[f"pages_{split}"] = counts.get(f"pages_{split}", 0) + 1
                    for lb in labels:
                        counts[lb.kind] = counts.get(lb.kind, 0) + 1
    finally:
        for f in files.values():
            f.close()
    return counts


__all__ = [
    "Degrade",
    "Label",
    "captioned_figures",
    "degraded_image",
    "degraded_pdf",
    "display_equations",
    "label_pdf",
    "page_labels",
    "rotate_box",
    "split_of",
    "write_dataset",
]
