"""The parse worker: a child process that opens, validates and parses documents sent to it over a pipe.

Started by ``parsing.api.Parser`` as ``python -m parsing.worker``; never run by hand. Running the backends
in a separate process lets the parent kill a page or document that hangs the renderer (some real PDFs do)
and keeps MinerU's process pool under a proper ``__main__``. Frames are length-prefixed pickles; the
protocol uses a private copy of stdout, and fd 1 is pointed at stderr so library prints cannot corrupt it.

The worker runs the layout backend window by window, further windows of a long document in helper "lane"
processes beside it (``ParseConfig.backend_lanes``); box clean-up and crops of each window's pages run in
finisher processes while the backend parses the next windows (``parsing.helpers``). With the fused layout the
detector renders a window's pages first and runs its network on a thread while MinerU parses that window
(``core.backend_window``): MinerU keeps about one core busy, the detector the other. Before either sees a page,
a finisher has read its content and rendered it once under the page timeout (``helpers._probe``), so a page
whose render never ends is quarantined alone; a page that hangs the backend itself hangs this process, which
the parent kills (and then retries the window's pages one by one).

Messages parent -> worker: a job {"data", "source", "config", "pages", "window", "workdir", "hang"} (answered
with the messages below, ending with "done"), or {"warm": ParseConfig} (load the backend, start the helpers;
no answer).
Messages worker -> parent: ("ready", None) (backend loaded: the job's clock starts) | ("doc", Document)
| ("dropped", Dropped) | ("probe", page) (its content stream is being read here) | ("progress", page) (a helper
has read it) | ("window", [pages in flight])
| ("finishing", [pages the finishers still hold]) | ("page", Page) | ("fatal", message) | ("error", traceback)
| ("done", rss_mb).
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import sys
import time
import traceback
from collections import deque
from pathlib import Path
from typing import Any, BinaryIO

from parsing.procs import die_with_parent, rss_mb

_HEADER = struct.Struct("<Q")
TIMEOUT = object()
EOF = object()
HELPER_DIED = 70
"""The worker's exit status when one of its helper processes died (``BrokenProcessPool``): a death, as a signal."""


def write_frame(stream: BinaryIO, obj: Any) -> None:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(body)) + body)
    stream.flush()


def read_frame_blocking(stream: BinaryIO) -> Any:
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return EOF
    (n,) = _HEADER.unpack(head)
    body = stream.read(n)
    if len(body) < n:
        return EOF
    return pickle.loads(body)


