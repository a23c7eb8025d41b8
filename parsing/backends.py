"""Layout backends behind one protocol, each mapped to the common block kinds and PDF-point geometry.

- ``MinerUBackend``: MinerU 4 ``parse(path, tier=...)``; ``flash`` runs offline, ``basic``/``standard`` need
  models staged under ``MINERU_HOME`` (a missing model is a ``BackendUnavailable`` naming the tier).
- ``PyMuPDFLayoutBackend``: PyMuPDF's ONNX layout model (``pymupdf.layout`` via ``pymupdf4llm``) on the PDF.
- ``YoloBackend``: a YOLOv8n DocLayNet detector on the rendered page (``parsing.detectors``); pixels only, so it
  also sees scanned and image-only pages; text of its text boxes comes from the page's text layer.
- ``OcrBackend``: pages without a text layer: render, detect regions with rapid-layout's ONNX model
  (PP-layout CDLA), read text with rapidocr (PP-OCRv4). Offline.

Backends run inside the parse worker (``parsing.worker``); they return ``Block``s without crops.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from formats.records import Block
from parsing.geometry import BBox, clamp, containment, from_normalized, from_pixels, link_captions, reading_order
from parsing.layout_rules import split_scan_equations

if TYPE_CHECKING:
    import pymupdf


class BackendUnavailable(RuntimeError):
    """A backend cannot run here (missing models or packages). A configuration error, never per-document."""


class ParsedPage(NamedTuple):
    """A backend's result for one page: the parser label recorded on the Page, and its blocks (no crops)."""

    parser: str
    blocks: list[Block]
    proposals: tuple[tuple[str, Block], ...] = ()
    """Other backends' boxes for the fused layout: (source, block with score), e.g. ``("yolo", ...)``."""
    voters: tuple[str, ...] = ()
    """The other backends that looked at this page (one that proposed nothing still votes against)."""


class LayoutBackend(Protocol):
    """Parses pages of one open PDF into blocks in reading order (PDF points, top-left origin)."""

    name: str
    """Label recorded as ``Page.parser`` (e.g. ``mineru-flash``)."""

    def load(self) -> None:
        """Import and initialise models (once per worker); raise BackendUnavailable when it cannot run."""

    def parse(self, pdf_path: str, doc: pymupdf.Document, page_indices: Sequence[int]) -> dict[int, ParsedPage]:
        """Result per page index for ``page_indices`` (0-based) of the PDF at ``pdf_path`` (= ``doc``)."""


def _blocks_with_order(items: list[tuple[str, BBox, dict[str, Any]]], links: dict[int, int]) -> list[Block]:
    """Build Blocks numbered by list position; ``links`` maps caption position -> target position."""
    return [
        Block(kind=kind, bbox=bbox, reading_order=i, caption_of=links.get(i), **extra)
        for i, (kind, bbox, extra) in enumerate(items)
    ]


def page_range_string(page_indices: Sequence[int]) -> str:
    """0-based indices -> MinerU's 1-based range syntax, consecutive runs compressed: [0,1,2,5] -> "1-3,6"."""
    runs: list[str] = []
    idx = sorted(set(page_indices))
    start = prev = None
    for i in idx + [None]:  # type: ignore[operator]
        if start is not None and (i is None or i != prev + 1):
            runs.append(f"{start + 1}" if start == prev else f"{start + 1}-{prev + 1}")
            start = None
        if i is not None and start is None:
            start = i
        prev = i
    return ",".join(runs)


# ----------------------------------------------------------------------------------------------- MinerU
# MinerU middle-JSON block types -> our kinds. Visual parents (image/table/chart/code) are unpacked below.
_MINERU_KIND = {
    "text": "text",
    "ref_text": "text",
    "page_footnote": "text",
    "list": "list",
    "index": "list",
    "doc_title": "title",
    "paragraph_title": "title",
    "header": "header",
    "footer": "footer",
    "page_number": "page_number",
    "aside_text": "other",
    "equation": "equation",
}
_MINERU_VISUAL = {
    "image": ("image_body", "figure"),
    "chart": ("chart_body", "figure"),
    "table": ("table_body", "table"),
    "code": ("code_body", "code"),
}


