"""Backend-independent clean-up of a page's blocks before cropping: where box quality is fixed.

Looking at both backends on real papers (benchmarks/results/parsing.md), the systematic problems were:
- figure boxes with margins of white space or a line of the neighbouring paragraph -> each figure/table/
  equation box is shrunk to the content drawn inside it (images, vector paths, text lines that belong to
  no neighbouring text block);
- two figures in one box (PyMuPDF's model joined figures of both columns) -> a figure box whose content
  falls into well-separated clusters is split;
- one figure split into panels (PyMuPDF's model boxes each sub-figure) -> adjacent figures that no running
  text or labelled caption separates are merged, with the unlabelled sub-captions ("(a) ...") between them;
- text blocks inside a table or figure (MinerU's flash tier boxes table cells as text/titles) -> dropped:
  their text lives in the table's html/text and in the crop;
- display equations boxed with their "(n)" number, and twice (a detector's box with the number beside the rules'
  without), where every reference convention boxes the equation alone -> ``drop_equation_numbers``.
Pure decisions are in ``parsing.geometry``; this module reads the PDF's drawing log and text layer.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from formats.records import CROPPED_KINDS, Block
from parsing import layout_rules as rules
from parsing.geometry import (
    BBox,
    any_contained,
    any_containing,
    area,
    box_gap,
    clusters,
    containment,
    group_adjacent,
    horizontal_overlap,
    intersection,
    iou,
    link_captions,
    tighten,
    union,
    vertical_gap,
)

if TYPE_CHECKING:
    import numpy as np
    import pymupdf

# Boxes smaller than this (points², ≈ 2×2 pt) are detector noise.
_MIN_AREA = 4.0
_TEXTUAL = frozenset({"text", "title", "list", "other", "code"})
# A real caption starts with its label; an unlabelled "caption" beside panels is a sub-caption.
# No trailing \b: PDFs without space glyphs give "Figure1.1:Bears".
_CAPTION_LABEL = re.compile(
    r"^\s*(figure|fig\.|fig\s|table|tab\.|scheme|chart|plate|exhibit|algorithm|abbildung|abb\.|tabelle)", re.I
)
# Empty space (fraction of the page's longer side) that separates two figures inside one detected box.
_SPLIT_GAP = 0.02
# A cluster smaller than this fraction of the box is a stray mark, not a figure of its own.
_MIN_PIECE = 0.05


def page_elements(page: pymupdf.Page, text: dict | None = None) -> tuple[list[BBox], list[BBox], list[bool]]:
    """What is drawn on the page: (image and vector-path boxes from the drawing log, text-line boxes,
    per graphic whether it is a vector path). ``text``: the page's ``get_text("dict", flags=0)`` when the
    caller has it."""
    graphics: list[BBox] = []
    paths: list[bool] = []
    for kind, rect in page.get_bboxlog():
        if (
            kind in ("fill-image", "fill-imgmask", "fill-shade", "fill-path", "stroke-path")
            and rect[2] > rect[0]
            and rect[3] > rect[1]
        ):
            graphics.append(tuple(rect))  # type: ignore[arg-type]
            paths.append(kind.endswith("-path"))
    lines: list[BBox] = []
    if text is None:
        text = page.get_text("dict", flags=0)
    for block in text["blocks"]:
        for line in block.get("lines", []):
            b = tuple(line["bbox"])
            if b[2] > b[0] and b[3] > b[1]:
                lines.append(b)  # type: ignore[arg-type]
    return graphics, lines, paths


def continues_block(line: BBox, block: BBox, line_height: float) -> bool:
    """A text line left-aligned with a text block and just below it is that block's last line (layout models
    often stop a paragraph box one line short, and the next figure box then swallows the line)."""
    return abs(line[0] - block[0]) <= 3.0 and line[2] <= block[2] + 3.0 and 0 <= line[1] - block[3] <= 1.5 * line_height


def _gray(
    page: pymupdf.Page, rect: pymupdf.Rect, zoom: float, dl: pymupdf.DisplayList | None
) -> tuple[np.ndarray, float, float]:
    """``rect`` of the page rendered in grey at ``zoom`` pixels a point (``dl``: the page's display list, when the
    caller has one), and the page coordinates of its pixel (0, 0): the integer-aligned top-left of the clip."""
    import numpy as np
    import pymupdf

    if dl is None:
        dl = page.get_displaylist()  # what page.get_pixmap does
    pix = dl.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom), clip=rect, colorspace=pymupdf.csGRAY, alpha=False)
    img = np.frombuffer(pix.samples, dtype=np.uint8).reshape(pix.height, pix.stride)[:, : pix.width]
    return img, pix.x / zoom, pix.y / zoom


def ink_bbox(
    page: pymupdf.Page, box: BBox, dpi: int = 50, threshold: int = 240, dl: pymupdf.DisplayList | None = None
) -> BBox:
    """Shrink ``box`` to the pixels that are not (near-)white when rendered: trims white margins that are part
    of an embedded image or a white background rectangle. Removing only blank rows and columns can never cut
    content; one pixel of slack is kept. ``dl``: the page's display list, when the caller renders it often."""
    import numpy as np
    import pymupdf

    rect = pymupdf.Rect(box) & page.rect
    if rect.is_empty:
        return box
    zoom = dpi / 72.0
    img, ox, oy = _gray(page, rect, zoom, dl)
    ink = img < threshold
    rows = np.flatnonzero(ink.any(axis=1))
    cols = np.flatnonzero(ink.any(axis=0))
    if rows.size == 0 or cols.size == 0:
        return box
    x0 = max(rect.x0, ox + (cols[0] - 1) / zoom)
    y0 = max(rect.y0, oy + (rows[0] - 1) / zoom)
    x1 = min(rect.x1, ox + (cols[-1] + 2) / zoom)
    y1 = min(rect.y1, oy + (rows[-1] + 2) / zoom)
    return (x0, y0, x1, y1) if x1 > x0 and y1 > y0 else box


