"""Page-level layout rules on top of the backend's boxes: what a careful reader would box, from the PDF itself.

Called by ``parsing.postprocess.refine_blocks`` (``scifolio parse`` / ``iter_parse``); each rule reads only the
page's text layer and drawing log (no second model) and is pinned by ``tests/parsing/test_layout_rules.py``.
With the default fused layout (``parsing.fusion``) the rules' output is one vote beside the DocLayNet detector's;
``--layout fast`` uses the rules alone.

Which rules state a property of PDFs in general, and which were written against one development file (issue 26
asks to drop the latter where fusion makes them unnecessary; each was measured with the fused layout without it,
``benchmarks/layout.py ../shared/devset --fit`` and synthetic pages, see benchmarks/RESULTS.md):

- general (a property of how PDFs are made): ``demote_prose_equations`` (no math font, no math symbol, words),
  ``add_raster_figures`` (an image drawn with no text over it), ``is_furniture`` (margin bands),
  ``merge_equation_lines``, ``fix_visual_kinds`` (caption labels, text-cell rows), ``grow_tables`` (drawn
  cells), ``add_numbered_equations`` / ``promote_display_math`` (math fonts, "(n)");
- written against one development file, kept because the fused score drops without them:
  ``split_scan_equations`` (the scanned page ``omnidocbench_evans_pde_ch6_p5``; without it devset micro-F1
  0.906 fused, 0.868 leave-one-file-out: the detector boxes only some of those equations on its own),
  ``demote_text_visuals``' shaded-heading case (``docling_normal_4pages``; without it 0.877: the detector
  calls the shaded headings pictures too);
- removed: ``panel_label_box`` (grew a figure over "(c) ..." panel labels set as loose lines, for
  ``mineru_demo2``): without it every box of the development set and of the synthetic pages is unchanged.
Measured with ``python benchmarks/layout.py ../shared/devset``. Reading the disagreements on the development
set and the samples, the causes were:

- **text boxed as a figure** (a shaded heading bar, a framed abstract, a whole title page called one
  picture): a figure without a labelled caption mostly covered by wide text lines, or text over a plain
  background, is text; drawings in it that hold no text stay figures (``demote_text_visuals``);
- **page furniture as figures** (the coloured band of a running header): figures in the top/bottom margin
  band spanning half the page width, without a caption, are dropped (``is_furniture``);
- **raster pictures the layout model missed** (a QR code): images at least ``_MIN_IMAGE_SIDE`` points on
  both sides, with no text over them, that no visual covers become figures (``add_raster_figures``);
- **prose boxed as an equation** (a running header, table-of-contents lines, a coloured section heading):
  an equation box with no math font, no math symbol and mostly words (three or more, or on one row one
  word that is no operator name) is text (``demote_prose_equations``);
- **one display equation in several boxes** (one per line of a derivation): adjacent equation boxes with
  nothing between them are one box per line group (``merge_equation_lines``);
- **display equations read as text or missed**: a right-aligned "(n)" after an indented math-font line
  group outside every block (``add_numbered_equations``); a short text block that is mostly math-font
  characters, indented on both sides and about centred (``promote_display_math``);
- **an equation region drawn across running text on a scan**: cut at its prose lines
  (``split_scan_equations``, used by the OCR backend);
- **a table missing its head row** (the shaded header cells): a table box grows over drawn cells just
  above/below it inside its column (``grow_tables``);
- **table vs figure vs framed text**: a "table" with no text inside is a picture, a visual whose labelled
  caption says "Figure n" is a figure, one whose caption says "Table n" over a text-cell grid is a table,
  a "table" of shapes with a few labels is a figure, and a "table" with no rows of cells and no inner
  rules or mostly running text (a theorem box) is text, and so is a "table" holding sentences (a theorem
  with a matrix in it) or a table of contents (page numbers, dot leaders) (``fix_visual_kinds``);
- **the detector's votes on a digital page** (issue 39: the DocLayNet detector boxes coloured headings as
  formulas, a contents page or a theorem as a table): its proposals are read by the same two rules before
  they vote (``postprocess.vet_proposals``, used by ``core.fused_blocks``); a page without a text layer
  keeps them as they are.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, NamedTuple

from formats.records import Block
from parsing.geometry import BBox, area, containment, horizontal_overlap, intersection, union

if TYPE_CHECKING:
    import pymupdf

_MATH_FONT = re.compile(
    r"(^|[+,-])(cmmi|cmsy|cmex|cmbsy|cmmib|msam|msbm|eufm|eusm|eurm|rsfs|stmary|wasy|esint|txsy|txex|pxsy|pxex|"
    r"mnsymbol|lmmath|latinmodernmath|stixmath|stixtwomath|xitsmath|cambriamath|symbol|mtextra|mathematicalpi|"
    r"euclid|mtsy|mtmi|rmtmi|mathematica|.*math)",
    re.I,
)
_MATH_CHARS = set("=<>≤≥≠≈∼≃≡∝±∓×÷·∑∏∫∮∂∇√∞∈∉⊂⊃⊆⊇∪∩∧∨¬∀∃→←↔⇒⇐⇔↦∘⊕⊗∥⊥∠°′″^_|") | {chr(c) for c in range(0x391, 0x3CA)}
_WORD = re.compile(r"[^\W\d_]{2,}")
_LEADER = re.compile(r"(\.\s*){3,}")
_OPERATOR_NAMES = frozenset(
    "sinh cosh tanh coth arcsin arccos arctan grad curl diag rank sign trace span supp ker coker hom "
    "card conv dist vol prob".split()
)
"""Words of four letters or more that a formula set in a text font may hold: not a heading's words."""
_PAGE_NUMBER = re.compile(r"^[0-9]{1,4}$|^[ivxlc]{1,6}$", re.I)
_EQ_NUMBER = re.compile(r"^\(\s*[0-9]+(\.[0-9]+)*[a-z]?\s*\)$|^\(\s*[A-Z]?[0-9]+(\.[0-9]+)*[a-z]?\s*\)$")
_FIGURE_LABEL = re.compile(r"^\s*(figure|fig\.|fig\s|scheme|chart|plate|abbildung|abb\.)", re.I)
_TABLE_LABEL = re.compile(r"^\s*(table|tab\.|tabelle)\s*[0-9IVX]", re.I)
_CAPTION_LABEL = re.compile(
    r"^\s*(figure|fig\.|fig\s|table|tab\.|scheme|chart|plate|exhibit|algorithm|listing|abbildung|abb\.|tabelle)", re.I
)
_TEXT_KINDS = frozenset({"text", "title", "list", "other", "caption"})
_MIN_IMAGE_SIDE = 28.0
"""A raster image smaller than this (points) on either side is an icon, a glyph or an inline mark."""
_MARGIN = 0.09
"""Top and bottom bands of the page (fraction of its height) where running headers and footers live."""
_WIDE_TEXT = 0.3
"""A visual is text when wide text lines cover at least this fraction of it."""


