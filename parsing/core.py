"""Parse one validated document, window by window, in the current process (the worker calls this).

``iter_parse`` (``parsing/api.py``) runs this inside a killable worker; tests may call it directly.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from formats.outcomes import is_infrastructure_error
from formats.records import Block, Document, Dropped, Page, page_id
from parsing.backends import OCR_PARSERS, OCR_TEXT, LayoutBackend, ParsedPage, YoloBackend, make_backend, with_order
from parsing.config import ParseConfig
from parsing.crops import crop_blocks, render_page
from parsing.geometry import BBox, area
from parsing.postprocess import TEXT_LAYER_MATH, drop_equation_numbers, refine_blocks, vet_proposals

if TYPE_CHECKING:
    import pymupdf

# A page with fewer extractable characters than this and an image covering this fraction is a scan.
_SCAN_MAX_CHARS = 16
_SCAN_MIN_IMAGE_FRACTION = 0.3


class BackendSet:
    """Backends loaded once per worker process and reused across documents (model loading is slow)."""

    def __init__(self) -> None:
        self._loaded: dict[tuple[str, str], LayoutBackend] = {}

    def get(self, name: str, tier: str = "flash") -> LayoutBackend:
        key = (name, tier if name == "mineru" else "")
        if key not in self._loaded:
            backend = make_backend(name, tier)
            backend.load()
            self._loaded[key] = backend
        return self._loaded[key]


def is_scanned(page: pymupdf.Page) -> bool:
    """True when the page has (almost) no visible text but an image covering much of it: a scan.

    Invisible text (render mode 3) is an OCR layer laid over a scan; layout models for born-digital PDFs see
    such a page as one big picture, so it goes to the scan path too (which reuses that text layer).
    """
    visible = sum(len(s.get("chars", ())) for s in page.get_texttrace() if s.get("type") != 3)
    if visible >= _SCAN_MAX_CHARS:
        return False
    page_area = page.rect.width * page.rect.height
    covered = 0.0
    for info in page.get_image_info():
        b = tuple(info["bbox"])
        covered = max(covered, area(b) / page_area if page_area else 0.0)
    return covered >= _SCAN_MIN_IMAGE_FRACTION


def windows(page_indices: Sequence[int], size: int) -> Iterator[list[int]]:
    idx = list(page_indices)
    for s in range(0, len(idx), size):
        yield idx[s : s + size]


def scan_pages(
    doc: pymupdf.Document, window: Sequence[int], config: ParseConfig, on_page: Callable[[int], None] | None = None
) -> set[int]:
    """The pages of ``window`` that go to the OCR path (``is_scanned``), probed one page after the other.

    The probe interprets the page's whole content stream, so a page whose content never ends (nested form
    XObjects, a self-referencing stream) hangs here first: ``on_page(i)`` is called before page ``i`` is
    probed, which lets the parent process name that page when it has to kill the worker.
    """
    if not config.ocr_fallback:
        return set()
    scans = set()
    for i in window:
        if on_page is not None:
            on_page(i)
        if is_scanned(doc[i]):
            scans.add(i)
    return scans


TEST_RAISE: str | None = None
"""Test hook, set by the worker from ``SCIFOLIO_PARSE_TEST_RAISE=ExcName:page:N`` (``parsing.api``): the backend
raises ``ExcName`` (``MemoryError``: an infrastructure failure; ``ValueError``: a content failure) on page N."""


def _raise_if(pages: Sequence[int]) -> None:
    if TEST_RAISE:
        name, _, page = TEST_RAISE.split(":")
        if int(page) in pages:
            raise {"MemoryError": MemoryError, "ValueError": ValueError, "OSError": OSError}[name](
                f"test hook: page {page}"
            )


def _hang_if(hook: str | None, where: str) -> None:
    """Test hook: ``SCIFOLIO_PARSE_TEST_HANG=open`` or ``page:N`` makes the worker hang there forever."""
    if hook == where:
        while True:
            time.sleep(3600)


def backend_window(
    doc: pymupdf.Document,
    pdf_path: str,
    document: Document,
    window: Sequence[int],
    config: ParseConfig,
    backends: BackendSet,
    scans: set[int] | None = None,
) -> list[tuple[int, ParsedPage | Dropped]]:
    """The layout backend's result for each page of ``window`` (ascending 0-based indices), in page order:
    boxes without clean-up or crops (``finish_page`` adds those), or a Dropped for a page the backend failed.
    ``scans``: the window's scanned pages when the caller has already probed them (``scan_pages``)."""
    if scans is None:
        scans = scan_pages(doc, window, config)
    native = [i for i in window if i not in scans]
    results: dict[int, ParsedPage | Dropped] = {}
    proposals = None
    if config.layout == "fused":
        # Started first: the detector's network runs on a thread while the backends below parse (MinerU keeps
        # about one core busy; the detector takes the other), joined before its boxes are attached.
        yolo = backends.get("yolo")
        assert isinstance(yolo, YoloBackend)
        proposals = yolo.propose(doc, window)
    if native:
        main = backends.get(config.backend, config.tier)
        results.update(_run_backend(main, pdf_path, doc, document, native))
    if scans:
        ocr = backends.get("rapidocr")
        results.update(_run_backend(ocr, pdf_path, doc, document, sorted(scans)))
    if proposals is not None:
        _add_proposals(results, proposals(), "yolo")
    out: list[tuple[int, ParsedPage | Dropped]] = []
    for i in window:
        r = results.get(i)
        if r is None:
            r = Dropped(
                page_id(document.doc_id, i),
                "parse",
                "backend_error",
                {"source": document.source, "detail": "the backend returned no result for this page"},
            )
        out.append((i, r))
    return out


