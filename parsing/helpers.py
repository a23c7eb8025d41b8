"""Helper processes of the parse worker: box clean-up and crops, and a second backend lane.

MinerU keeps about one core busy. So that a build uses the others:
- clean-up (``parsing.postprocess``) and crop rendering (``parsing.crops``) of a window's pages run in a
  pool of finisher processes while the backend parses the next window, and on every core once the backend
  is done with the document;
- a document of several windows has windows parsed by the backend in lane processes
  (``ParseConfig.backend_lanes``) beside the worker's own backend (the same call on the same window, so the
  same boxes).

The parse worker (``parsing.worker``) owns them::

    helpers = Helpers(finishers=2)
    helpers.open(pdf_path, document)                      # once per document
    lane = helpers.backend(window, config, scans)         # -> Future[([(page, ParsedPage | Dropped)], rss_mb)]
                                                          #    (config.backend_lanes processes)
    fut = helpers.finish(page_index, parsed, config)      # -> Future[(Page | Dropped, rss_mb)]
    helpers.close()

Helpers are spawned (not forked: MinerU's renderer refuses inherited PDF state), run below the worker's
priority so the backend on the critical path keeps its core, and die with the worker (``PR_SET_PDEATHSIG``):
killing a worker whose page hangs the renderer also kills the helper that hangs.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pymupdf

    from formats.records import Document, Dropped, Page
    from parsing.backends import ParsedPage
    from parsing.config import ParseConfig
    from parsing.core import BackendSet

NICE = 5
"""Helpers' niceness relative to the worker: the worker's backend keeps its core while all are busy."""

_open: tuple[str, str, Any] | None = None  # (path, doc_id, pymupdf.Document) in a helper process
_backends: BackendSet | None = None  # in the lane process


def _init_helper() -> None:
    from parsing.procs import die_with_parent

    parent = multiprocessing.parent_process()  # the parse worker that spawned this helper
    die_with_parent(parent.pid if parent is not None else None)
    try:
        os.nice(NICE)
    except OSError:
        pass
    import numpy  # noqa: F401  (import once here, not inside the first page's timing)
    import pymupdf  # noqa: F401

    import parsing.core  # noqa: F401
    import parsing.detectors  # noqa: F401  (the probe's render)


def _doc(path: str, doc_id: str) -> pymupdf.Document:
    """The document, opened once per helper as ``parsing.validate.open_pdf`` opens it (from its bytes)."""
    global _open
    if _open is None or _open[:2] != (path, doc_id):
        from pathlib import Path

        import pymupdf

        if _open is not None:
            _open[2].close()
        doc = pymupdf.open(stream=Path(path).read_bytes(), filetype="pdf")
        if doc.needs_pass:
            doc.authenticate("")  # validation accepted only documents that open with the empty password
        _open = (path, doc_id, doc)
    return _open[2]


def _finish(
    path: str, document: Document, index: int, parsed: ParsedPage, config: ParseConfig, hang: str | None
) -> tuple[Page | Dropped, float]:
    from parsing.core import _hang_if, finish_page
    from parsing.procs import rss_mb

    doc = _doc(path, document.doc_id)
    _hang_if(hang, f"page:{index}")
    return finish_page(doc[index], document, parsed, config), rss_mb()


def _probe(path: str, document: Document, index: int, scan: bool) -> tuple[bool, float]:
    """Whether the page is a scan (``core.is_scanned``, when ``scan``), after rendering it once as the layout
    detector does. Between them they read the whole page (its content stream; its images decoded, its patterns
    and shadings drawn), so a page whose content or pixels never end hangs here, under the page timeout
    (``worker._Tracker``), and never reaches a render or parse on the worker's own thread. A render that fails
    is left to the steps after (the detector skips the page, its crops quarantine it)."""
    from parsing.core import is_scanned
    from parsing.detectors import render
    from parsing.procs import rss_mb

    page = _doc(path, document.doc_id)[index]
    scanned = scan and is_scanned(page)
    try:
        render(page)
    except Exception:
        pass
    return scanned, rss_mb()


def _lane_backends() -> BackendSet:
    global _backends
    if _backends is None:
        from parsing.backends import ensure_mineru_env
        from parsing.core import BackendSet

        ensure_mineru_env()
        _backends = BackendSet()
    return _backends


def _lane_parse(
    path: str, document: Document, window: Sequence[int], config: ParseConfig, scans: set[int]
) -> tuple[list[tuple[int, ParsedPage | Dropped]], float]:
    from parsing.core import backend_window
    from parsing.procs import rss_mb

    doc = _doc(path, document.doc_id)
    return backend_window(doc, path, document, window, config, _lane_backends(), scans), rss_mb()


def _ready() -> float:
    from parsing.procs import rss_mb

    return rss_mb()


class Helpers:
    """``finishers`` processes finishing pages plus the backend lanes; each Future resolves to (result, RSS)."""

    def __init__(self, finishers: int) -> None:
        self.n = max(1, finishers)
        self._ctx = multiprocessing.get_context("spawn")
        self._finish = ProcessPoolExecutor(self.n, mp_context=self._ctx, initializer=_init_helper)
        self._lanes: ProcessPoolExecutor | None = None
        self._n_lanes = 0
        self._path = ""
        self._document: Document | None = None
        self._warming: list[Future[Any]] | None = None

    def _lane_pool(self, n: int) -> ProcessPoolExecutor:
        if self._lanes is None or self._n_lanes != n:
            if self._lanes is not None:
                self._lanes.shutdown(wait=True, cancel_futures=True)
            self._lanes = ProcessPoolExecutor(n, mp_context=self._ctx, initializer=_init_helper)
            self._n_lanes = n
        return self._lanes

    def warm(self) -> None:
        """Start the finishers now (each spawn imports PyMuPDF/NumPy/SciPy; not waited for: a page submitted
        meanwhile queues). Lanes start with the first document of several windows: most papers are one
        window, and a lane is a second copy of the backend."""
        if self._warming is None:
            self._warming = [self._finish.submit(_ready) for _ in range(self.n)]

    def ready(self) -> bool:
        """True once the finishers have started (imports done): from then on a page's time is its own."""
        return self._warming is not None and all(f.done() for f in self._warming)

    def restart_finishers(self) -> None:
        """Kill the finisher processes (one of them is stuck on a page) and start fresh ones; every page they
        held fails with ``BrokenProcessPool`` and must be submitted again."""
        # ProcessPoolExecutor has no public way to stop a running call (Python 3.14 adds kill_workers()).
        for proc in list(getattr(self._finish, "_processes", {}).values()):
            proc.kill()
        self._finish.shutdown(wait=False, cancel_futures=True)
        self._finish = ProcessPoolExecutor(self.n, mp_context=self._ctx, initializer=_init_helper)
        self._warming = None
        self.warm()

    def open(self, path: str, document: Document) -> None:
        self._path, self._document = path, document

    def backend(self, window: Sequence[int], config: ParseConfig, scans: set[int]) -> Future[Any]:
        """The backend's ``backend_window`` result for ``window`` (pages already probed: ``scans`` are its
        scanned ones), computed in a lane process."""
        assert self._document is not None, "open() a document first"
        assert config.backend_lanes > 0, "no backend lanes configured"
        pool = self._lane_pool(config.backend_lanes)
        return pool.submit(_lane_parse, self._path, self._document, list(window), config, scans)

    def finish(self, index: int, parsed: ParsedPage, config: ParseConfig, hang: str | None = None) -> Future[Any]:
        """``core.finish_page`` for one page, in a finisher process (FIFO)."""
        assert self._document is not None, "open() a document first"
        self.warm()  # no-op once warm; otherwise the start-up goes first in the queue, where ready() sees it
        return self._finish.submit(_finish, self._path, self._document, index, parsed, config, hang)

    def probe(self, index: int, scan: bool) -> Future[Any]:
        """``_probe`` (a trial render, and ``core.is_scanned`` when ``scan``) for one page, in a finisher process
        (FIFO with ``finish``)."""
        assert self._document is not None, "open() a document first"
        self.warm()
        return self._finish.submit(_probe, self._path, self._document, index, scan)

    def wait_ready(self) -> None:
        """Start the finishers if needed and wait until they have (spawn + imports: seconds)."""
        self.warm()
        assert self._warming is not None
        for f in self._warming:
            f.result()

    def close(self) -> None:
        for pool in (self._lanes, self._finish):
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
