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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from formats.records import Document, Dropped, Page, page_id, sha256_hex, split_page_id
from parsing.backends import BackendUnavailable, ensure_mineru_env
from parsing.config import ParseConfig
from parsing.validate import quick_checks
from parsing.worker import EOF, HELPER_DIED, TIMEOUT, FrameReader, write_frame

PARSER_VERSION = "parsing-4"
"""Bump whenever parser output changes for the same input and config (invalidates resumption)."""

WORKER_START_TIMEOUT_S = 300.0
"""A (re)started worker must import and load its backend within this; that time is not any page's."""
FINISH_GRACE_S = 30.0
"""Slack over the page timeout while the worker finishes pages: it enforces that timeout on its finisher
processes itself (and restarts them), so the parent only steps in when the worker itself is stuck."""

TEST_HANG_ENV = "SCIFOLIO_PARSE_TEST_HANG"
"""Test hook: ``open`` or ``page:N`` makes the worker hang there (exercises the timeouts)."""
TEST_RAISE_ENV = "SCIFOLIO_PARSE_TEST_RAISE"
"""Test hook: ``ExcName:page:N`` makes the worker's backend raise ``ExcName`` on page N (``parsing.core``)."""
TEST_KILL_ENV = "SCIFOLIO_PARSE_TEST_KILL"
"""Test hook: ``N:MARKER`` makes the worker SIGKILL itself when a window holding page N starts, unless the file
MARKER exists (it is created first): one death, as the kernel's OOM killer would deal it; ``N:`` every time."""


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
        doc = _DocRun(sha256_hex(data), source, config)
        hooks = {k: os.environ.get(env) or None for k, env in (("hang", TEST_HANG_ENV), ("raise", TEST_RAISE_ENV))}
        hooks["kill"] = os.environ.get(TEST_KILL_ENV) or None
        queue = [Job(None, config.page_window)]  # None pages: the whole document (its page count is unknown yet)
        while queue:
            job = queue.pop(0)
            self._send_job(
                {"workdir": self._workdir, "data": data, "source": source, "config": config, "pages": job.pages}
                | {"window": job.window}
                | hooks
            )
            attempt = _Attempt(deadline=min(doc.deadline, time.monotonic() + WORKER_START_TIMEOUT_S))
            finished = False
            try:
                while True:
                    assert self._reader is not None
                    msg = self._reader.read(attempt.deadline)
                    if msg is TIMEOUT or msg is EOF:
                        failure = self._failure(msg is EOF, config)
                        # The replacement loads its backend now, while the caller handles this document.
                        self.warm(config)
                        end = doc.stopped(attempt, failure, time.monotonic())
                        if end is not None:
                            yield end
                            return
                        drops, retry = blame(job, attempt, doc.done, doc.n_pages, failure)
                        for i in drops:
                            yield doc.page_drop(i, failure.reason, failure.detail)
                        queue[:0] = retry
                        finished = True
                        break
                    kind, payload = msg
                    yield from doc.handle(attempt, kind, payload, time.monotonic())
                    if kind == "fatal":
                        raise BackendUnavailable(payload)
                    if kind == "done":
                        finished = True
                        if payload > config.worker_max_rss_mb:
                            self.close_worker()
                        break
            finally:
                if not finished:  # the consumer stopped early: the worker is mid-job and must not be reused
                    self._kill()
            if doc.document is None:
                return

    def _failure(self, eof: bool, config: ParseConfig) -> Failure:
        """Why the current job ended without "done": the worker went silent past its deadline (it is killed), or
        its pipe closed (it died: by a signal — the kernel's OOM killer, a segfault —, or a helper of it died)."""
        if not eof:
            self._kill()
            return Failure("timeout", f"page exceeded page_timeout_s={config.page_timeout_s}", death=False)
        rc = None
        if self._proc is not None:
            try:
                rc = self._proc.wait(timeout=5)  # its pipe is closed: it has exited or is about to
            except subprocess.TimeoutExpired:
                rc = None
        tail = self._log_tail()
        self._kill()
        return exit_failure(rc, tail)

    def close_worker(self) -> None:
        """Stop the current worker; the next document starts a fresh one."""
        if self._proc is not None and self._proc.stdin is not None:
            try:
                self._proc.stdin.close()
                self._proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()