def _span_text(spans: Any) -> str:
    """Flatten MinerU inline spans (text, equation_inline, code_inline, hyperlink) to plain text."""
    return _join_spans(spans).strip()


def _join_spans(spans: Any) -> str:
    if isinstance(spans, str):
        return spans
    parts = []
    for s in spans or []:
        content = s.get("content")
        if isinstance(content, list):  # a hyperlink's spans, or a nested block (list item, index entry)
            if s.get("type") == "hyperlink":
                parts.append(_join_spans(content))
            else:
                parts.append(_span_text(content) + "\n")
        elif isinstance(content, str):
            parts.append(f"${content}$" if s.get("type") == "equation_inline" else content)
    return "".join(parts)


def mineru_page_blocks(page: dict[str, Any], width: float, height: float) -> list[Block]:
    """Map one middle-JSON page (``ParseResult.to_dict()["pages"][i]``) to Blocks in MinerU's reading order."""
    items: list[tuple[str, BBox, dict[str, Any]]] = []
    links: dict[int, int] = {}
    for b in page.get("blocks", []):
        t = b.get("type")
        if b.get("bbox") is None:
            continue
        if t in _MINERU_VISUAL:
            body_type, kind = _MINERU_VISUAL[t]
            children = sorted(b.get("content", []), key=lambda c: (c.get("index") is None, c.get("index") or 0))
            body_pos = None
            pending: list[int] = []
            for c in children:
                if c.get("bbox") is None:
                    continue
                cb = clamp(from_normalized(c["bbox"], width, height), width, height)
                ct = c.get("type", "")
                if ct == body_type or ct == "algorithm_body":
                    extra: dict[str, Any] = {}
                    content = c.get("content")
                    if kind == "table" and isinstance(content, str) and content.strip():
                        extra["html"] = content
                    elif kind == "code":
                        extra["text"] = _span_text(content)
                    body_pos = len(items)
                    items.append((kind, cb, extra))
                else:  # *_caption / *_footnote: text that describes the visual, linked to it
                    pending.append(len(items))
                    items.append(("caption", cb, {"text": _span_text(c.get("content"))}))
            if body_pos is not None:
                for p in pending:
                    links[p] = body_pos
            continue
        kind = _MINERU_KIND.get(t, "other")
        bbox = clamp(from_normalized(b["bbox"], width, height), width, height)
        if kind == "equation":
            latex = b.get("content") if isinstance(b.get("content"), str) and b.get("content").strip() else None
            items.append(("equation", bbox, {"latex": latex}))
        else:
            items.append((kind, bbox, {"text": _span_text(b.get("content"))}))
    return _blocks_with_order(items, links)


class MinerUBackend:
    """MinerU 4 on born-digital pages (``ocr_mode="txt"``: scans are routed to the OCR backend instead)."""

    def __init__(self, tier: str = "flash") -> None:
        self.tier = tier
        self.name = f"mineru-{tier}"
        self._parse: Any = None

    def load(self) -> None:
        ensure_mineru_env()
        from mineru import parse
        from mineru.utils.logger import configure_global_log_level

        configure_global_log_level("WARNING")  # MinerU logs every page at INFO
        self._parse = parse
        if self.tier != "flash":
            self._preflight()

    def warm(self) -> None:
        """Parse a one-line PDF: MinerU starts its render processes on its first call, better done before the
        first document (the parse worker calls this while the job is still starting up)."""
        if self.tier == "flash":  # other tiers did this in load()
            self._parse_one_line()

    def _parse_one_line(self) -> None:
        import pymupdf

        doc = pymupdf.open()
        doc.new_page().insert_text((72, 72), "MinerU preflight")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "preflight.pdf"
            doc.save(path)
            self._parse(str(path), tier=self.tier, ocr_mode="txt").to_dict()

    def _preflight(self) -> None:
        """Parse a one-line PDF so a missing model fails here, once, with the tier named."""
        try:
            self._parse_one_line()
        except Exception as exc:
            raise BackendUnavailable(
                f"MinerU tier {self.tier!r} cannot run: its models are not available under "
                f"MINERU_HOME={os.environ.get('MINERU_HOME')} (MINERU_MODEL_SOURCE="
                f"{os.environ.get('MINERU_MODEL_SOURCE')}). Stage the models there or use tier 'flash'. "
                f"Cause: {type(exc).__name__}: {str(exc)[:300]}"
            ) from exc

    def parse(self, pdf_path: str, doc: pymupdf.Document, page_indices: Sequence[int]) -> dict[int, ParsedPage]:
        if not page_indices:
            return {}
        result = self._parse(pdf_path, tier=self.tier, ocr_mode="txt", page_range=page_range_string(page_indices))
        d = result.to_dict()
        sizes = {
            p["page_idx"]: (p["width_pt"], p["height_pt"])
            for p in (d.get("extensions", {}).get("docvortex_layout", {}).get("pages", []))
        }
        out: dict[int, ParsedPage] = {}
        for page in d.get("pages", []):
            i = page["page_idx"]
            if i not in page_indices:
                continue
            w, h = sizes.get(i) or (doc[i].rect.width, doc[i].rect.height)
            out[i] = ParsedPage(self.name, mineru_page_blocks(page, w, h))
        return out


