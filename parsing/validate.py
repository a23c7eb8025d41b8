"""Opening and validating a PDF: every failure becomes a ``Dropped`` (stage ``open``) with a helpful detail.

Reasons: ``empty``, ``not_pdf``, ``truncated``, ``corrupt``, ``encrypted``, ``zero_pages``, ``too_large``,
``too_many_pages``, ``page_too_large`` (``timeout`` is added by the worker when opening hangs).
A file whose cross-reference table MuPDF had to rebuild is accepted when it still ends in ``%%EOF`` and
its pages load; ``Document.meta["repaired"]`` records it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from formats.records import Document, Dropped, sha256_hex
from parsing.config import Limits

if TYPE_CHECKING:
    import pymupdf

# The PDF header may be preceded by junk (spec: within the first 1024 bytes; readers accept that).
_HEADER_WINDOW = 1024
# A complete PDF ends with %%EOF; some writers append a few bytes (newlines, padding) after it.
_EOF_WINDOW = 2048


def quick_checks(data: bytes, source: str, limits: Limits) -> Dropped | None:
    """Checks that need no PDF library (run in the caller before any worker is involved)."""
    doc_id = sha256_hex(data)
    if len(data) == 0:
        return Dropped(doc_id, "open", "empty", {"source": source, "detail": "file has 0 bytes"})
    if len(data) > limits.max_bytes:
        return Dropped(
            doc_id,
            "open",
            "too_large",
            {"source": source, "bytes": len(data), "max_bytes": limits.max_bytes},
        )
    if b"%PDF-" not in data[:_HEADER_WINDOW]:
        return Dropped(
            doc_id,
            "open",
            "not_pdf",
            {"source": source, "detail": "no %PDF- header in the first 1024 bytes", "head": data[:16].hex()},
        )
    return None


def open_pdf(data: bytes, source: str, limits: Limits) -> tuple[Document, pymupdf.Document] | Dropped:
    """Open and validate ``data``; return the Document record plus the open PyMuPDF document, or a Dropped."""
    import pymupdf

    early = quick_checks(data, source, limits)
    if early is not None:
        return early
    doc_id = sha256_hex(data)
    has_eof = b"%%EOF" in data[-_EOF_WINDOW:]

    def drop(reason: str, **detail: Any) -> Dropped:
        return Dropped(doc_id, "open", reason, {"source": source, **detail})

    try:
        doc = pymupdf.open(stream=data, filetype="pdf")
    except Exception as exc:  # MuPDF raises FileDataError and friends for unreadable files
        reason = "corrupt" if has_eof else "truncated"
        return drop(reason, detail=f"{type(exc).__name__}: {exc}", has_eof=has_eof)

    meta: dict[str, Any] = {"bytes": len(data)}
    try:
        if doc.needs_pass:
            # Many PDFs are "encrypted" with an empty user password only to restrict printing/copying.
            if not doc.authenticate(""):
                doc.close()
                return drop("encrypted", detail="a user password is required (empty password rejected)")
            meta["encrypted_empty_password"] = True
        repaired = bool(doc.is_repaired)
        if repaired and not has_eof:
            # MuPDF salvages what it can from a cut download, but the content is incomplete: quarantine it.
            doc.close()
            return drop("truncated", detail="no %%EOF at the end and the xref had to be rebuilt")
        if repaired:
            meta["repaired"] = True
        if not has_eof:
            meta["missing_eof"] = True
        n_pages = doc.page_count
        if n_pages == 0:
            doc.close()
            return drop("zero_pages", detail="the page tree holds no pages", repaired=repaired)
        if n_pages > limits.max_pages:
            doc.close()
            return drop("too_many_pages", pages=n_pages, max_pages=limits.max_pages)
        for i in range(n_pages):
            rect = doc.page_cropbox(i)
            area = abs(rect.width * rect.height)
            if area > limits.max_page_area:
                doc.close()
                return drop(
                    "page_too_large",
                    page_index=i,
                    width_pt=rect.width,
                    height_pt=rect.height,
                    area_pt2=area,
                    max_page_area=limits.max_page_area,
                )
            if area <= 0:
                doc.close()
                return drop("corrupt", detail=f"page {i} has an empty page box {tuple(rect)}")
        md = doc.metadata or {}
        for key in ("title", "author", "producer", "creator", "format"):
            if md.get(key):
                meta[key] = md[key]
    except Exception as exc:  # a page tree that breaks while walking it
        doc.close()
        return drop("corrupt", detail=f"{type(exc).__name__}: {exc}")
    return Document(doc_id=doc_id, source=source, n_pages=n_pages, meta=meta), doc
