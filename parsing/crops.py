"""Render figure/table/equation boxes (and optionally whole pages) to content-addressed PNG crops.

Crops are rendered by PyMuPDF from the vector PDF (not cut out of a page bitmap), so a crop is sharp at any
DPI, and the same PDF and config give byte-identical PNGs: ``Crop.sha256`` is a stable id. Every function
takes the page's display list (``page.get_displaylist()``) optionally: ``page.get_pixmap`` builds one per
call, so passing one that is reused for all boxes of a page gives the same pixels for less work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING

from formats.records import CROPPED_KINDS, Block, Crop
from parsing.config import ParseConfig
from parsing.geometry import BBox, pad

if TYPE_CHECKING:
    import pymupdf


def render_region(
    page: pymupdf.Page, bbox: BBox, dpi: int, min_px: int, max_px: int, dl: pymupdf.DisplayList | None = None
) -> Crop | None:
    """Render ``bbox`` (PDF points, top-left origin) at ``dpi``; None when smaller than ``min_px``.

    When the longer side would exceed ``max_px`` the DPI is lowered so it fits; the Crop records the DPI used.
    """
    import pymupdf

    rect = pymupdf.Rect(bbox) & page.rect
    if rect.is_empty:
        return None
    longest_pt = max(rect.width, rect.height)
    eff_dpi = float(dpi)
    if longest_pt * eff_dpi / 72.0 > max_px:
        eff_dpi = max_px * 72.0 / longest_pt
    if min(rect.width, rect.height) * eff_dpi / 72.0 < min_px:
        return None
    zoom = eff_dpi / 72.0
    if dl is None:
        dl = page.get_displaylist()  # what page.get_pixmap does
    pix = dl.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom), clip=rect, alpha=False, colorspace=pymupdf.csRGB)
    if pix.width > max_px or pix.height > max_px:  # rounding of the clip can add a pixel
        return None if min(pix.width, pix.height) < min_px else _downscale(pix, max_px, eff_dpi)
    return Crop.from_png(pix.tobytes("png"), pix.width, pix.height, int(round(eff_dpi)))


def _downscale(pix: pymupdf.Pixmap, max_px: int, dpi: float) -> Crop:
    import pymupdf

    factor = max(pix.width, pix.height) / max_px
    small = pymupdf.Pixmap(pix, int(pix.width / factor), int(pix.height / factor), None)
    return Crop.from_png(small.tobytes("png"), small.width, small.height, int(round(dpi / factor)))


def crop_blocks(
    page: pymupdf.Page, blocks: Iterable[Block], config: ParseConfig, dl: pymupdf.DisplayList | None = None
) -> list[Block]:
    """Attach a Crop to every figure/table/equation block (padded by ``config.pad`` points)."""
    out = []
    w, h = page.rect.width, page.rect.height
    for b in blocks:
        if b.kind in CROPPED_KINDS:
            if dl is None:
                dl = page.get_displaylist()
            crop = render_region(
                page, pad(b.bbox, config.pad, w, h), config.dpi, config.min_crop_px, config.max_crop_px, dl
            )
            b = dataclasses.replace(b, crop=crop)
        out.append(b)
    return out


def render_page(page: pymupdf.Page, dpi: int, max_side: int, dl: pymupdf.DisplayList | None = None) -> Crop:
    """The whole page as PNG at ``dpi``, scaled down so its longer side is at most ``max_side`` pixels."""
    crop = render_region(page, tuple(page.rect), dpi, 1, max_side, dl)
    if crop is None:  # a degenerate page box; validation rejects empty boxes, so this is a bug if reached
        raise ValueError(f"page {page.number} has an empty page box {tuple(page.rect)}")
    return crop