def _grow(box: BBox, dy: float) -> BBox:
    return (box[0], box[1] - dy, box[2], box[3] + dy)


def _containment_many(elements: np.ndarray, outer: BBox) -> np.ndarray:
    """``containment(e, outer)`` for every row of an (n, 4) array of boxes."""
    import numpy as np

    iw = np.clip(np.minimum(elements[:, 2], outer[2]) - np.maximum(elements[:, 0], outer[0]), 0, None)
    ih = np.clip(np.minimum(elements[:, 3], outer[3]) - np.maximum(elements[:, 1], outer[1]), 0, None)
    a = (elements[:, 2] - elements[:, 0]) * (elements[:, 3] - elements[:, 1])
    return np.divide(iw * ih, a, out=np.zeros_like(a), where=a > 0)


def _content(box: BBox, elements: np.ndarray, exclude: list[BBox]) -> list[int]:
    """Indices of elements drawn inside ``box`` (clipped to it) that belong to no excluded (text) block."""
    import numpy as np

    if len(elements) == 0:
        return []
    areas = (elements[:, 2] - elements[:, 0]) * (elements[:, 3] - elements[:, 1])
    mask = (areas <= 2.0 * area(box)) & (_containment_many(elements, box) >= 0.5)
    for x in exclude:
        if not mask.any():
            break
        mask &= _containment_many(elements, x) <= 0.5
    return [int(i) for i in np.flatnonzero(mask)]


def split_figure(box: BBox, content: list[BBox], graphic: list[bool], gap: float) -> list[BBox]:
    """The figure's content as one box per well-separated cluster of graphics.

    ``graphic[i]`` tells whether ``content[i]`` is an image or a path (not a text line or a hairline rule).
    Clusters without graphics are text the detector's box reached (a running header, the end of a
    paragraph): dropped when the figure has graphics. Small graphic clusters join the nearest big one.
    """
    groups = clusters(box, content, gap)
    has_graphic = [any(graphic[i] for i in g) for g in groups]
    if not any(has_graphic):
        return [union(content)] if content else [box]
    kept = [
        _grow_with_labels(
            [content[i] for i in g if graphic[i]],
            [content[i] for i in g if not graphic[i]],
            0.4 * gap,
            label_reach=1.2 * gap,
            label_width=0.25 * (box[2] - box[0]),
        )
        for g, has in zip(groups, has_graphic)
        if has
    ]
    big = [c for c in kept if area(c) >= _MIN_PIECE * area(box)]
    if not big:
        return [union(kept)]
    pieces = list(big)
    for c in kept:
        if c in big:
            continue
        centre = ((c[0] + c[2]) / 2, (c[1] + c[3]) / 2)
        j = min(range(len(pieces)), key=lambda i: _dist(centre, pieces[i]))
        pieces[j] = union([pieces[j], c])
    return pieces


