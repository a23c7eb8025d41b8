"""Configuration of the parsing stage: small frozen dataclasses, one docstring per field.

Used by ``parsing.iter_parse`` (and through it by ``scifolio parse`` / ``scifolio build``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Limits:
    """Oversize limits checked when a PDF is opened; exceeding one quarantines the document (stage "open")."""

    max_bytes: int = 200 * 2**20
    """Largest accepted file size in bytes (reason ``too_large``)."""
    max_pages: int = 2000
    """Most pages per document (reason ``too_many_pages``); larger books are rarely papers and stall a worker."""
    max_page_area: float = (200 * 72) ** 2
    """Largest page area in PDF points² (reason ``page_too_large``): 200 in × 200 in. Posters and maps beyond
    this render to gigapixel images at crop DPI and exhaust memory."""


@dataclass(frozen=True)
class ParseConfig:
    """How PDFs are turned into ``Page`` records."""

    backend: str = "mineru"
    """Layout backend for born-digital pages: ``"mineru"`` (MinerU 4) or ``"pymupdf"`` (PyMuPDF's layout model)."""
    layout: str = "fused"
    """``fused``: the backend's boxes after the layout rules, fused per kind with the DocLayNet YOLO detector's
    (``parsing.fusion``; the detector sees pixels, so scans and image-only pages get its boxes too);
    ``fast``: the backend (and the rules) alone."""
    tier: str = "flash"
    """MinerU tier: ``flash`` runs offline; ``basic``/``standard`` need MinerU's models staged in MINERU_HOME."""
    dpi: int = 200
    """Resolution at which figure/table/equation crops are rendered."""
    pad: float = 2.0
    """Padding added around each cropped box, in PDF points (anti-aliased edges sit just outside the box)."""
    min_crop_px: int = 8
    """A crop whose shorter side would be below this many pixels is not rendered (the block keeps its text)."""
    max_crop_px: int = 4096
    """A crop whose longer side would exceed this is rendered at a lower DPI so that side equals this."""
    ocr_fallback: bool = True
    """Pages without a text layer (scans) go to rapid-layout + rapidocr; when False they get the main backend."""
    page_render_dpi: int | None = None
    """When set, every Page gets ``.render``: the whole page as PNG at this DPI (capped by the next field)."""
    page_render_max_side: int = 1024
    """Longest side in pixels of a whole-page render."""
    page_timeout_s: float = 60.0
    """A page that takes longer is killed and quarantined (reason ``timeout``)."""
    doc_timeout_s: float = 600.0
    """A document that takes longer in total is killed; its remaining pages are quarantined (``timeout``)."""
    page_window: int = 64
    """Long documents are parsed in windows of this many pages, so a worker holds one window, not a book.
    Each MinerU call has a fixed cost: 16-page windows measured ~10% slower than 64 on a 117-page paper."""
    backend_lanes: int = 1
    """Helper processes that run the backend on further windows of a long document while the worker parses
    one: windows go out in groups of ``1 + backend_lanes``. MinerU keeps about one core busy, so one lane
    nearly halves a long document's parse time on two cores; 0 parses the windows one after another. Boxes
    do not depend on it (every window is the same backend call either way)."""
    worker_max_rss_mb: int = 6144
    """The parse worker restarts after a document when its resident memory exceeds this (leak guard)."""
    limits: Limits = field(default_factory=Limits)
    """Oversize limits applied at open time."""

    def __post_init__(self) -> None:
        if self.backend not in ("mineru", "pymupdf"):
            raise ValueError(f"unknown parse backend {self.backend!r}; expected 'mineru' or 'pymupdf'")
        if self.layout not in ("fused", "fast"):
            raise ValueError(f"unknown layout {self.layout!r}; expected 'fused' or 'fast'")
        if self.tier not in ("flash", "basic", "standard"):
            raise ValueError(f"unknown MinerU tier {self.tier!r}; expected flash, basic or standard")
        if self.page_window < 1:
            raise ValueError("page_window must be >= 1")
        if self.backend_lanes < 0:
            raise ValueError("backend_lanes must be >= 0")
