"""Pure box geometry shared by the layout backends: PDF points, top-left origin, ``(x0, y0, x1, y1)``.

No PDF library here, so everything is unit-testable with plain tuples (``tests/parsing/test_geometry.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

BBox = tuple[float, float, float, float]


def from_normalized(box: Sequence[float], width: float, height: float) -> BBox:
    """Map a 0–1 normalised box (MinerU middle JSON) to PDF points."""
    x0, y0, x1, y1 = box
    return (x0 * width, y0 * height, x1 * width, y1 * height)


def from_pixels(box: Sequence[float], scale: float) -> BBox:
    """Map a pixel box of a page rendered at ``scale`` pixels per point to PDF points."""
    x0, y0, x1, y1 = box
    return (x0 / scale, y0 / scale, x1 / scale, y1 / scale)


def clamp(box: BBox, width: float, height: float) -> BBox:
    """Clip a box to the page and order its corners."""
    x0, y0, x1, y1 = box
    x0, x1 = sorted((x0, x1))
    y0, y1 = sorted((y0, y1))
    return (max(0.0, x0), max(0.0, y0), min(width, x1), min(height, y1))


def area(box: BBox) -> float:
    return max(0.0, box[2] - box[0]) * max(0.0, box[3] - box[1])


def intersection(a: BBox, b: BBox) -> float:
    return area((max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])))


def iou(a: BBox, b: BBox) -> float:
    inter = intersection(a, b)
    union = area(a) + area(b) - inter
    return inter / union if union > 0 else 0.0


def containment(inner: BBox, outer: BBox) -> float:
    """Fraction of ``inner``'s area that lies inside ``outer`` (1.0 = fully inside)."""
    a = area(inner)
    return intersection(inner, outer) / a if a > 0 else 0.0


def any_contained(inner: Sequence[BBox], outer: Sequence[BBox], threshold: float, *, strict: bool = True) -> list[bool]:
    """For each ``inner`` box: is ``containment(inner, o) > threshold`` (``>=`` when not ``strict``) for some
    ``o`` in ``outer``? The same arithmetic as ``containment``, vectorised (pages hold thousands of paths)."""
    return _any_containment(inner, outer, threshold, strict, axis=1)


def any_containing(inner: Sequence[BBox], outer: Sequence[BBox], threshold: float) -> list[bool]:
    """For each ``outer`` box: is ``containment(i, outer) > threshold`` for some ``i`` in ``inner``?"""
    return _any_containment(inner, outer, threshold, True, axis=0)


def _any_containment(
    inner: Sequence[BBox], outer: Sequence[BBox], threshold: float, strict: bool, axis: int
) -> list[bool]:
    import numpy as np

    n, m = len(inner), len(outer)
    if n == 0 or m == 0:
        return [False] * (n if axis == 1 else m)
    a = np.asarray(inner, dtype=float).reshape(-1, 4)
    b = np.asarray(outer, dtype=float).reshape(-1, 4)
    hit = np.zeros(n if axis == 1 else m, dtype=bool)
    step = max(1, 2**20 // m)  # bounded temporaries: at most ~1M pairs at a time
    for s in range(0, n, step):
        x = a[s : s + step, None, :]
        iw = np.maximum(0.0, np.minimum(x[..., 2], b[None, :, 2]) - np.maximum(x[..., 0], b[None, :, 0]))
        ih = np.maximum(0.0, np.minimum(x[..., 3], b[None, :, 3]) - np.maximum(x[..., 1], b[None, :, 1]))
        ar = np.maximum(0.0, x[..., 2] - x[..., 0]) * np.maximum(0.0, x[..., 3] - x[..., 1])
        frac = np.divide(iw * ih, ar, out=np.zeros_like(iw), where=ar > 0)
        cmp = frac > threshold if strict else frac >= threshold
        if axis == 1:
            hit[s : s + step] = cmp.any(axis=1)
        else:
            hit |= cmp.any(axis=0)
    return hit.tolist()


def union(boxes: Sequence[BBox]) -> BBox:
    return (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))


def pad(box: BBox, amount: float, width: float, height: float) -> BBox:
    """Grow a box by ``amount`` points on each side, clipped to the page."""
    return clamp((box[0] - amount, box[1] - amount, box[2] + amount, box[3] + amount), width, height)


def horizontal_overlap(a: BBox, b: BBox) -> float:
    """Overlap of the x-extents as a fraction of the narrower box's width."""
    inter = min(a[2], b[2]) - max(a[0], b[0])
    narrow = min(a[2] - a[0], b[2] - b[0])
    return max(0.0, inter) / narrow if narrow > 0 else 0.0


def vertical_gap(a: BBox, b: BBox) -> float:
    """Vertical distance between two boxes (0 when their y-extents overlap)."""
    return max(0.0, max(a[1], b[1]) - min(a[3], b[3]))


def link_captions(kinds: Sequence[str], boxes: Sequence[BBox], page_height: float) -> list[int | None]:
    """For each caption, the index of the figure/table it describes (else None), by geometry.

    A caption belongs to the nearest figure/table directly above or below it that shares at least a third
    of its width; figures usually have captions below, tables above, but both occur, so distance decides.
    Used for backends that do not link captions themselves (PyMuPDF layout, the OCR path).
    """
    targets = [i for i, k in enumerate(kinds) if k in ("figure", "table")]
    links: list[int | None] = [None] * len(kinds)
    max_gap = 0.12 * page_height
    for i, kind in enumerate(kinds):
        if kind != "caption":
            continue
        best, best_gap = None, max_gap
        for t in targets:
            if horizontal_overlap(boxes[i], boxes[t]) < 0.33:
                continue
            gap = vertical_gap(boxes[i], boxes[t])
            if gap <= best_gap:
                best, best_gap = t, gap
        links[i] = best
    return links