def _grow_with_labels(
    graphics: list[BBox], texts: list[BBox], reach: float, label_reach: float | None = None, label_width: float = 0.0
) -> BBox:
    """Union of the graphics plus the text lines chained to them within ``reach`` points (tick labels, axis
    titles, legends); text further away is a neighbouring header or paragraph line. Short lines (narrower than
    ``label_width`` and than four times their height: an axis title set apart, "MSE" rotated left of the tick
    labels, a "λ" under the axis; not a heading word) chain within ``label_reach``."""
    box = union(graphics)
    todo = list(texts)
    changed = True
    while changed and todo:
        changed = False
        for t in list(todo):
            w, h = t[2] - t[0], t[3] - t[1]
            r = label_reach if label_reach is not None and w < label_width and w < 4 * h else reach
            if box_gap(t, box) <= r:
                box = union([box, t])
                todo.remove(t)
                changed = True
    return box


def _dist(p: tuple[float, float], b: BBox) -> float:
    dx = max(b[0] - p[0], 0.0, p[0] - b[2])
    dy = max(b[1] - p[1], 0.0, p[1] - b[3])
    return (dx * dx + dy * dy) ** 0.5


class _Replaced(dict):
    """id(old block) -> the block(s) that replace it. Keeps the old blocks alive: ids of garbage-collected
    objects are reused, which would silently redirect caption links."""

    def __init__(self) -> None:
        super().__init__()
        self.alive: list[Block] = []

    def put(self, old: Block, new: list[Block]) -> None:
        self[id(old)] = new
        self.alive.append(old)


TEXT_LAYER_MATH = "text-layer-math"
"""``Block.text_from`` of an equation whose text is the text layer's glyphs (no offline formula-to-LaTeX model
with licensed weights exists on PyPI; the crop stays the equation's picture)."""