def ensure_mineru_env() -> None:
    """Point MinerU at a project cache (a failed download otherwise writes ~/.mineru/config.yaml) and make
    model lookups local-only unless the user chose a download source: offline failures are then immediate."""
    os.environ.setdefault("MINERU_HOME", str(Path(tempfile.gettempdir()) / "scifolio-mineru"))
    os.environ.setdefault("MINERU_MODEL_SOURCE", "local")


# ---------------------------------------------------------------------------------------------- PyMuPDF
_PYMUPDF_KIND = {
    "text": "text",
    "title": "title",
    "section-header": "title",
    "picture": "figure",
    "table": "table",
    "list-item": "list",
    "page-header": "header",
    "page-footer": "footer",
    "footnote": "text",
    "caption": "caption",
    "formula": "equation",
}


def _textlines_text(textlines: Any) -> str:
    """Join pymupdf4llm text lines; spans separated by a visible gap get a space (LaTeX PDFs often have no
    space glyphs, and pymupdf4llm then splits words into separate spans)."""
    lines = []
    for line in textlines or []:
        parts: list[str] = []
        prev = None
        for s in line.get("spans", []):
            text = s.get("text", "")
            if prev is not None and parts and not parts[-1].endswith(" ") and not text.startswith(" "):
                gap = s["bbox"][0] - prev["bbox"][2]
                if gap > 0.15 * float(prev.get("size") or 10):
                    parts.append(" ")
            parts.append(text)
            prev = s
        lines.append("".join(parts).strip())
    return "\n".join(x for x in lines if x)


class PyMuPDFLayoutBackend:
    """PyMuPDF's own layout model (ONNX, ships in the wheel) with pymupdf4llm's reading order."""

    name = "pymupdf-layout"

    def __init__(self) -> None:
        self._parse_document: Any = None

    def load(self) -> None:
        import pymupdf.layout  # noqa: F401  (activates the ONNX layout model)
        from pymupdf4llm.helpers.document_layout import OCRMode, parse_document

        self._parse_document = parse_document
        self._never = OCRMode.NEVER

    def parse(self, pdf_path: str, doc: pymupdf.Document, page_indices: Sequence[int]) -> dict[int, ParsedPage]:
        import pymupdf

        if not page_indices:
            return {}
        # pymupdf4llm edits the document it parses (removes rotation, the structure tree): use a private copy
        # so crops are rendered from the untouched file.
        own = pymupdf.open(pdf_path)
        try:
            parsed = self._parse_document(own, pages=sorted(page_indices), use_ocr=self._never)
        finally:
            own.close()
        out: dict[int, ParsedPage] = {}
        for pl in parsed.pages:
            i = pl.page_number - 1
            items: list[tuple[str, BBox, dict[str, Any]]] = []
            for box in pl.boxes:
                kind = _PYMUPDF_KIND.get(box.boxclass, "other")
                bbox = clamp((box.x0, box.y0, box.x1, box.y1), pl.width, pl.height)
                extra: dict[str, Any] = {}
                if kind == "table" and box.table:
                    html = box.table.get("html")
                    if html:
                        extra["html"] = html
                    extra["text"] = box.table.get("markdown") or ""
                elif kind not in ("figure", "equation"):
                    extra["text"] = _textlines_text(box.textlines)
                if kind == "footer" and extra.get("text", "").strip().isdigit():
                    kind = "page_number"
                items.append((kind, bbox, extra))
            kinds = [k for k, _, _ in items]
            boxes = [b for _, b, _ in items]
            links = {c: t for c, t in enumerate(link_captions(kinds, boxes, pl.height)) if t is not None}
            out[i] = ParsedPage(self.name, _blocks_with_order(items, links))
        return out


