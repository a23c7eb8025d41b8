"""``iter_parse``: bytes of one PDF -> Document, then Page/Dropped records, from a killable worker process.

    from parsing import ParseConfig, iter_parse
    for rec in iter_parse(open("paper.pdf", "rb").read(), "paper.pdf", ParseConfig()):
        print(type(rec).__name__, getattr(rec, "page_index", ""), getattr(rec, "reason", ""))

or, to look at boxes: ``python -m parsing.visualize paper.pdf --out /tmp/boxes``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from formats.records import Document, Dropped, Page, page_id, sha256_hex, split_page_id
from parsing.backends import BackendUnavailable, ensure_mineru_env
from parsing.config import ParseConfig
from parsing.validate import quick_checks
from parsing.worker import EOF, TIMEOUT, FrameReader, write_frame

PARSER_VERSION = "parsing-4"
"""Bump whenever parser output changes for the same input and config (invalidates resumption)."""

WORKER_START_TIMEOUT_S = 300.0
"""A (re)started worker must import and load its backend within this; that time is not any page's."""
FINISH_GRACE_S = 30.0
"""Slack over the page timeout while the worker finishes pages: it enforces that timeout on its finisher
processes itself (and restarts them), so the parent only steps in when the worker itself is stuck."""

TEST_HANG_ENV = "SCIFOLIO_PARSE_TEST_HANG"
TEST_RAISE_ENV = "SCIFOLIO_PARSE_TEST_RAISE"
"""Test hook: ``ExcName:page:N`` makes the worker's backend raise ``ExcName`` on page N (``parsing.core``)."""
"""Test hook: ``open`` or ``page:N`` makes the worker hang there (exercises the timeouts)."""


def _remove_files(log: Any, workdir: str) -> None:
    log.close()
    Path(log.name).unlink(missing_ok=True)
    shutil.rmtree(workdir, ignore_errors=True)