def refine_blocks(page: pymupdf.Page, blocks: list[Block], dl: pymupdf.DisplayList | None = None) -> list[Block]:
    """Fix the systematic box problems listed in the module docstring.

    Returns blocks in reading order with ``reading_order`` = position and caption links preserved (a caption
    of a figure that was split or merged is re-linked by geometry / to the merged figure). ``dl``: the page's
    display list, reused for every render (built here when not given).
    """
    import numpy as np
    import pymupdf

    w, h = page.rect.width, page.rect.height
    blocks = [b for b in blocks if area(b.bbox) >= _MIN_AREA]
    text = page.get_text("dict", flags=0)
    graphics, lines, paths = page_elements(page, text)
    info = rules.page_info(page, graphics, paths, text)
    heights = sorted(ln[3] - ln[1] for ln in lines)
    line_h = heights[len(heights) // 2] if heights else 10.0
    blocks = rules.fix_visual_kinds(blocks, info)
    blocks = rules.demote_text_visuals(page, blocks, info)
    blocks = rules.demote_prose_equations(blocks, info)
    blocks = rules.add_raster_figures(blocks, info)
    blocks = add_captioned_frames(blocks, graphics, paths, w, h)
    blocks = add_vector_figures(blocks, graphics, paths, lines, line_h, w, h)
    blocks = rules.grow_tables(blocks, info)
    blocks = rules.add_numbered_equations(blocks, info)
    blocks = rules.promote_display_math(blocks, info)
    blocks = rules.merge_equation_lines(blocks, info)
    by_order = {b.reading_order: b for b in blocks}
    # Links as object references while blocks are replaced, split and merged.
    link: dict[int, Block | None] = {id(b): by_order.get(b.caption_of) for b in blocks if b.caption_of is not None}
    replaced = _Replaced()  # id(old visual) -> its new block(s)
    text_boxes = [_grow(b.bbox, 2.0) for b in blocks if b.kind not in CROPPED_KINDS]
    # Lines that continue a paragraph are the paragraph's, wherever a figure box reaches.
    lines = [ln for ln, cont in zip(lines, _continues_any(lines, text_boxes, line_h)) if not cont]
    elements = graphics + lines
    element_arr = np.asarray(elements, dtype=float).reshape(-1, 4)
    # hairlines (rules, separators) are drawn but do not make a region a picture on their own
    is_graphic = [min(e[2] - e[0], e[3] - e[1]) >= 2.0 for e in graphics] + [False] * len(lines)

    work: list[Block] = []
    for b in blocks:
        if b.kind not in CROPPED_KINDS:
            work.append(b)
            continue
        exclude = [t for t in text_boxes if containment(t, b.bbox) < 0.9]
        idx = _content(b.bbox, element_arr, exclude)
        content = [elements[i] for i in idx]
        if b.kind == "figure" and content:
            graphic = [is_graphic[i] for i in idx]
            bx = b.bbox
            boxes = [
                (max(p[0], bx[0]), max(p[1], bx[1]), min(p[2], bx[2]), min(p[3], bx[3]))
                for p in split_figure(bx, content, graphic, _SPLIT_GAP * max(w, h))
            ]
        else:
            boxes = [tighten(b.bbox, content, ())]
        if dl is None:
            dl = page.get_displaylist()
        new = [dataclasses.replace(b, bbox=ink_bbox(page, x, dl=dl)) for x in boxes]
        replaced.put(b, new)
        work.extend(new)

    # sub-captions under single panels first (so they do not keep panels apart), then under merged figures
    work = _absorb_subcaptions(work, replaced, line_h)
    work = _merge_panels(work, link, replaced, w, h, line_h)
    work = _absorb_subcaptions(work, replaced, line_h)
    _promote_captions(work, link, h)
    visual = [b for b in work if b.kind in CROPPED_KINDS]
    out: list[Block] = []
    for b in work:
        if b.kind in _TEXTUAL and any(containment(b.bbox, v.bbox) >= 0.9 for v in visual):
            continue  # a table cell or figure label boxed as text: already in the crop/table text
        if b.kind in ("equation", "table") and not b.text.strip():
            text = page.get_text("text", clip=pymupdf.Rect(b.bbox)).strip()
            if text:
                math = TEXT_LAYER_MATH if b.kind == "equation" else None
                old, b = b, dataclasses.replace(b, text=text, text_from=math)
                replaced.put(old, [b])
        out.append(b)
    out = [b for b in out if not rules.is_furniture(b, out, info)]
    return _renumber(out, link, replaced, h)


def vet_proposals(page: pymupdf.Page, proposals: Sequence[tuple[str, Block]]) -> list[tuple[str, Block]]:
    """Other detectors' (source, block) proposals read against the page's text layer by the same rules as the
    backend's blocks (``layout_rules.fix_visual_kinds``, ``demote_prose_equations``), before they vote: a
    detector's "equation" over a heading or a contents line, or its "table" over a theorem or a table of
    contents, is text and proposes nothing. On a page without a text layer (a scan) the rules that read text
    leave the proposals as they are."""
    if not any(b.kind in ("table", "equation", "figure") for _, b in proposals):
        return list(proposals)
    text = page.get_text("dict", flags=0)
    if not any(block.get("lines") for block in text["blocks"]):
        return list(proposals)
    graphics, _, paths = page_elements(page, text)
    info = rules.page_info(page, graphics, paths, text)
    out = []
    for src, b in proposals:
        (v,) = rules.demote_prose_equations(rules.fix_visual_kinds([b], info), info)
        out.append((src, v))
    return out


def _continues_any(lines: list[BBox], blocks: list[BBox], line_height: float) -> list[bool]:
    """``any(continues_block(ln, b, line_height) for b in blocks)`` for every line, vectorised."""
    import numpy as np

    if not lines or not blocks:
        return [False] * len(lines)
    ln = np.asarray(lines, dtype=float)[:, None, :]
    b = np.asarray(blocks, dtype=float)[None, :, :]
    below = ln[..., 1] - b[..., 3]
    hit = (
        (np.abs(ln[..., 0] - b[..., 0]) <= 3.0)
        & (ln[..., 2] <= b[..., 2] + 3.0)
        & (below >= 0)
        & (below <= 1.5 * line_height)
    )
    return hit.any(axis=1).tolist()


def add_vector_figures(
    blocks: list[Block], graphics: list[BBox], paths: list[bool], lines: list[BBox], line_h: float, w: float, h: float
) -> list[Block]:
    """Add figures for vector drawings that no block covers, or extend the figure they touch.

    MinerU's flash tier misses thin-line diagrams (sketches in maths papers: axes, points, graphs). A cluster
    of vector paths qualifies when it has at least one non-hairline path (a curve, diagonal, dot, filled
    shape: ruled tables are hairlines only), is at least 24 pt on both sides, and no path of it lies inside a
    text block (fraction bars, underlines) or encloses one (frames and shaded boxes around theorems).
    """
    visual = [b for b in blocks if b.kind in CROPPED_KINDS]
    textual = [b.bbox for b in blocks if b.kind not in CROPPED_KINDS]
    # running text (multi-line or wide), as opposed to one-word labels inside a drawing
    paragraphs = [t for t in textual if t[3] - t[1] > 1.8 * line_h or t[2] - t[0] > 0.25 * w]
    drawn = [g for g, is_path in zip(graphics, paths) if is_path and area(g) < 0.5 * w * h]
    in_visual = any_contained(drawn, [v.bbox for v in visual], 0.5)
    in_text = any_contained(drawn, [_grow(t, 1.0) for t in textual], 0.5)
    frames_text = any_containing(paragraphs, drawn, 0.8)
    cand = [g for g, a, b, c in zip(drawn, in_visual, in_text, frames_text) if not (a or b or c)]
    if not cand:
        return blocks
    gap = _SPLIT_GAP * max(w, h)
    labels = [ln for ln, inside in zip(lines, any_contained(lines, paragraphs, 0.5)) if not inside]
    out = list(blocks)
    new_order = -1
    for g in clusters((0.0, 0.0, w, h), cand, gap):
        members = [cand[i] for i in g]
        if all(min(m[2] - m[0], m[3] - m[1]) < 2.0 for m in members):
            continue  # only hairlines: a ruled table or page rules
        box = _grow_with_labels(members, labels, 0.4 * gap)
        if min(box[2] - box[0], box[3] - box[1]) < 24.0:
            continue
        near = [v for v in out if v.kind == "figure" and box_gap(v.bbox, box) <= gap]
        if near:  # the detector found part of this figure: extend it
            v = near[0]
            out[out.index(v)] = dataclasses.replace(v, bbox=union([v.bbox, box]))
            continue
        fig = Block("figure", box, reading_order=new_order)
        new_order -= 1
        above = [i for i, b in enumerate(out) if b.bbox[3] <= box[1] + 2 and b.bbox[0] < box[2] and b.bbox[2] > box[0]]
        out.insert(above[-1] + 1 if above else 0, fig)
    return out


_SUBCAPTION = re.compile(r"^\s*\(?[a-z]\)\s")


def _absorb_subcaptions(work: list[Block], replaced: _Replaced, line_h: float) -> list[Block]:
    """Sub-figure labels ("(a) Step 1") on one line right under a figure, within its width, become part of it:
    a reader draws the figure around its panels and their labels, and the crop then carries them."""
    drop: set[int] = set()
    for i, f in enumerate(work):
        if f.kind != "figure":
            continue
        box = f.bbox
        for b in work:
            if (
                b.kind in ("text", "caption")
                and _SUBCAPTION.match(b.text)
                and b.bbox[3] - b.bbox[1] < 2.5 * line_h
                and b.bbox[0] >= box[0] - 5
                and b.bbox[2] <= box[2] + 5
                and 0 <= b.bbox[1] - box[3] < 1.5 * line_h
            ):
                drop.add(id(b))
                box = union([box, b.bbox])
        if box != f.bbox:
            new = dataclasses.replace(f, bbox=box)
            replaced.put(f, [new])
            work[i] = new
    return [b for b in work if id(b) not in drop]


_FIGURE_LABEL = re.compile(r"^\s*(figure|fig\.|fig\s|scheme|chart|algorithm|abbildung|abb\.)", re.I)


def add_captioned_frames(
    blocks: list[Block], graphics: list[BBox], paths: list[bool], w: float, h: float
) -> list[Block]:
    """A figure caption that points at no visual, next to a drawn frame: the frame is the figure.

    Algorithms and framed listings are figures with a "Figure N" caption whose content is text in a box;
    layout models read them as paragraphs. Only a caption with a figure label and no linked visual, and a
    path at least 40 pt on both sides directly above/below it (within 3% of the page height), qualify.
    """
    out = list(blocks)
    visual = [b for b in blocks if b.kind in CROPPED_KINDS]
    new_order = -1000
    shapes: list[BBox] | None = None
    for cap in [b for b in blocks if b.kind in ("caption", "text") and _FIGURE_LABEL.match(b.text)]:
        target = next((v for v in visual if v.reading_order == cap.caption_of), None)
        if target is not None and target.kind == "figure":
            continue  # already linked to a figure (a link to a table is a backend mistake: "Figure 6" is no table)
        if any(
            vertical_gap(cap.bbox, v.bbox) < 0.03 * h and horizontal_overlap(cap.bbox, v.bbox) >= 0.33 for v in visual
        ):
            continue
        if shapes is None:  # frames are often four separate lines: join touching paths into shapes
            drawn = [g for g, is_path in zip(graphics, paths) if is_path]
            shapes = [union([drawn[i] for i in grp]) for grp in clusters((0.0, 0.0, w, h), drawn, 2.0, cell=1.0)]
        frames = [
            g
            for g in shapes
            if min(g[2] - g[0], g[3] - g[1]) >= 40
            and vertical_gap(cap.bbox, g) < 0.03 * h
            and horizontal_overlap(cap.bbox, g) >= 0.33
            and intersection(cap.bbox, g) == 0
        ]
        if not frames:
            continue
        frame = max(frames, key=area)
        fig = Block("figure", frame, reading_order=new_order)
        new_order -= 1
        i = out.index(cap)
        out.insert(i if frame[1] < cap.bbox[1] else i + 1, fig)
        out[out.index(cap)] = dataclasses.replace(cap, kind="caption", caption_of=fig.reading_order)
        visual.append(fig)
    return out


def _promote_captions(work: list[Block], link: dict[int, Block | None], h: float) -> None:
    """A text block that starts with a caption label ("Figure 3", "Abbildung 2.9", "Table 1") right above or
    below a figure/table without a caption becomes that visual's caption (in place)."""
    linked = {id(t) for c, t in link.items() if t is not None}
    for i, b in enumerate(work):
        if b.kind not in ("text", "title") or not _CAPTION_LABEL.match(b.text):
            continue
        best, best_gap = None, 0.05 * h
        for v in work:
            if v.kind not in ("figure", "table") or id(v) in linked:
                continue
            gap = vertical_gap(b.bbox, v.bbox)
            if horizontal_overlap(b.bbox, v.bbox) >= 0.33 and gap <= best_gap:
                best, best_gap = v, gap
        if best is not None:
            cap = dataclasses.replace(b, kind="caption")
            work[i] = cap
            link[id(cap)] = best
            linked.add(id(best))


def _merge_panels(
    work: list[Block], link: dict[int, Block | None], replaced: _Replaced, w: float, h: float, line_h: float
) -> list[Block]:
    figs = [b for b in work if b.kind == "figure"]
    if len(figs) < 2:
        return work
    # Running text separates figures; one-word labels ("A", "h_c") inside a drawing do not.
    blockers = [
        b.bbox
        for b in work
        if (b.kind in _TEXTUAL and (b.bbox[2] - b.bbox[0] > 0.25 * w or b.bbox[3] - b.bbox[1] > 1.8 * line_h))
        or (b.kind == "caption" and _CAPTION_LABEL.match(b.text))
    ]
    groups = group_adjacent([f.bbox for f in figs], 0.03 * max(w, h), blockers)
    drop: set[int] = set()
    for g in groups:
        if len(g) < 2:
            continue
        members = [figs[i] for i in g]
        box = union([m.bbox for m in members])
        for c in work:  # unlabelled captions right under/inside the panels, within their width
            if (
                c.kind == "caption"
                and not _CAPTION_LABEL.match(c.text)
                and c.bbox[0] >= box[0] - 5
                and c.bbox[2] <= box[2] + 5
                and vertical_gap(c.bbox, box) < 0.02 * h
            ):
                box = union([box, c.bbox])
                drop.add(id(c))
        first = members[0]
        merged = dataclasses.replace(first, bbox=box, text="")
        for m in members:
            replaced.put(m, [merged])
            drop.add(id(m))
        drop.discard(id(first))
        work = [merged if x is first else x for x in work]
    return [b for b in work if id(b) not in drop]


def _resolve(b: Block | None, replaced: _Replaced) -> list[Block]:
    if b is None:
        return []
    if id(b) not in replaced:
        return [b]
    out: list[Block] = []
    for n in replaced[id(b)]:
        out.extend([n] if n is b else _resolve(n, replaced))
    return out


def _renumber(out: list[Block], link: dict[int, Block | None], replaced: _Replaced, h: float) -> list[Block]:
    pos = {id(b): i for i, b in enumerate(out)}
    kinds = [b.kind for b in out]
    geo = link_captions(kinds, [b.bbox for b in out], h)
    final = []
    for i, b in enumerate(out):
        target = None
        if b.kind == "caption" and id(b) in link:
            candidates = [c for c in _resolve(link[id(b)], replaced) if id(c) in pos]
            if len(candidates) == 1:
                target = pos[id(candidates[0])]
            elif candidates:  # the linked figure was split: the piece next to the caption
                target = geo[i] if geo[i] is not None and out[geo[i]] in candidates else pos[id(candidates[0])]
        elif b.kind == "caption" and link.get(id(b)) is None and _CAPTION_LABEL.match(b.text):
            target = geo[i]  # "Figure 3: ..." the backend left unlinked: the visual next to it
        final.append(dataclasses.replace(b, reading_order=i, caption_of=target))
    return final


_NUMBER_TAIL = re.compile(r"(\s*\(\s*[A-Z]?[0-9]+(\.[0-9]+)*[a-z]?\s*\))+\s*$")


def drop_equation_numbers(
    page: pymupdf.Page, blocks: list[Block], dl: pymupdf.DisplayList | None = None
) -> list[Block]:
    """Display-equation boxes without their "(n)" number: the dev set's references, the synthetic pages' truth and
    the self-labels (``parsing.selflabel``) all box the equation alone, while the rules and the detectors reach the
    number at the column's edge. A box is cut when a number is in evidence (its text ends with "(n)", or a text-layer
    word or a text block such as an OCR'd line reading "(n)" lies in its right half) and its ink, column by column,
    ends in a narrow run (at most 45 pt: the number) after a gap of at least 8 pt; it then ends at the ink before the
    gap. Equation boxes that cover the same equation afterwards (IoU >= 0.7: a detector's box with the number beside
    the rules' without) are one, the one with more text kept over their union."""
    import numpy as np
    import pymupdf

    if not any(b.kind == "equation" for b in blocks):
        return blocks
    zoom = 2.0
    numbers = [b.bbox for b in blocks if b.kind != "equation" and rules._EQ_NUMBER.match((b.text or "").strip())]
    numbers += [w[:4] for w in page.get_text("words") if rules._EQ_NUMBER.match(w[4].strip(",.;:"))]
    out: list[Block] = []
    for b in blocks:
        x0, y0, x1, y1 = b.bbox
        right = [n for n in numbers if containment(n, b.bbox) >= 0.8 and n[0] >= (x0 + x1) / 2]
        if b.kind != "equation" or not (right or _NUMBER_TAIL.search(b.text or "")):
            out.append(b)
            continue
        if dl is None:
            dl = page.get_displaylist()  # one for every box of the page
        img, ox, _ = _gray(page, pymupdf.Rect(b.bbox) & page.rect, zoom, dl)
        cols = np.flatnonzero((img < 160).any(axis=0))
        if cols.size < 2:
            out.append(b)
            continue
        gaps = np.flatnonzero(np.diff(cols) > 8 * zoom)  # the ink column before each gap of 8 pt or more
        if gaps.size == 0 or (cols[-1] - cols[gaps[-1] + 1]) > 45 * zoom:
            out.append(b)  # no gap, or the last run is wider than a number
            continue
        end = ox + (cols[gaps[-1]] + 2) / zoom
        text = _NUMBER_TAIL.sub("", b.text or "").strip()  # the number is no longer in the box
        out.append(dataclasses.replace(b, bbox=(x0, y0, min(x1, end), y1), text=text))
    kept: list[Block] = []
    for b in sorted(out, key=lambda b: -len((b.text or "").strip()) if b.kind == "equation" else 0):
        twin = next((k for k in kept if k.kind == b.kind == "equation" and iou(k.bbox, b.bbox) >= 0.7), None)
        if twin is None:
            kept.append(b)
        else:
            kept[kept.index(twin)] = dataclasses.replace(twin, bbox=union([twin.bbox, b.bbox]))
    return sorted(kept, key=lambda b: b.reading_order)