# --------------------------------------------------------------------------------------------------- OCR
_CDLA_KIND = {
    "text": "text",
    "title": "title",
    "figure": "figure",
    "figure_caption": "caption",
    "table": "table",
    "table_caption": "caption",
    "header": "header",
    "footer": "footer",
    "reference": "text",
    "equation": "equation",
}


OCR_TEXT = "ocr"
"""``Block.text_from`` of a display equation on a scanned page whose text OCR read (rapidocr, or the OCR text layer
the scan shipped with): recognised characters, not LaTeX, and less reliable than a text layer; the crop is the
equation's picture."""
OCR_PARSERS = ("rapidocr", "rapid-layout+textlayer")
"""The ``Page.parser`` labels of :class:`OcrBackend` (its text is OCR text)."""


class OcrBackend:
    """Scanned pages: rapid-layout regions + rapidocr lines, both ONNX and offline."""

    name = "rapidocr"

    def __init__(self, dpi: int = 150, layout_threshold: float = 0.5, split_equations: bool = True) -> None:
        self.dpi = dpi
        self.layout_threshold = layout_threshold
        self.split_equations = split_equations
        """Cut equation regions at their prose lines (``layout_rules.split_scan_equations``); False gives the
        layout model's regions as they are (the bare baseline of ``benchmarks/layout.py``)."""
        self._layout: Any = None
        self._ocr: Any = None

    def load(self) -> None:
        import logging

        from rapid_layout import RapidLayout
        from rapidocr_onnxruntime import RapidOCR

        self._layout = RapidLayout(conf_thresh=self.layout_threshold)
        self._ocr = RapidOCR()
        for name in ("rapid_layout", "RapidOCR", "rapidocr_onnxruntime"):
            logging.getLogger(name).setLevel(logging.WARNING)

    def parse(self, pdf_path: str, doc: pymupdf.Document, page_indices: Sequence[int]) -> dict[int, ParsedPage]:
        return {i: self.parse_page(doc[i]) for i in page_indices}

    def parse_page(self, page: pymupdf.Page) -> ParsedPage:
        """(parser label, blocks): ``rapidocr`` when we read the text, ``rapid-layout+textlayer`` when the
        scan came with an OCR text layer (reused: faster, and usually the publisher's better OCR)."""
        import numpy as np
        import pymupdf

        scale = self.dpi / 72.0
        pix = page.get_pixmap(matrix=pymupdf.Matrix(scale, scale), alpha=False, colorspace=pymupdf.csRGB)
        rgb = np.frombuffer(pix.samples, dtype=np.uint8).reshape(pix.height, pix.width, 3)
        bgr = np.ascontiguousarray(rgb[:, :, ::-1])  # both models follow OpenCV's BGR convention
        w, h = page.rect.width, page.rect.height
        lay = self._layout(bgr)
        regions: list[tuple[str, BBox, float]] = []
        for box, cls, score in zip(lay.boxes or [], lay.class_names or [], lay.scores or []):
            regions.append((_CDLA_KIND.get(cls, "other"), clamp(from_pixels(box, scale), w, h), float(score)))
        regions = _drop_nested_duplicates(regions)
        lines = self._text_layer_lines(page)
        name = "rapid-layout+textlayer"
        if not lines:  # no OCR layer shipped with the scan: read the text ourselves
            name = self.name
            ocr_result, _ = self._ocr(bgr)
            for quad, text, _conf in ocr_result or []:
                xs = [p[0] for p in quad]
                ys = [p[1] for p in quad]
                lines.append((clamp(from_pixels((min(xs), min(ys), max(xs), max(ys)), scale), w, h), text))
        if self.split_equations:
            regions = split_scan_equations(regions, lines, w)
        # Assign each OCR line to the textual region holding most of it; visual regions keep no text.
        texts: list[list[tuple[BBox, str]]] = [[] for _ in regions]
        orphans: list[tuple[BBox, str]] = []
        for lb, text in lines:
            best, best_c = None, 0.5
            for r, (_kind, rb, _) in enumerate(regions):
                c = containment(lb, rb)
                if c > best_c:
                    best, best_c = r, c
            if best is None:
                orphans.append((lb, text))
            elif regions[best][0] in ("figure",):
                continue  # text inside a figure (axis labels) is part of the image
            else:
                texts[best].append((lb, text))
        items: list[tuple[str, BBox, dict[str, Any]]] = []
        for r, (kind, rb, score) in enumerate(regions):
            body = " ".join(t for _, t in sorted(texts[r], key=lambda x: (x[0][1], x[0][0])))
            marked = {"text_from": OCR_TEXT} if kind == "equation" and body else {}
            items.append((kind, rb, {"text": body, "score": score, **marked}))
        for lb, text in orphans:
            items.append(("text", lb, {"text": text}))
        order = reading_order([b for _, b, _ in items], w)
        items = [items[i] for i in order]
        kinds = [k for k, _, _ in items]
        links = {c: t for c, t in enumerate(link_captions(kinds, [b for _, b, _ in items], h)) if t is not None}
        return ParsedPage(name, _blocks_with_order(items, links))

    @staticmethod
    def _text_layer_lines(page: pymupdf.Page) -> list[tuple[BBox, str]]:
        """Lines of an existing (usually invisible OCR) text layer; empty when the page has none."""
        if len(page.get_text("text").strip()) < 16:
            return []
        lines = []
        for block in page.get_text("dict")["blocks"]:
            for line in block.get("lines", []):
                text = "".join(s["text"] for s in line["spans"]).strip()
                if text:
                    lines.append((tuple(line["bbox"]), text))
        return lines