def _add_proposals(
    results: dict[int, ParsedPage | Dropped], proposed: dict[int, tuple[Block, ...]], source: str
) -> None:
    """Attach a detector's figure/table/equation boxes of each parsed page as fusion proposals, and the
    detector as a voter there. A page the detector failed on (absent from ``proposed``) keeps the main
    backend's boxes alone; a page the main backend dropped stays dropped."""
    for i, extra in proposed.items():
        r = results.get(i)
        if isinstance(r, ParsedPage):
            results[i] = r._replace(
                proposals=r.proposals + tuple((source, b) for b in extra), voters=(*r.voters, source)
            )


def finish_page(page: pymupdf.Page, document: Document, parsed: ParsedPage, config: ParseConfig) -> Page | Dropped:
    """Box clean-up and crops for one page the backend parsed; a failed render quarantines only this page.

    On a page with images MuPDF's resource store is emptied first: an image decoded by an earlier render (the
    OCR backend's page render, another page sharing the image) can be reused at another resolution and change
    a crop's pixels. A page's crops then depend on the page alone, whichever process renders it after what.
    (Only such pages: emptying the store also drops parsed fonts, which costs ~10 ms a page.)
    """
    import pymupdf

    if page.get_images():
        pymupdf.TOOLS.store_shrink(100)
    try:
        return _finish_page(page, document, parsed, config)
    except Exception as exc:  # rendering a crop failed: quarantine the page, keep the document
        return Dropped(
            page_id(document.doc_id, page.number),
            "parse",
            "render_error",
            {"source": document.source, "detail": f"{type(exc).__name__}: {exc}"},
        )


def parse_window(
    doc: pymupdf.Document,
    pdf_path: str,
    document: Document,
    window: Sequence[int],
    config: ParseConfig,
    backends: BackendSet,
    hang: str | None = None,
    scans: set[int] | None = None,
) -> Iterator[Page | Dropped]:
    """Parse the pages in ``window`` in this process, yielding Page or Dropped in page order.

    The worker runs the same two steps pipelined (``parsing.helpers``: clean-up and crops of one window in
    helper processes while the backend parses the next); this sequential form is for tests and debugging.
    """
    for i, r in backend_window(doc, pdf_path, document, window, config, backends, scans):
        _hang_if(hang, f"page:{i}")
        yield r if isinstance(r, Dropped) else finish_page(doc[i], document, r, config)