class Line(NamedTuple):
    """One text line of the page's text layer."""

    bbox: BBox
    text: str
    math: bool
    """Some span is set in a math font, or the text holds a math symbol."""
    math_font: bool
    """Some span is set in a math font."""
    math_frac: float = 0.0
    """Fraction of the line's visible characters set in a math font or that are math symbols."""


class PageInfo(NamedTuple):
    """What the rules read from the page: size, text lines, raster image boxes, vector path boxes."""

    width: float
    height: float
    lines: list[Line]
    images: list[BBox]
    paths: list[BBox]
    line_height: float


def page_info(page: pymupdf.Page, graphics: list[BBox], is_path: list[bool], text: dict | None = None) -> PageInfo:
    """Collect ``PageInfo``; ``graphics``/``is_path`` come from ``postprocess.page_elements`` (drawing log)."""
    text = text if text is not None else page.get_text("dict", flags=0)
    lines: list[Line] = []
    for block in text["blocks"]:
        for ln in block.get("lines", []):
            b = tuple(ln["bbox"])
            if not (b[2] > b[0] and b[3] > b[1]):
                continue
            spans = ln.get("spans", [])
            s = "".join(sp.get("text", "") for sp in spans)
            if not s.strip():
                continue
            mf = any(_MATH_FONT.search(sp.get("font", "")) for sp in spans if sp.get("text", "").strip())
            n_math = sum(
                1
                for sp in spans
                for c in sp.get("text", "")
                if not c.isspace() and (c in _MATH_CHARS or _MATH_FONT.search(sp.get("font", "")))
            )
            n_all = sum(1 for c in s if not c.isspace())
            math = mf or any(c in _MATH_CHARS for c in s)
            lines.append(Line(b, s, math, mf, n_math / n_all if n_all else 0.0))  # type: ignore[arg-type]
    heights = sorted(ln.bbox[3] - ln.bbox[1] for ln in lines)
    line_h = heights[len(heights) // 2] if heights else 10.0
    images = [g for g, p in zip(graphics, is_path) if not p]
    paths = [g for g, p in zip(graphics, is_path) if p]
    return PageInfo(page.rect.width, page.rect.height, lines, images, paths, line_h)


def _inside(items: list[BBox], box: BBox, frac: float = 0.5) -> list[BBox]:
    return [b for b in items if containment(b, box) >= frac]


def _labelled_caption_of(blocks: list[Block], v: Block) -> str | None:
    """The text of a labelled caption linked to ``v`` ("Figure 3: ..."), or None."""
    for c in blocks:
        if c.kind == "caption" and c.caption_of == v.reading_order and _CAPTION_LABEL.match(c.text or ""):
            return c.text
    return None


def wide_text_fraction(box: BBox, info: PageInfo) -> float:
    """Fraction of ``box`` covered by text lines inside it that span at least 40% of its width (running text;
    axis labels, legends and cell entries are narrow)."""
    a = area(box)
    if a <= 0:
        return 0.0
    width = box[2] - box[0]
    cover = sum(
        intersection(ln.bbox, box)
        for ln in info.lines
        if containment(ln.bbox, box) >= 0.5 and ln.bbox[2] - ln.bbox[0] >= 0.4 * width
    )
    return cover / a


def text_over_background(box: BBox, info: PageInfo) -> bool:
    """True when ``box`` is text set over a background: text lines cover at least 8% of it and, besides the
    graphics that fill most of it (a shaded bar, a frame, a background picture), at most two graphics are
    drawn (a heading bar, a call-out box; a chart has axes, ticks and marks)."""
    a = area(box)
    inside = [ln.bbox for ln in info.lines if containment(ln.bbox, box) >= 0.5]
    if a <= 0 or not inside or sum(area(b) for b in inside) < 0.08 * a:
        return False
    drawn = [g for g in _inside(info.images + info.paths, box) if area(g) < 0.8 * a]
    drawn = [g for g in drawn if not any(containment(g, ln) >= 0.8 for ln in inside)]  # underlines, glyph marks
    return len(drawn) <= 2


def demote_text_visuals(page: pymupdf.Page, blocks: list[Block], info: PageInfo) -> list[Block]:
    """A figure (or a one-column table) without a labelled caption that is text, not a picture, becomes a
    ``text`` block with the text under it: mostly covered by wide text lines (a framed abstract, a page the
    detector called one picture), or text over a plain background (a shaded heading bar). Drawings inside
    it that hold no text (a logo beside a title block) are kept as figures of their own."""
    import pymupdf

    from parsing.geometry import clusters

    out: list[Block] = []
    order = -4000
    for b in blocks:
        if b.kind in ("figure", "table") and _labelled_caption_of(blocks, b) is None:
            frac = wide_text_fraction(b.bbox, info)
            wide = frac >= _WIDE_TEXT and (b.kind == "figure" or frac >= 2 * _WIDE_TEXT)
            if wide or (b.kind == "figure" and text_over_background(b.bbox, info)):
                text = page.get_text("text", clip=pymupdf.Rect(b.bbox)).strip()
                out.append(dataclasses.replace(b, kind="text", text=text, html=None, latex=None))
                graphics = _inside(info.images + info.paths, b.bbox)
                a = area(b.bbox)
                for g in clusters(b.bbox, graphics, 4.0, cell=2.0) if wide else []:
                    piece = union([graphics[i] for i in g])
                    if (
                        min(piece[2] - piece[0], piece[3] - piece[1]) >= _MIN_IMAGE_SIDE
                        and area(piece) < 0.5 * a
                        and not any(containment(ln.bbox, piece) >= 0.5 for ln in info.lines)
                    ):
                        out.append(Block("figure", piece, reading_order=order))
                        order -= 1
                continue
        out.append(b)
    return out


def add_raster_figures(blocks: list[Block], info: PageInfo) -> list[Block]:
    """Raster images of at least ``_MIN_IMAGE_SIDE`` points a side that no figure/table/equation covers become
    figures (images touching each other form one figure). Page-sized images (backgrounds, scans) are not."""
    from parsing.geometry import clusters

    visual = [b.bbox for b in blocks if b.kind in ("figure", "table", "equation")]
    page_area = info.width * info.height
    cand = [
        im
        for im in info.images
        if min(im[2] - im[0], im[3] - im[1]) >= _MIN_IMAGE_SIDE
        and area(im) < 0.6 * page_area
        and not any(containment(im, v) >= 0.5 for v in visual)
        and not any(containment(ln.bbox, im) >= 0.5 for ln in info.lines)  # text over it: a background
    ]
    if not cand:
        return blocks
    out = list(blocks)
    order = -2000
    for g in clusters((0.0, 0.0, info.width, info.height), cand, 4.0, cell=2.0):
        box = union([cand[i] for i in g])
        fig = Block("figure", box, reading_order=order)
        order -= 1
        above = [i for i, b in enumerate(out) if b.bbox[3] <= box[1] + 2 and b.bbox[0] < box[2] and b.bbox[2] > box[0]]
        out.insert(above[-1] + 1 if above else 0, fig)
    return out


def is_furniture(b: Block, blocks: list[Block], info: PageInfo) -> bool:
    """A figure without a labelled caption inside the top or bottom margin band that spans half the page
    width or more (a running header's band, a rule): page furniture, not a figure. A small picture there (a
    logo, a QR code) stays a figure."""
    x0, y0, x1, y1 = b.bbox
    h = info.height
    in_band = (y1 <= _MARGIN * h or y0 >= (1 - _MARGIN) * h) and (y1 - y0) <= _MARGIN * h
    if b.kind != "figure" or not in_band or _labelled_caption_of(blocks, b) is not None:
        return False
    return (x1 - x0) >= 0.5 * info.width


def _rows(lines: list[Line]) -> list[list[Line]]:
    """``lines`` grouped into rows (lines on one baseline: vertical overlap >= 0.6), top to bottom, each row
    left to right."""
    rows: list[list[Line]] = []
    for ln in sorted(lines, key=lambda x: (x.bbox[1], x.bbox[0])):
        if rows and _vertical_overlap(rows[-1][0].bbox, ln.bbox) >= 0.6:
            rows[-1].append(ln)
        else:
            rows.append([ln])
    for r in rows:
        r.sort(key=lambda x: x.bbox[0])
    return rows


def is_prose(box: BBox, info: PageInfo) -> bool:
    """True when the text layer under ``box`` reads as words, not mathematics: no math font, no math symbol,
    and words make most of the characters (dot leaders aside), with at least three words (a running header,
    a table-of-contents line, a sentence) or, on one row, one word of four letters or more that is no
    operator name (a section heading: "1 Topologische Grundbegriffe 2", "Bildquellen 105"). Publishers'
    fonts with private encodings ("5" for "=") fail the words test: their symbols and one-letter variables
    are not words."""
    lines = [ln for ln in info.lines if containment(ln.bbox, box) >= 0.5]
    if not lines:
        return False  # no text layer here (a picture of an equation): the detector decides
    if any(ln.math for ln in lines):
        return False
    text = _LEADER.sub(" ", " ".join(ln.text for ln in lines))
    words = _WORD.findall(text)
    chars = sum(1 for c in text if not c.isspace())
    heading = len(_rows(lines)) == 1 and any(len(w) >= 4 and w.lower() not in _OPERATOR_NAMES for w in words)
    return (len(words) >= 3 or heading) and sum(len(w) for w in words) >= 0.6 * chars


def demote_prose_equations(blocks: list[Block], info: PageInfo) -> list[Block]:
    """Equation boxes over plain prose become text blocks (see ``is_prose``)."""
    out = []
    for b in blocks:
        if b.kind == "equation" and is_prose(b.bbox, info):
            text = "\n".join(ln.text for ln in info.lines if containment(ln.bbox, b.bbox) >= 0.5)
            b = dataclasses.replace(b, kind="text", text=text, latex=None)
        out.append(b)
    return out


def merge_equation_lines(blocks: list[Block], info: PageInfo) -> list[Block]:
    """Equation boxes one under the other (vertical gap under one line height, overlapping columns) or side by
    side on one row, with no other block between them, are one display equation: one box per line group."""
    eqs = sorted((b for b in blocks if b.kind == "equation"), key=lambda b: b.bbox[1])
    if len(eqs) < 2:
        return blocks
    others = [b.bbox for b in blocks if b.kind != "equation" and b.kind not in ("header", "footer", "page_number")]
    gap_max = 1.0 * info.line_height
    groups: list[list[Block]] = []
    for e in eqs:
        g = groups[-1] if groups else None
        if g is not None:
            last = union([x.bbox for x in g])
            between = (min(last[0], e.bbox[0]), last[3], max(last[2], e.bbox[2]), e.bbox[1])
            same_row = _vertical_overlap(last, e.bbox) >= 0.5 and _h_gap(last, e.bbox) <= 2 * info.line_height
            if same_row:  # the horizontal gap between them
                lo, hi = sorted((last, e.bbox), key=lambda x: x[0])
                between = (lo[2], max(lo[1], hi[1]), hi[0], min(lo[3], hi[3]))
            below = e.bbox[1] - last[3] <= gap_max and horizontal_overlap(last, e.bbox) >= 0.3
            if (same_row or below) and not any(intersection(o, between) > 0 for o in others):
                g.append(e)
                continue
        groups.append([e])
    if all(len(g) == 1 for g in groups):
        return blocks
    replace: dict[int, Block | None] = {}
    for g in groups:
        if len(g) < 2:
            continue
        latex = "\\\\\n".join(x.latex for x in g if x.latex) or None
        merged = dataclasses.replace(g[0], bbox=union([x.bbox for x in g]), latex=latex, text="")
        replace[id(g[0])] = merged
        for x in g[1:]:
            replace[id(x)] = None
    out = []
    for b in blocks:
        if id(b) in replace:
            if replace[id(b)] is not None:
                out.append(replace[id(b)])
        else:
            out.append(b)
    return out


def promote_display_math(blocks: list[Block], info: PageInfo) -> list[Block]:
    """A text block of one to three lines that is mathematics set on its own (at least 40% of its characters in
    a math font or math symbols, one of them in a math font) and indented from its column on both sides by
    two line heights or more, about centred, is a display equation the detector read as text. Fragments (an
    underbrace's label, a letter inside a drawing) are not: at least five characters, three line heights wide,
    touching no figure, table or equation."""
    out = []
    lh = info.line_height
    visual = [v.bbox for v in blocks if v.kind in ("figure", "table", "equation")]
    absorbed: list[BBox] = []
    for b in blocks:
        if b.kind in ("text", "other"):
            lines = [ln for ln in info.lines if containment(ln.bbox, b.bbox) >= 0.5]
            chars = sum(len(ln.text.strip()) for ln in lines)
            frac = sum(ln.math_frac * len(ln.text.strip()) for ln in lines) / chars if chars else 0.0
            box = union([ln.bbox for ln in lines]) if lines else b.bbox
            if (
                1 <= len(lines) <= 3
                and frac >= 0.4
                and chars >= 5
                and box[2] - box[0] >= 3 * lh
                and any(ln.math_font for ln in lines)
                and not any(intersection(box, v) > 0 for v in visual)  # a label in a figure, under a formula
            ):
                # the column: text lines within eight line heights above/below that overlap this one in x
                col = [
                    ln.bbox
                    for ln in info.lines
                    if ln not in lines
                    and abs(ln.bbox[1] - box[1]) < 8 * lh
                    and ln.bbox[2] > box[0]
                    and ln.bbox[0] < box[2]
                    and ln.bbox[2] - ln.bbox[0] > 0.5 * info.width * 0.5
                ]
                if col:
                    c0, c1 = min(x[0] for x in col), max(x[2] for x in col)
                    left, right = box[0] - c0, c1 - box[2]
                    if left >= 2 * lh and right >= 2 * lh and abs(left - right) <= 0.25 * (c1 - c0):
                        box = _grow_math(box, info)
                        b = dataclasses.replace(b, kind="equation", bbox=box)
                        absorbed.append(box)
        out.append(b)
    # fragments of the display now inside its box (a big operator's glyph, its limits) are no text of their own
    return [
        b for b in out if not (b.kind in ("text", "other") and any(containment(b.bbox, a) >= 0.9 for a in absorbed))
    ]


def _grow_math(box: BBox, info: PageInfo) -> BBox:
    """``box`` grown over math lines touching it (within 0.6 line heights): an operator set as its own line,
    its limits above and below."""
    from parsing.geometry import box_gap

    grown = True
    while grown:
        grown = False
        for ln in info.lines:
            if (
                ln.math_frac >= 0.5
                and containment(ln.bbox, box) < 0.5
                and box_gap(ln.bbox, box) <= 0.6 * info.line_height
            ):
                box = union([box, ln.bbox])
                grown = True
    return box


def _vertical_overlap(a: BBox, b: BBox) -> float:
    """Shared height over the smaller height."""
    inter = min(a[3], b[3]) - max(a[1], b[1])
    return max(0.0, inter) / max(1e-6, min(a[3] - a[1], b[3] - b[1]))


def _h_gap(a: BBox, b: BBox) -> float:
    return max(0.0, max(a[0], b[0]) - min(a[2], b[2]))


def add_numbered_equations(blocks: list[Block], info: PageInfo) -> list[Block]:
    """Display equations the detector missed, from the text layer: a line set (partly) in a math font whose
    last span is a right-aligned equation number "(n)", with the math lines directly above it that are
    indented on both sides (one line group = one box). Lines already inside a figure/table/equation or
    inside a multi-line paragraph block are left alone; a one-line text block that is the equation is
    replaced."""
    covered = [b.bbox for b in blocks if b.kind in ("figure", "table", "equation", "header", "footer")]
    numbers = [ln for ln in info.lines if _EQ_NUMBER.match(ln.text.strip())]
    if not numbers:
        return blocks
    out = list(blocks)
    order = -3000
    for num in numbers:
        if any(containment(num.bbox, c) >= 0.5 for c in covered):
            continue
        cy = (num.bbox[1] + num.bbox[3]) / 2
        # the math on the number's line, to its left
        row = [
            ln
            for ln in info.lines
            if ln is not num
            and ln.bbox[2] <= num.bbox[0] + 1
            and ln.bbox[1] - 2 <= cy <= ln.bbox[3] + 2
            and num.bbox[0] - ln.bbox[2] < 0.5 * info.width
        ]
        if not row or not any(ln.math_font for ln in row):
            continue
        box = union([ln.bbox for ln in row])
        left = box[0]
        # the column's left edge: the leftmost text start near the equation
        near = [ln.bbox[0] for ln in info.lines if abs(ln.bbox[1] - box[1]) < 6 * info.line_height]
        col_left = min(near) if near else left
        if left - col_left < 2 * info.line_height:
            continue  # starts at the margin: an inline number in running text, not a display
        # math lines directly above, indented the same way (multi-line displays)
        grown = True
        while grown:
            grown = False
            for ln in info.lines:
                if ln in row or not ln.math_font:
                    continue
                if 0 <= box[1] - ln.bbox[3] <= 0.8 * info.line_height and ln.bbox[0] - col_left >= 2 * info.line_height:
                    if horizontal_overlap(ln.bbox, box) >= 0.3:
                        row.append(ln)
                        box = union([box, ln.bbox])
                        grown = True
        eq_box = union([box, num.bbox])
        hosts = [b for b in out if b.kind not in ("figure", "table", "equation") and intersection(b.bbox, eq_box) > 0]
        if any(area(h.bbox) > 2.5 * area(eq_box) for h in hosts):
            continue  # inside a paragraph block: splitting running text is not this rule's call
        out = [b for b in out if not any(b is h for h in hosts)]
        eq = Block("equation", eq_box, reading_order=order)
        order -= 1
        above = [i for i, b in enumerate(out) if b.bbox[3] <= eq_box[1] + 2]
        out.insert(above[-1] + 1 if above else 0, eq)
        covered.append(eq_box)
    return out


def _only_cells_between(p: BBox, box: BBox, info: PageInfo) -> bool:
    """Between path ``p`` and table ``box`` lie only narrow text lines inside the table's column (one row of
    cells), not a caption or a paragraph line spanning most of it."""
    band = (box[0], min(p[3], box[3]), box[2], max(p[1], box[1]))
    if band[3] <= band[1]:
        return True
    tol = 0.02 * (box[2] - box[0])
    lines = [ln.bbox for ln in info.lines if intersection(ln.bbox, band) > 0]
    return all(
        ln[0] >= box[0] - tol and ln[2] <= box[2] + tol and ln[2] - ln[0] < 0.6 * (box[2] - box[0]) for ln in lines
    )


def grow_tables(blocks: list[Block], info: PageInfo) -> list[Block]:
    """A table box grows over vector paths (cell fills, rules) just above or below it within its column, with
    at most one row of cell text (narrow lines, none spanning most of the table) between: detectors often
    stop a table under its shaded head row. The cells' text lines come along."""
    out = []
    for b in blocks:
        if b.kind == "table":
            box = b.bbox
            for _ in range(4):
                tol = 0.02 * (box[2] - box[0])
                reach = 2.0 * info.line_height

                add = [
                    p
                    for p in info.paths
                    if p[0] >= box[0] - tol
                    and p[2] <= box[2] + tol
                    and containment(p, box) < 0.9
                    and (-1.0 <= box[1] - p[3] <= reach or -1.0 <= p[1] - box[3] <= reach)
                    and (p[3] - p[1]) < 0.5 * (box[3] - box[1])
                    and _only_cells_between(p, box, info)
                ]
                if not add:
                    break
                new = union([box, *add])
                new = union([new] + [ln.bbox for ln in info.lines if containment(ln.bbox, new) >= 0.5])
                if new == box:
                    break
                box = new
            if box != b.bbox:
                b = dataclasses.replace(b, bbox=box)
        out.append(b)
    # a text block the grown table now cuts (a caption run together with the head row) keeps its outside part
    tables = [b.bbox for b in out if b.kind == "table"]
    for i, b in enumerate(out):
        if b.kind not in _TEXT_KINDS:
            continue
        for t in tables:
            inter = intersection(b.bbox, t)
            if inter == 0 or inter >= 0.9 * area(b.bbox) or inter < 0.2 * area(b.bbox):
                continue
            x0, y0, x1, y1 = b.bbox
            if y0 < t[1] < y1 <= t[3] + 1:
                out[i] = b = dataclasses.replace(b, bbox=(x0, y0, x1, t[1]))
            elif t[1] - 1 <= y0 < t[3] < y1:
                out[i] = b = dataclasses.replace(b, bbox=(x0, t[3], x1, y1))
    return out


def cell_rows(box: BBox, info: PageInfo) -> int:
    """Rows of the text inside ``box`` that hold two or more cells: lines on one baseline separated by at least
    0.6 line heights of white space (a table row; running text and formulas are one line per row)."""
    inside = sorted((ln.bbox for ln in info.lines if containment(ln.bbox, box) >= 0.5), key=lambda b: (b[1], b[0]))
    rows: list[list[BBox]] = []
    for ln in inside:
        if rows and _vertical_overlap(rows[-1][0], ln) >= 0.6:
            rows[-1].append(ln)
        else:
            rows.append([ln])
    n = 0
    for r in rows:
        r.sort(key=lambda b: b[0])
        if any(b2[0] - b1[2] >= 0.6 * info.line_height for b1, b2 in zip(r, r[1:])):
            n += 1
    return n


def is_drawing(box: BBox, info: PageInfo) -> bool:
    """A "table" that is a drawing: at most four text lines (labels), at most one row of them, and shapes that
    are not rules (fills, curves, marks at least 2 pt thick both ways)."""
    inside = [ln for ln in info.lines if containment(ln.bbox, box) >= 0.5]
    shapes = [p for p in _inside(info.paths, box) if min(p[2] - p[0], p[3] - p[1]) >= 2.0]
    return len(inside) <= 4 and len(shapes) >= 3 and cell_rows(box, info) < 2


def is_framed_text(box: BBox, info: PageInfo) -> bool:
    """A "table" that is text in a frame (a theorem or definition box): fewer than three rows of separated
    cells, and either no rule or cell fill inside the frame (paths off its border) or running text (wide
    lines) over 15% of it (stacked theorem and proof frames have rules between them)."""
    inner = (box[0] + 4, box[1] + 4, box[2] - 4, box[3] - 4)
    a = area(box)
    ruled = any(containment(p, inner) >= 0.5 and area(p) < 0.8 * a for p in info.paths)  # not the frame itself
    return cell_rows(box, info) < 3 and (not ruled or wide_text_fraction(box, info) >= 0.15)


def is_contents(box: BBox, info: PageInfo) -> bool:
    """A "table" that is a table of contents (or an index): three rows or more, most of them (60%) words
    ending in a page number at the box's right edge, and dot leaders in two rows or more (a fifth of them).
    A table's rows hold several cells of numbers; a contents row holds one title and one page number."""
    rows = _rows([ln for ln in info.lines if containment(ln.bbox, box) >= 0.5])
    if len(rows) < 3:
        return False
    entries = leaders = 0
    for r in rows:
        text = " ".join(ln.text for ln in r)
        leaders += bool(_LEADER.search(text))
        tokens = _LEADER.sub(" ", text).split()
        if (
            len(tokens) >= 2
            and _PAGE_NUMBER.match(tokens[-1])
            and _WORD.search(" ".join(tokens[:-1]))
            and r[-1].bbox[2] >= box[2] - 3 * info.line_height
        ):
            entries += 1
    return entries >= max(3, 0.6 * len(rows)) and leaders >= max(2, 0.2 * len(rows))


def holds_prose(box: BBox, info: PageInfo) -> bool:
    """A "table" that holds running text (a theorem or proposition set apart, with a formula or a matrix
    whose entries look like cells): three lines or more of five words or more, each spanning half the box,
    making at least a quarter of its rows. A table's cells wrap inside their column; a sentence runs across."""
    inside = [ln for ln in info.lines if containment(ln.bbox, box) >= 0.5]
    width = box[2] - box[0]
    prose = [ln for ln in inside if len(_WORD.findall(ln.text)) >= 5 and ln.bbox[2] - ln.bbox[0] >= 0.5 * width]
    return len(prose) >= 3 and len(prose) >= 0.25 * len(_rows(inside))


def fix_visual_kinds(blocks: list[Block], info: PageInfo) -> list[Block]:
    """Table vs figure from the caption label and the content: a visual captioned "Figure n" is a figure; one
    captioned "Table n" that holds a grid of text lines (three rows or more) is a table; a "table" with no
    text inside is a picture, and so is one whose text holds no letter or digit (marks in a diagram); a
    "table" without a "Table n" caption that is a drawing is a figure, and one that is framed text, holds
    running text or is a table of contents is text."""
    out = []
    for b in blocks:
        if b.kind in ("figure", "table"):
            cap = _labelled_caption_of(blocks, b) or ""
            inside = [ln for ln in info.lines if containment(ln.bbox, b.bbox) >= 0.5]
            rows = len({round(ln.bbox[1] / max(info.line_height, 1.0)) for ln in inside})
            if b.kind == "table" and _FIGURE_LABEL.match(cap):
                b = dataclasses.replace(b, kind="figure", html=None)
            elif b.kind == "table" and not inside and _inside(info.images, b.bbox):
                b = dataclasses.replace(b, kind="figure", html=None)
            elif b.kind == "figure" and _TABLE_LABEL.match(cap) and rows >= 3 and not _inside(info.images, b.bbox):
                b = dataclasses.replace(b, kind="table")
            elif b.kind == "table" and not _TABLE_LABEL.match(cap) and is_drawing(b.bbox, info):
                b = dataclasses.replace(b, kind="figure", html=None)
            elif b.kind == "table" and inside and not any(c.isalnum() for ln in inside for c in ln.text):
                b = dataclasses.replace(b, kind="figure", html=None)
            elif (
                b.kind == "table"
                and not _TABLE_LABEL.match(cap)
                and (is_framed_text(b.bbox, info) or holds_prose(b.bbox, info) or is_contents(b.bbox, info))
            ):
                b = dataclasses.replace(b, kind="text", text="\n".join(ln.text for ln in inside), html=None)
        out.append(b)
    return out


def split_scan_equations(
    regions: list[tuple[str, BBox, float]], lines: list[tuple[BBox, str]], page_width: float
) -> list[tuple[str, BBox, float]]:
    """Scan path: an equation region the layout model drew across running text is cut at its prose lines.

    A prose line starts at the body text's left edge (or left of it), spans half the region or more and has
    three or more words of three letters or more ("By Exercise 5.17, ... Then, for all v ..."). The math lines
    between prose lines become one equation region each; a region with only prose lines becomes text.
    ``regions``: (kind, bbox, score); ``lines``: OCR or text-layer lines (bbox, text).
    """
    body = [b[0] for b, _ in lines if b[2] - b[0] >= 0.3 * page_width]
    if not body:
        return regions
    bins: dict[int, int] = {}
    for x in body:
        k = int(x / (0.01 * page_width))
        bins[k] = bins.get(k, 0) + 1
    margin = (max(bins, key=lambda k: bins[k]) + 1) * 0.01 * page_width  # the body lines' left edge
    out: list[tuple[str, BBox, float]] = []
    for kind, rb, score in regions:
        inside = sorted(((b, t) for b, t in lines if containment(b, rb) >= 0.5), key=lambda x: x[0][1])
        if kind != "equation" or not inside:
            out.append((kind, rb, score))
            continue

        def prose(b: BBox, t: str, rb: BBox = rb) -> bool:
            words = [w for w in _WORD.findall(t) if len(w) >= 3]
            return b[0] <= margin + 0.01 * page_width and b[2] - b[0] >= 0.5 * (rb[2] - rb[0]) and len(words) >= 3

        flags = [prose(b, t) for b, t in inside]
        if not any(flags):
            out.append((kind, rb, score))
            continue
        group: list[BBox] = []
        for (b, _), is_prose_line in zip(inside, flags):
            if is_prose_line:
                if group:
                    out.append(("equation", union(group), score))
                group = []
                out.append(("text", b, score))
            else:
                group.append(b)
        if group:
            out.append(("equation", union(group), score))
    return out