def _drop_nested_duplicates(regions: list[tuple[str, BBox, float]]) -> list[tuple[str, BBox, float]]:
    """Remove a region mostly inside a higher-scoring region of the same kind (detector double hits)."""
    keep: list[tuple[str, BBox, float]] = []
    for r in sorted(regions, key=lambda x: -x[2]):
        if any(k == r[0] and containment(r[1], kb) > 0.8 for k, kb, _ in keep):
            continue
        keep.append(r)
    return keep


# ------------------------------------------------------------------------------------------------- YOLO
class YoloBackend:
    """The DocLayNet YOLOv8n detector as a full backend: every detection a block with its score, in reading
    order; text boxes carry the text layer under them (empty on scans). For the fused layout, ``propose``
    runs it beside the main backend instead."""

    name = "yolo-doclaynet"

    def __init__(self, batch: int = 4) -> None:
        from parsing.detectors import YoloLayout

        self.detector = YoloLayout(batch=batch)
        self._thread: Any = None

    def load(self) -> None:
        from parsing.detectors import WeightsUnavailable

        try:
            self.detector.load()
        except WeightsUnavailable as exc:
            raise BackendUnavailable(str(exc)) from exc

    def parse(self, pdf_path: str, doc: pymupdf.Document, page_indices: Sequence[int]) -> dict[int, ParsedPage]:
        import pymupdf

        out: dict[int, ParsedPage] = {}
        pages = [doc[i] for i in page_indices]
        for i, page, dets in zip(page_indices, pages, self.detector.detect(pages)):

            def text_at(box: BBox, page: pymupdf.Page = page) -> str:
                return page.get_text("text", clip=pymupdf.Rect(box)).strip()

            out[i] = ParsedPage(self.name, self._blocks(dets, page.rect.width, page.rect.height, text_at))
        return out

    def propose(self, doc: pymupdf.Document, page_indices: Sequence[int]) -> Callable[[], dict[int, tuple[Block, ...]]]:
        """Start detecting ``page_indices`` for fusion; the returned call waits and gives each page's figure,
        table and equation blocks (with scores, in ``parse``'s order, without text: fusion reads the text
        layer itself). The pages are rendered now, on this thread (PyMuPDF is not thread-safe; ~5 ms and
        ~2.4 MB a page; the parse worker has rendered each once already under the page timeout, so none
        hangs here); the network runs on this backend's own thread while the caller runs the main
        backend, so MinerU (about one core) and the detector use both cores, and both threads finish the
        detector's pages once the main backend is done. A page whose render or inference fails is left out: it
        costs the page its proposals, never the page."""
        import traceback
        from collections import deque
        from concurrent.futures import ThreadPoolExecutor

        from parsing.detectors import render

        rendered = {}
        for i in page_indices:
            try:
                rendered[i] = render(doc[i])
            except Exception:
                traceback.print_exc(limit=2)
        idx = list(rendered)
        step = self.detector.pages_per_call
        chunks = deque(idx[s : s + step] for s in range(0, len(idx), step))

        def drain() -> dict[int, tuple[float, float, list[tuple[str, BBox, float]]]]:
            out = {}
            while True:
                try:
                    chunk = chunks.popleft()
                except IndexError:
                    return out
                out.update(self._infer(chunk, rendered))

        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="yolo")
        future = self._thread.submit(drain)

        def join() -> dict[int, tuple[Block, ...]]:
            from formats.records import CROPPED_KINDS

            # The caller's backend is done: its thread takes the pages the detector's thread has not started
            # (when the detector is the slower of the two, both cores finish its pages).
            got = drain()
            got.update(future.result())
            out = {}
            for i in sorted(got):
                width, height, dets = got[i]
                blocks = self._blocks(dets, width, height, None)
                out[i] = tuple(b for b in blocks if b.kind in CROPPED_KINDS)
            return out

        return join

    def _infer(
        self, chunk: list[int], rendered: dict[int, Any]
    ) -> dict[int, tuple[float, float, list[tuple[str, BBox, float]]]]:
        """Page -> (width, height, detections) of the pages of ``chunk`` (one ``detector.infer`` call; page by
        page again when it fails); their pixels are dropped from ``rendered``."""
        import traceback

        out = {}
        try:
            got = dict(zip(chunk, self.detector.infer([rendered[i] for i in chunk])))
        except Exception:
            got = {}
            for i in chunk:
                try:
                    got[i] = self.detector.infer([rendered[i]])[0]
                except Exception:
                    traceback.print_exc(limit=2)
        for i in chunk:
            r = rendered.pop(i)
            if i in got:
                out[i] = (r.width, r.height, got[i])
        return out

    @staticmethod
    def _blocks(
        dets: list[tuple[str, BBox, float]], width: float, height: float, text_at: Callable[[BBox], str] | None
    ) -> list[Block]:
        """A page's detections as blocks: nested double hits dropped, reading order, caption links; text boxes
        read ``text_at`` (None: no text)."""
        dets = _drop_nested_duplicates(dets)
        items: list[tuple[str, BBox, dict[str, Any]]] = []
        for kind, box, score in dets:
            extra: dict[str, Any] = {"score": score}
            if kind not in ("figure",) and text_at is not None:
                extra["text"] = text_at(box)
            items.append((kind, box, extra))
        order = reading_order([b for _, b, _ in items], width)
        items = [items[k] for k in order]
        kinds = [k for k, _, _ in items]
        links = {c: t for c, t in enumerate(link_captions(kinds, [b for _, b, _ in items], height)) if t is not None}
        return _blocks_with_order(items, links)


def make_backend(name: str, tier: str = "flash") -> LayoutBackend:
    if name == "mineru":
        return MinerUBackend(tier)
    if name == "pymupdf":
        return PyMuPDFLayoutBackend()
    if name == "rapidocr":
        return OcrBackend()
    if name == "yolo":
        return YoloBackend()
    raise ValueError(f"unknown backend {name!r}")


def with_order(blocks: list[Block]) -> list[Block]:
    """Renumber reading_order 0..n-1 keeping caption links (after blocks were removed or merged)."""
    remap = {b.reading_order: i for i, b in enumerate(blocks)}
    return [
        replace(b, reading_order=i, caption_of=remap.get(b.caption_of) if b.caption_of is not None else None)
        for i, b in enumerate(blocks)
    ]