def reading_order(boxes: Sequence[BBox], page_width: float) -> list[int]:
    """A column-aware reading order for boxes that come without one (the OCR path).

    Boxes spanning both halves of the page act as section breaks; between breaks, the left column is read
    top-to-bottom before the right column. Single-column pages reduce to top-to-bottom order.
    """
    mid = page_width / 2.0
    idx = sorted(range(len(boxes)), key=lambda i: (boxes[i][1], boxes[i][0]))
    order: list[int] = []
    left: list[int] = []
    right: list[int] = []

    def flush() -> None:
        order.extend(sorted(left, key=lambda i: boxes[i][1]))
        order.extend(sorted(right, key=lambda i: boxes[i][1]))
        left.clear()
        right.clear()

    for i in idx:
        x0, _, x1, _ = boxes[i]
        if x0 < mid - 0.05 * page_width and x1 > mid + 0.05 * page_width:
            flush()
            order.append(i)
        elif (x0 + x1) / 2 < mid:
            left.append(i)
        else:
            right.append(i)
    flush()
    return order


def tighten(box: BBox, elements: Sequence[BBox], exclude: Sequence[BBox] = (), min_keep: float = 0.15) -> BBox:
    """Shrink ``box`` to the union of the page content drawn inside it (never grow it).

    ``elements`` are drawn things (image, path and text-line boxes); one counts when at least half of it lies
    inside ``box``, and it is clipped to ``box``. Elements mostly inside an ``exclude`` box (text blocks that
    are not part of the visual) and elements much larger than the box (page backgrounds) are ignored. When
    what remains covers less than ``min_keep`` of the box the original is kept: the content is probably not
    vector/raster (e.g. a form XObject the log cannot see) and shrinking would cut the visual.
    """
    a = area(box)
    if a <= 0:
        return box
    keep: list[BBox] = []
    for e in elements:
        if area(e) > 2.0 * a or containment(e, box) < 0.5:
            continue
        if any(containment(e, x) > 0.5 for x in exclude):
            continue
        keep.append((max(e[0], box[0]), max(e[1], box[1]), min(e[2], box[2]), min(e[3], box[3])))
    if not keep:
        return box
    tight = union(keep)
    return tight if area(tight) >= min_keep * a else box


def box_gap(a: BBox, b: BBox) -> float:
    """Chebyshev gap between two boxes (0 when they touch or overlap)."""
    dx = max(0.0, max(a[0], b[0]) - min(a[2], b[2]))
    dy = max(0.0, max(a[1], b[1]) - min(a[3], b[3]))
    return max(dx, dy)


def group_adjacent(boxes: Sequence[BBox], max_gap: float, blockers: Sequence[BBox]) -> list[list[int]]:
    """Connected groups of boxes closer than ``max_gap`` whose pairwise union overlaps no blocker box.

    Merges the panels of one figure (sub-figures, a plot split into pieces by the detector) but not two
    figures separated by running text.
    """
    parent = list(range(len(boxes)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            if box_gap(boxes[i], boxes[j]) > max_gap:
                continue
            u = union([boxes[i], boxes[j]])
            if any(containment(b, u) > 0.3 for b in blockers):
                continue
            parent[find(i)] = find(j)
    groups: dict[int, list[int]] = {}
    for i in range(len(boxes)):
        groups.setdefault(find(i), []).append(i)
    return sorted(groups.values())


def clusters(box: BBox, elements: Sequence[BBox], gap: float, cell: float = 3.0) -> list[list[int]]:
    """Group the ``elements`` inside ``box`` into clusters separated by at least ``gap`` points of empty space.

    Elements are painted on a grid of ``cell``-point cells, the occupancy is dilated by ``gap / 2`` and
    connected regions are labelled (scipy.ndimage, 4-neighbourhood). Returns element indices per cluster, in
    top-to-bottom order. Linear in the number of grid cells, so a plot with thousands of paths stays cheap.
    """
    import numpy as np
    from scipy import ndimage

    if not elements:
        return []
    x0, y0, x1, y1 = box
    w = max(1, int((x1 - x0) / cell) + 1)
    h = max(1, int((y1 - y0) / cell) + 1)
    occ = np.zeros((h, w), dtype=bool)
    cells = []
    for e in elements:
        c0 = min(w - 1, max(0, int((e[0] - x0) / cell)))
        c1 = min(w - 1, max(0, int((e[2] - x0) / cell)))
        r0 = min(h - 1, max(0, int((e[1] - y0) / cell)))
        r1 = min(h - 1, max(0, int((e[3] - y0) / cell)))
        occ[r0 : r1 + 1, c0 : c1 + 1] = True
        cells.append(((r0 + r1) // 2, (c0 + c1) // 2))
    k = max(0, int(round(gap / 2 / cell)))
    if k:  # binary dilation by a (2k+1)² square (a separable max filter; outside the grid is empty)
        occ = ndimage.maximum_filter(occ, size=2 * k + 1, mode="constant", cval=False)
    labels, _ = ndimage.label(occ)  # 4-connected components, in C
    groups: dict[int, list[int]] = {}
    for i, (r, c) in enumerate(cells):
        groups.setdefault(int(labels[r, c]), []).append(i)
    out = list(groups.values())
    return sorted(out, key=lambda g: (min(elements[i][1] for i in g), min(elements[i][0] for i in g)))