def fused_blocks(
    page: pymupdf.Page,
    blocks: list[Block],
    proposals: Sequence[tuple[str, Block]],
    voters: Sequence[str],
    parser: str = "",
) -> list[Block]:
    """The rules' blocks fused with the detectors' proposals (``parsing.fusion.FITTED``; ``FITTED_SCAN`` on a page
    the OCR backend parsed), the proposals first read against the text layer like the rules' own blocks
    (``postprocess.vet_proposals``). On a page the OCR backend parsed (``parser``), a box the backend missed takes
    the OCR text of the lines it covers (a scan's text layer is empty or its OCR layer, already in those lines),
    marked ``ocr`` on equations."""
    import pymupdf

    from parsing.fusion import FITTED, FITTED_SCAN, fuse_blocks
    from parsing.geometry import containment

    def ocr_text_at(box: BBox) -> str:
        return " ".join(b.text for b in blocks if b.kind == "text" and b.text and containment(b.bbox, box) >= 0.8)

    def layer_text_at(box: BBox) -> str:
        return page.get_text("text", clip=pymupdf.Rect(box)).strip()

    ocr = parser in OCR_PARSERS
    text_at, text_from = (ocr_text_at, OCR_TEXT) if ocr else (layer_text_at, TEXT_LAYER_MATH)
    params = FITTED_SCAN if ocr else FITTED
    return fuse_blocks(blocks, vet_proposals(page, proposals), params, ["rules", *voters], text_at, text_from)


def _run_backend(
    backend: LayoutBackend, pdf_path: str, doc: pymupdf.Document, document: Document, pages: list[int]
) -> dict[int, ParsedPage | Dropped]:
    """Run a backend on a window; if the window fails, retry page by page so one bad page costs one page.

    A page's failure is ``backend_error`` (a content failure: final) unless the exception is an infrastructure
    failure (``formats.outcomes``: out of memory, I/O, a dead model server): then ``infrastructure``, and the
    corpus job retries the whole document in a fresh worker instead of dropping the page."""
    try:
        _raise_if(pages)
        return dict(backend.parse(pdf_path, doc, pages))
    except Exception as exc:
        if len(pages) == 1:
            return {
                pages[0]: Dropped(
                    page_id(document.doc_id, pages[0]),
                    "parse",
                    "infrastructure" if is_infrastructure_error(exc) else "backend_error",
                    {
                        "source": document.source,
                        "backend": backend.name,
                        "detail": traceback.format_exc(limit=4)[-2000:],
                    },
                )
            }
    out: dict[int, ParsedPage | Dropped] = {}
    for i in pages:
        out.update(_run_backend(backend, pdf_path, doc, document, [i]))
    return out


def _finish_page(page: pymupdf.Page, document: Document, parsed: ParsedPage, config: ParseConfig) -> Page:
    # One display list serves every render of the page (ink trimming, crops, the page render): building it
    # is what ``page.get_pixmap`` does on each call, so the pixels are the same and the page is read once.
    dl = page.get_displaylist()
    blocks = with_order(refine_blocks(page, parsed.blocks, dl))
    # Page.parser stays the main backend's label (consumers key on it); which source proposed a fused box is
    # on the block (Block.proposed_by).
    if parsed.voters:
        blocks = with_order(fused_blocks(page, blocks, parsed.proposals, parsed.voters, parsed.parser))
    blocks = with_order(drop_equation_numbers(page, blocks, dl))
    blocks = crop_blocks(page, blocks, config, dl)
    render = None
    if config.page_render_dpi:
        render = render_page(page, config.page_render_dpi, config.page_render_max_side, dl)
    return Page(
        doc_id=document.doc_id,
        page_index=page.number,
        width=page.rect.width,
        height=page.rect.height,
        blocks=tuple(blocks),
        parser=parsed.parser,
        source=document.source,
        render=render,
    )