# --------------------------------------------------------------------------------- supervision, pure parts
@dataclass
class Job:
    """Pages sent to the worker in one message: ``pages`` None is the whole document, ``window`` pages go to the
    backend at once; ``retry`` marks a page sent alone again after its worker died (a second death is final)."""

    pages: list[int] | None
    window: int
    retry: bool = False


@dataclass(frozen=True)
class Failure:
    """How a job ended without "done": ``reason`` for its pages' dead letters (``timeout``, ``crash`` for a content
    crash, ``worker_killed`` for a death), ``death`` when the worker died rather than hung or failed (a signal: the
    kernel's OOM killer, a segfault; a helper's death): its pages get one more try, each alone on a fresh
    worker, before a page is quarantined as ``worker_killed``."""

    reason: str
    detail: str
    death: bool


def exit_failure(returncode: int | None, log_tail: str) -> Failure:
    """The failure of a worker whose pipe closed, from its exit status: killed by signal N (returncode -N), a
    helper process died under it (``worker.HELPER_DIED``), or it crashed otherwise (a content failure)."""
    import signal

    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown"
        return Failure("worker_killed", f"worker killed (signal {-returncode}, {name})", death=True)
    if returncode == HELPER_DIED:
        return Failure("worker_killed", "a helper process of the parse worker died: " + log_tail, death=True)
    return Failure("crash", log_tail, death=False)


@dataclass
class _Attempt:
    """What the parent has heard from the worker during one job."""

    deadline: float
    ready: bool = False
    """The worker has loaded its backend: from here on time is the document's."""
    window: list[int] = field(default_factory=list)
    """Pages the worker said are in flight (a backend window, or the pages the finishers hold)."""
    probing: int | None = None
    """The page whose content the worker is reading on its own thread (the sequential path), if any."""


def next_deadline(kind: str, payload: Any, now: float, deadline: float, doc_deadline: float, page_s: float) -> float:
    """The parent's deadline for the worker's next message after a message ``kind``. Opening the file and
    reading one page's content get the page timeout; a backend window the page timeout per page (the backend
    parses it in one call: a page's time is not seen apart); progress of the finishers, which enforce the page
    timeout themselves, extends it to one page timeout plus ``FINISH_GRACE_S``; never past the document's."""
    grace = now + page_s + FINISH_GRACE_S
    if kind in ("ready", "probe"):
        return min(doc_deadline, now + page_s)
    if kind == "doc":
        return min(doc_deadline, grace)
    if kind == "window":
        return min(doc_deadline, now + page_s * len(payload))
    if kind in ("progress", "finishing", "page", "dropped"):
        return min(doc_deadline, max(deadline, grace))
    return deadline


def blame(job: Job, attempt: _Attempt, done: set[int], n_pages: int, failure: Failure) -> tuple[list[int], list[Job]]:
    """After a job failed: the pages to quarantine with ``failure.reason`` now, and the jobs to run next (in
    order, before anything queued). The page the worker was reading alone is the culprit; in a window, which
    page failed is unknown, so each is retried alone, then the rest of the job. A page alone whose worker
    died (``failure.death``) is tried once more on a fresh worker before it is quarantined."""
    pages = job.pages if job.pages is not None else list(range(n_pages))
    left = [i for i in pages if i not in done]
    if attempt.probing is not None and attempt.probing not in done:
        pending = [attempt.probing]
    else:
        pending = [i for i in attempt.window if i not in done]
        if not pending and left:  # stalled between windows: blame the next page, never loop
            pending = left[:1]
    rest = [i for i in left if i not in pending]
    tail = [Job(rest, job.window)] if rest else []
    if len(pending) > 1:
        return [], [Job([i], 1, retry=failure.death) for i in pending] + tail
    if pending and failure.death and not (job.retry and job.pages == pending):
        return [], [Job(pending, 1, retry=True), *tail]
    return pending, tail