class FrameReader:
    """Reads frames from a pipe fd with a deadline (select + os.read), for the parent side."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()

    def _fill(self, n: int, deadline: float) -> bool | object:
        while len(self.buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                return TIMEOUT
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                return TIMEOUT
            chunk = os.read(self.fd, max(65536, n - len(self.buf)))
            if not chunk:
                return EOF
            self.buf.extend(chunk)
        return True

    def read(self, deadline: float) -> Any:
        r = self._fill(_HEADER.size, deadline)
        if r is not True:
            return r
        (n,) = _HEADER.unpack(self.buf[: _HEADER.size])
        r = self._fill(_HEADER.size + n, deadline)
        if r is not True:
            return r
        body = bytes(self.buf[_HEADER.size : _HEADER.size + n])
        del self.buf[: _HEADER.size + n]
        return pickle.loads(body)


FINISHERS = min(2, os.cpu_count() or 1)
"""Helper processes for clean-up and crops: one overlaps the backend, both work once the backend is done."""


def run_job(job: dict[str, Any], backends: Any, send: Any, helpers: Any = None) -> float:
    """One job: a document (bytes) and the pages to parse (None = all), in windows. Returns the largest
    resident memory of a helper process in MB (0 when ``helpers`` is None: everything runs in-process)."""
    import parsing.core
    from formats.records import Dropped
    from parsing.core import _hang_if, parse_window, scan_pages, windows
    from parsing.validate import open_pdf

    config = job["config"]
    hang, kill = job.get("hang"), job.get("kill")
    parsing.core.TEST_RAISE = job.get("raise")
    # Loading the backend (a restarted worker does it here) is start-up, not the document's time: the parent's
    # page and open timeouts start counting at "ready".
    backends.get(config.backend, config.tier)
    if config.layout == "fused":
        backends.get("yolo")
    if helpers is not None:
        helpers.wait_ready()
    send(("ready", None))
    _hang_if(hang, "open")
    opened = open_pdf(job["data"], job["source"], config.limits)
    if isinstance(opened, Dropped):
        send(("dropped", opened))
        return 0.0
    document, doc = opened
    send(("doc", document))
    pages = job["pages"] if job["pages"] is not None else list(range(document.n_pages))
    # The parent owns the work directory (a killed worker cannot clean up after itself); one file per job.
    Path(job["workdir"]).mkdir(parents=True, exist_ok=True)  # e.g. a tmp cleaner removed it
    pdf_path = str(Path(job["workdir"]) / "doc.pdf")
    Path(pdf_path).write_bytes(job["data"])  # MinerU and pymupdf4llm read from a path
    size = job.get("window") or config.page_window
    try:
        if helpers is None:
            for window in windows(pages, size):
                scans = scan_pages(doc, window, config, lambda i: send(("probe", i)))
                send(("window", window))
                for rec in parse_window(doc, pdf_path, document, window, config, backends, hang, scans):
                    send(("page" if not isinstance(rec, Dropped) else "dropped", rec))
            return 0.0
        page_windows = list(windows(pages, size))
        return _pipelined(doc, pdf_path, document, page_windows, config, backends, helpers, hang, kill, send)
    finally:
        doc.close()
        Path(pdf_path).unlink(missing_ok=True)


TIMED_OUT = object()
"""What a tracked helper call resolves to when it ran past the page timeout (its process was killed)."""


class _Tracker:
    """Calls in the finisher pool, each with the time it was first seen executing; ``reap`` enforces the page
    timeout on them. A page whose call runs longer (a content stream or render that never ends) resolves to
    TIMED_OUT: the finishers are killed and restarted and the calls they held are submitted again, so the
    worker (and the backend's work on the document) lives on."""

    def __init__(self, helpers: Any, timeout_s: float) -> None:
        self.helpers = helpers
        self.timeout_s = timeout_s
        self.live: list[list[Any]] = []  # [submit, Future | TIMED_OUT, first seen executing], submission order

    def submit(self, call: Any) -> list[Any]:
        entry = [call, call(), None]
        self.live.append(entry)
        return entry

    def reap(self) -> None:
        from concurrent.futures import Future

        self.live = [e for e in self.live if isinstance(e[1], Future) and not e[1].done()]
        if not self.helpers.ready():
            return  # finishers still starting (after a restart): no page's clock runs yet
        now = time.monotonic()
        stuck = []
        # The pool hands out work in submission order: the first n unfinished calls are the ones executing.
        for e in self.live[: self.helpers.n]:
            if e[2] is None:
                e[2] = now  # the clock starts when first seen executing, never earlier than the call did
            elif now - e[2] > self.timeout_s:
                stuck.append(e)
        if not stuck:
            return
        self.helpers.restart_finishers()
        for e in self.live:
            if any(e is s for s in stuck):
                e[1] = TIMED_OUT
            elif not e[1].done() or e[1].cancelled() or e[1].exception() is not None:
                e[1], e[2] = e[0](), None  # lost with the killed finishers
        self.live = [e for e in self.live if e[1] is not TIMED_OUT]

    def done(self, entry: list[Any]) -> bool:
        return entry[1] is TIMED_OUT or entry[1].done()

    def wait(self, entry: list[Any]) -> Any:
        """The call's (result, rss_mb), or TIMED_OUT."""
        from concurrent.futures import wait

        while not self.done(entry):
            self.reap()
            if not self.done(entry):
                wait([entry[1]], timeout=0.25)
        return entry[1] if entry[1] is TIMED_OUT else entry[1].result()


def _pipelined(
    doc: Any,
    pdf_path: str,
    document: Any,
    page_windows: list[list[int]],
    config: Any,
    backends: Any,
    helpers: Any,
    hang: str | None,
    kill: str | None,
    send: Any,
) -> float:
    """Windows go to the backend in groups of ``1 + config.backend_lanes``, the first here, the others in the
    helpers' lanes; the finishers clean up and crop each window's pages while the backend parses the next
    group. Records go out in page order.

    Every page is first probed (``helpers._probe``: one render as the layout detector makes it, and
    ``core.is_scanned``, which reads the page's whole content stream) in a finisher, and finished (clean-up,
    crops, renders) in one, both under the page timeout (``_Tracker``): a page whose content or render never
    ends costs the page timeout plus a restart of the finishers, and never reaches the backend or the
    detector's render on this process's thread. The parent's own deadlines only catch what hangs in this process (the backend itself)."""
    from concurrent.futures.process import BrokenProcessPool

    from formats.records import Dropped, page_id
    from parsing.core import backend_window

    tracker = _Tracker(helpers, config.page_timeout_s)
    outbox: deque[tuple[int, Any]] = deque()  # (page, tracker entry | Dropped) in page order
    peak = 0.0

    def timeout_drop(i: int, where: str) -> Dropped:
        return Dropped(
            page_id(document.doc_id, i),
            "parse",
            "timeout",
            {"source": document.source, "detail": f"page exceeded page_timeout_s={config.page_timeout_s} ({where})"},
        )

    def resolved(entry: list[Any], i: int, where: str) -> Any:
        nonlocal peak
        out = tracker.wait(entry)
        if out is TIMED_OUT:
            return timeout_drop(i, where)
        value, rss = out
        peak = max(peak, rss)
        return value

    def enqueue(parsed: list[tuple[int, Any]]) -> None:
        for i, r in parsed:
            if not isinstance(r, Dropped):
                r = tracker.submit(lambda i=i, r=r: helpers.finish(i, r, config, hang))
            outbox.append((i, r))

    def emit(block: bool) -> None:
        while outbox:
            i, item = outbox[0]
            if not isinstance(item, Dropped):
                if not block and not tracker.done(item):
                    tracker.reap()
                    return
                item = resolved(item, i, "rendering it")
            outbox.popleft()
            send(("dropped" if isinstance(item, Dropped) else "page", item))

    def probe(window: list[int]) -> tuple[set[int], list[tuple[int, Dropped]]]:
        """Scanned pages of ``window`` and a timeout Dropped for each page whose content or render never ends."""
        entries = [(i, tracker.submit(lambda i=i: helpers.probe(i, config.ocr_fallback))) for i in window]
        scans, hung = set(), []
        for i, entry in entries:
            r = resolved(entry, i, "reading and rendering it")
            if isinstance(r, Dropped):
                hung.append((i, r))
            elif r:
                scans.add(i)
            send(("progress", i))
            emit(block=False)
        return scans, hung

    helpers.open(pdf_path, document)
    try:
        group = 1 + config.backend_lanes
        for k in range(0, len(page_windows), group):
            # Every page of the group is probed first (content read, one render), so that no backend, here or in a
            # lane, meets a page that hangs: those are quarantined by the finishers' page timeout.
            probed = []
            for w in page_windows[k : k + group]:
                scans, hung = probe(w)
                probed.append(([i for i in w if i not in dict(hung)], scans, hung))
            (mine, scans, hung), *others = probed
            lanes = [(helpers.backend(w, config, s) if w else None, h) for w, s, h in others]
            # The parent's deadline covers the pages the finishers still hold plus this group's windows.
            send(("window", [i for i, _ in outbox] + [i for w, _, _ in probed for i in w]))
            _kill_if(kill, [i for w, _, _ in probed for i in w])
            parsed = backend_window(doc, pdf_path, document, mine, config, backends, scans) if mine else []
            enqueue(sorted(parsed + hung, key=lambda x: x[0]))
            emit(block=False)
            for lane, hung in lanes:
                parsed = []
                if lane is not None:
                    parsed, rss = lane.result()
                    peak = max(peak, rss)
                enqueue(sorted(parsed + hung, key=lambda x: x[0]))
                emit(block=False)
        send(("finishing", [i for i, _ in outbox]))
        emit(block=True)
    except BrokenProcessPool:  # a helper died (e.g. MuPDF crashed on a page): crash as the worker would have
        sys.stderr.write(traceback.format_exc(limit=4))
        sys.stderr.flush()
        os._exit(HELPER_DIED)  # the parent sees EOF and retries the pages in flight one by one
    finally:
        for _, item in outbox:  # only after an error: do not finish pages nobody will read
            if isinstance(item, list) and item[1] is not TIMED_OUT:
                item[1].cancel()
    return peak


def _kill_if(hook: str | None, pages: list[int]) -> None:
    """Test hook (``api.TEST_KILL_ENV``, ``N:MARKER``): SIGKILL this process once when ``pages`` hold page N
    (every time when MARKER is empty)."""
    if hook:
        page, marker = hook.split(":", 1)
        if int(page) in pages and not (marker and Path(marker).exists()):
            if marker:
                Path(marker).touch()
            os.kill(os.getpid(), 9)


def warm(config: Any, backends: Any, helpers: Any) -> None:
    """Load the backend and start the helpers before the first document arrives (the parent meanwhile
    loads its tokenizer). Failures are left for the first job to report."""
    try:
        backend = backends.get(config.backend, config.tier)
        if config.layout == "fused":
            backends.get("yolo")
        if hasattr(backend, "warm"):
            backend.warm()
        helpers.warm()
    except Exception:
        traceback.print_exc(limit=4)


def main() -> int:
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed by libraries goes to the worker log, not into the protocol
    proto_in = sys.stdin.buffer
    die_with_parent()

    from parsing.backends import BackendUnavailable, ensure_mineru_env
    from parsing.core import BackendSet
    from parsing.helpers import Helpers

    ensure_mineru_env()
    backends = BackendSet()
    helpers = Helpers(FINISHERS)

    def send(msg: Any) -> None:
        write_frame(proto_out, msg)

    try:
        while True:
            job = read_frame_blocking(proto_in)
            if job is EOF:
                return 0
            if "warm" in job:
                warm(job["warm"], backends, helpers)
                continue
            helper_rss = 0.0
            try:
                helper_rss = run_job(job, backends, send, helpers)
            except BackendUnavailable as exc:
                send(("fatal", str(exc)))
            except Exception:
                send(("error", traceback.format_exc(limit=8)[-4000:]))
            send(("done", max(rss_mb(), helper_rss)))
    finally:
        helpers.close()


if __name__ == "__main__":
    sys.exit(main())