class Parser:
    """Owns one parse worker process and restarts it after a kill, a crash or memory growth.

    One instance serves many documents sequentially (backends stay loaded between documents); use one per
    thread/process (a Beam DoFn creates it in ``setup``). ``close()`` stops the worker.
    """

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: FrameReader | None = None
        self._log = tempfile.NamedTemporaryFile(prefix="scifolio-parse-worker-", suffix=".log", delete=False)
        self._workdir = tempfile.mkdtemp(prefix="scifolio-parse-")  # the worker's copy of the current PDF
        # Beam does not promise to call a DoFn's teardown (a multi-process DirectRunner worker just exits):
        # remove the log and the work directory at interpreter exit too, not only in close().
        self._cleanup = weakref.finalize(self, _remove_files, self._log, self._workdir)

    # ------------------------------------------------------------------------------------------ worker
    def _ensure_worker(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        ensure_mineru_env()
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)  # so `-m parsing.worker` imports this checkout
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "parsing.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            close_fds=True,
        )
        assert self._proc.stdout is not None
        self._reader = FrameReader(self._proc.stdout.fileno())

    def _kill(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            for s in (self._proc.stdin, self._proc.stdout):
                if s is not None:
                    s.close()
        self._proc = None
        self._reader = None

    def close(self) -> None:
        """Stop the worker (politely: EOF on its stdin, then kill if it lingers) and remove its log."""
        if self._proc is not None and self._proc.poll() is None and self._proc.stdin is not None:
            try:
                self._proc.stdin.close()
                self._proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()
        self._cleanup()

    def __enter__(self) -> Parser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _log_tail(self, n: int = 2000) -> str:
        try:
            data = Path(self._log.name).read_bytes()
            return data[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def warm(self, config: ParseConfig) -> None:
        """Start the worker and have it load ``config``'s backend and its helpers now, without waiting: the
        caller does its own start-up (e.g. loading a tokenizer) meanwhile. The first document's job queues
        behind the warm-up; nothing is answered to it, and a failure shows up with that first document."""
        if self._proc is not None and self._proc.poll() is None:
            return  # a running worker has loaded what it needed
        self._ensure_worker()
        assert self._proc is not None and self._proc.stdin is not None
        write_frame(self._proc.stdin, {"warm": config})

    def _send_job(self, job: dict[str, Any]) -> None:
        self._ensure_worker()
        self._log.truncate(0)
        assert self._proc is not None and self._proc.stdin is not None
        write_frame(self._proc.stdin, job)

    # ------------------------------------------------------------------------------------------- parse
    def iter_parse(self, data: bytes, source: str, config: ParseConfig) -> Iterator[Document | Page | Dropped]:
        """See ``parsing.iter_parse``."""
        early = quick_checks(data, source, config.limits)
        if early is not None:
            yield early
            return
        doc_id = sha256_hex(data)
        hang = os.environ.get(TEST_HANG_ENV) or None
        raise_hook = os.environ.get(TEST_RAISE_ENV) or None
        # The document's clock starts when a worker is ready for it (a cold or restarted worker's start-up is
        # not the document's time; WORKER_START_TIMEOUT_S bounds that).
        doc_deadline = float("inf")
        document: Document | None = None
        done_pages: set[int] = set()
        # Work queue of (pages, window size); None pages = the whole document (count unknown until opened).
        queue: list[tuple[list[int] | None, int]] = [(None, config.page_window)]

        def page_drop(i: int, reason: str, **detail: Any) -> Dropped:
            return Dropped(page_id(doc_id, i), "parse", reason, {"source": source, **detail})

        while queue:
            pages, window_size = queue.pop(0)
            self._send_job(
                {
                    "workdir": self._workdir,
                    "data": data,
                    "source": source,
                    "config": config,
                    "pages": pages,
                    "window": window_size,
                    "hang": hang,
                    "raise": raise_hook,
                }
            )
            finished = False
            window: list[int] = []
            ready = False  # the worker has loaded its backend: from here on time is the document's
            probing: int | None = None  # the page whose content stream the worker is reading, if any
            page_s = config.page_timeout_s
            deadline = min(doc_deadline, time.monotonic() + WORKER_START_TIMEOUT_S)
            try:
                while True:
                    assert self._reader is not None
                    msg = self._reader.read(deadline)
                    if msg is TIMEOUT or msg is EOF:
                        self._kill()
                        # The replacement loads its backend now, while the caller handles this document.
                        self.warm(config)
                        crashed = msg is EOF
                        now = time.monotonic()
                        if not ready and now < doc_deadline:  # nothing of the document was touched yet
                            # An infrastructure failure, not the document's: the corpus job retries it.
                            yield Dropped(
                                doc_id,
                                "open",
                                "worker_start",
                                {
                                    "source": source,
                                    "detail": "the parse worker "
                                    + ("crashed while starting: " + self._log_tail() if crashed else "did not start")
                                    + f" within {WORKER_START_TIMEOUT_S} s",
                                },
                            )
                            return
                        if now >= doc_deadline:
                            missing = self._missing(document, done_pages)
                            yield Dropped(
                                doc_id,
                                "parse" if document else "open",
                                "timeout",
                                {
                                    "source": source,
                                    "detail": f"document exceeded doc_timeout_s={config.doc_timeout_s}",
                                    "pages_missing": missing,
                                },
                            )
                            return
                        if document is None:  # died or hung while opening
                            yield Dropped(
                                doc_id,
                                "open",
                                "crash" if crashed else "timeout",
                                {
                                    "source": source,
                                    "detail": self._log_tail()
                                    if crashed
                                    else f"opening exceeded page_timeout_s={config.page_timeout_s}",
                                },
                            )
                            return
                        if probing is not None and probing not in done_pages:
                            # The worker was reading this page's content alone: it is the page that hangs.
                            yield page_drop(
                                probing,
                                "crash" if crashed else "timeout",
                                detail=self._log_tail()
                                if crashed
                                else f"page exceeded page_timeout_s={page_s} (reading its content)",
                            )
                            done_pages.add(probing)
                            rest = [
                                i
                                for i in (pages if pages is not None else range(document.n_pages))
                                if i not in done_pages
                            ]
                            if rest:
                                queue.insert(0, (rest, window_size))
                            finished = True
                            break
                        pending = [i for i in window if i not in done_pages]
                        rest = [
                            i
                            for i in (pages if pages is not None else range(document.n_pages))
                            if i not in done_pages and i not in pending
                        ]
                        if not pending and rest:  # stalled between windows: blame the next page, never loop
                            pending, rest = [rest[0]], rest[1:]
                        if len(pending) > 1:
                            # Which page of the window hung is unknown: retry each alone, then the rest.
                            queue[:0] = [([i], 1) for i in pending]
                        elif pending:
                            yield page_drop(
                                pending[0],
                                "crash" if crashed else "timeout",
                                detail=self._log_tail()
                                if crashed
                                else f"page exceeded page_timeout_s={config.page_timeout_s}",
                            )
                            done_pages.add(pending[0])
                        rest = [i for i in rest if i not in pending]
                        if rest:
                            queue.insert(len(pending) if len(pending) > 1 else 0, (rest, window_size))
                        finished = True
                        break
                    kind, payload = msg
                    now = time.monotonic()
                    if kind == "ready":
                        ready = True
                        if doc_deadline == float("inf"):
                            doc_deadline = now + config.doc_timeout_s
                        deadline = min(doc_deadline, now + page_s)  # opening the file
                    elif kind == "doc":
                        if document is None:
                            document = payload
                            yield payload
                        # Next the pages are probed, each under the page timeout that the worker enforces.
                        deadline = min(doc_deadline, now + page_s + FINISH_GRACE_S)
                    elif kind == "probe":
                        probing = payload
                        deadline = min(doc_deadline, now + page_s)
                    elif kind == "window":
                        probing, window = None, payload
                        # The backend parses the window in one call: a page's time is not seen apart.
                        deadline = min(doc_deadline, now + page_s * len(window))
                    elif kind == "progress":
                        deadline = min(doc_deadline, max(deadline, now + page_s + FINISH_GRACE_S))
                    elif kind == "finishing":
                        probing, window = None, payload
                        deadline = min(doc_deadline, max(deadline, now + page_s + FINISH_GRACE_S))
                    elif kind in ("page", "dropped"):
                        if document is None:  # validation failed inside the worker
                            yield payload
                            continue
                        # Progress: the next page the finishers hold has its own page timeout from now.
                        deadline = min(doc_deadline, max(deadline, now + page_s + FINISH_GRACE_S))
                        idx = payload.page_index if kind == "page" else split_page_id(payload.item_id)[1]
                        if idx not in done_pages:
                            done_pages.add(idx)
                            yield payload
                    elif kind == "fatal":
                        raise BackendUnavailable(payload)
                    elif kind == "error":
                        missing = self._missing(document, done_pages)
                        if document is None:
                            yield Dropped(doc_id, "open", "worker_error", {"source": source, "detail": payload})
                        for i in missing:
                            yield page_drop(i, "worker_error", detail=payload)
                            done_pages.add(i)
                    elif kind == "done":
                        finished = True
                        if payload > config.worker_max_rss_mb:
                            self.close_worker()
                        break
            finally:
                if not finished:  # the consumer stopped early: the worker is mid-job and must not be reused
                    self._kill()
            if document is None:
                return

    @staticmethod
    def _missing(document: Document | None, done: set[int]) -> list[int]:
        return [] if document is None else [i for i in range(document.n_pages) if i not in done]

    def close_worker(self) -> None:
        """Stop the current worker; the next document starts a fresh one."""
        if self._proc is not None and self._proc.stdin is not None:
            try:
                self._proc.stdin.close()
                self._proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()


_DEFAULT: Parser | None = None


def _default_parser() -> Parser:
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Parser()
        atexit.register(_DEFAULT.close)
    return _DEFAULT


def iter_parse(data: bytes, source: str, config: ParseConfig) -> Iterator[Document | Page | Dropped]:
    """Parse one PDF given as bytes.

    Yields first a ``Document`` (validated) or a ``Dropped`` (stage ``open``) and then stops; after a Document,
    ``Page`` records in page order and ``Dropped(item_id=f"{doc_id}:{page}", stage="parse")`` for pages that
    failed (reasons ``timeout``, ``crash``, ``backend_error``, ``render_error``, ``worker_error``, and
    ``infrastructure`` for a backend failure of the machine, not the page, which the caller must retry; a worker that
    could not start gives the document ``open``/``worker_start``, an infrastructure failure). A document
    that exceeds ``doc_timeout_s`` ends with ``Dropped(item_id=doc_id, reason="timeout")`` listing the pages
    it did not reach. Nothing raises except ``BackendUnavailable`` (a configuration error: e.g. MinerU tier
    ``standard`` without its models), which would otherwise quarantine every document.

    Runs in a per-process worker (``Parser``) that is reused across calls. Timeouts: every page, a document's
    first and only one included, gets ``page_timeout_s`` to have its content read (``is_scanned``) and to be
    finished (clean-up, crops), enforced per page by the worker on its helper processes (a stuck page costs
    the timeout plus a restart of the helpers); a window in the backend gets ``page_timeout_s`` × its pages,
    enforced by killing the worker. Both clocks and ``doc_timeout_s`` start when the worker is ready (a cold
    or restarted worker's start-up is not the document's time; ``WORKER_START_TIMEOUT_S`` bounds it).
    """
    yield from _default_parser().iter_parse(data, source, config)


def warm_up(config: ParseConfig) -> None:
    """Start this process's parse worker and load ``config``'s backend in the background (see
    ``Parser.warm``); ``iter_parse`` works without it, the first document then waits for the loading."""
    _default_parser().warm(config)


def close_default_parser() -> None:
    """Stop this process's parse worker (``iter_parse``/``warm_up`` start a fresh one when next called): for
    benchmarks and tests that want every run to start cold, as a new ``scifolio`` process does."""
    global _DEFAULT
    if _DEFAULT is not None:
        _DEFAULT.close()
        _DEFAULT = None


def available_backends() -> dict[str, str]:
    """Installed layout backends -> version strings (written to the manifest beside PARSER_VERSION)."""
    from importlib import metadata

    out: dict[str, str] = {}
    for name, dist in (
        ("mineru", "mineru"),
        ("pymupdf", "pymupdf"),
        ("pymupdf4llm", "pymupdf4llm"),
        ("rapid-layout", "rapid-layout"),
        ("rapidocr", "rapidocr-onnxruntime"),
    ):
        try:
            out[name] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out