class _DocRun:
    """One document's state across the jobs of ``Parser.iter_parse``: its record once opened, the pages already
    answered, the document's deadline; turns the worker's messages into records."""

    def __init__(self, doc_id: str, source: str, config: ParseConfig) -> None:
        self.doc_id, self.source, self.config = doc_id, source, config
        self.document: Document | None = None
        self.done: set[int] = set()
        self.deadline = float("inf")  # starts when a worker is first ready for the document

    @property
    def n_pages(self) -> int:
        return self.document.n_pages if self.document is not None else 0

    def page_drop(self, i: int, reason: str, detail: str) -> Dropped:
        self.done.add(i)
        return Dropped(page_id(self.doc_id, i), "parse", reason, {"source": self.source, "detail": detail})

    def missing(self) -> list[int]:
        return [i for i in range(self.n_pages) if i not in self.done]

    def stopped(self, attempt: _Attempt, failure: Failure, now: float) -> Dropped | None:
        """The document's own dead letter when a failed job ends it: the worker never became ready (an
        infrastructure failure: the corpus job retries the document), the document's time ran out, or the
        worker failed while opening it."""
        info: dict[str, Any] = {"source": self.source}
        if not attempt.ready and now < self.deadline:  # nothing of the document was touched yet
            what = "crashed while starting: " + failure.detail if failure.reason != "timeout" else "did not start"
            info["detail"] = f"the parse worker {what} within {WORKER_START_TIMEOUT_S} s"
            return Dropped(self.doc_id, "open", "worker_start", info)
        if now >= self.deadline:
            info |= {"detail": f"document exceeded doc_timeout_s={self.config.doc_timeout_s}"}
            info["pages_missing"] = self.missing()
            return Dropped(self.doc_id, "parse" if self.document else "open", "timeout", info)
        if self.document is None:  # died or hung while opening
            timeout = failure.reason == "timeout"
            info["detail"] = (
                f"opening exceeded page_timeout_s={self.config.page_timeout_s}" if timeout else failure.detail
            )
            return Dropped(self.doc_id, "open", failure.reason, info)
        return None

    def handle(self, attempt: _Attempt, kind: str, payload: Any, now: float) -> Iterator[Document | Page | Dropped]:
        """Records for one worker message, and the attempt's next deadline."""
        if kind == "ready":
            attempt.ready = True
            if self.deadline == float("inf"):
                self.deadline = now + self.config.doc_timeout_s
        elif kind == "doc" and self.document is None:
            self.document = payload
            yield payload
        elif kind == "probe":
            attempt.probing = payload
        elif kind in ("window", "finishing"):
            attempt.probing, attempt.window = None, payload
        elif kind in ("page", "dropped"):
            if self.document is None:  # validation failed inside the worker
                yield payload
                return
            idx = payload.page_index if kind == "page" else split_page_id(payload.item_id)[1]
            if idx not in self.done:
                self.done.add(idx)
                yield payload
        elif kind == "error":
            if self.document is None:
                yield Dropped(self.doc_id, "open", "worker_error", {"source": self.source, "detail": payload})
            for i in self.missing():
                yield self.page_drop(i, "worker_error", payload)
        attempt.deadline = next_deadline(
            kind, payload, now, attempt.deadline, self.deadline, self.config.page_timeout_s
        )


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
    failed (reasons ``timeout``, ``crash``, ``worker_killed`` — its worker died by a signal on it twice, the second
    time parsing it alone on a fresh worker —, ``backend_error``, ``render_error``, ``worker_error``, and
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
