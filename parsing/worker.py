"""The parse worker: a child process that opens, validates and parses documents sent to it over a pipe.

Started by ``parsing.api.Parser`` as ``python -m parsing.worker``; never run by hand. Running the backends
in a separate process lets the parent kill a page or document that hangs the renderer (some real PDFs do)
and keeps MinerU's process pool under a proper ``__main__``. Frames are length-prefixed pickles; the
protocol uses a private copy of stdout, and fd 1 is pointed at stderr so library prints cannot corrupt it.

The worker runs the layout backend window by window, further windows of a long document in helper "lane"
processes beside it (``ParseConfig.backend_lanes``); box clean-up and crops of each window's pages run in
finisher processes while the backend parses the next windows (``parsing.helpers``).

Messages parent -> worker: a job {"data", "source", "config", "pages", "window", "workdir", "hang"} (answered
with the messages below, ending with "done"), or {"warm": ParseConfig} (load the backend, start the helpers;
no answer).
Messages worker -> parent: ("doc", Document) | ("dropped", Dropped) | ("window", [pages in flight])
| ("page", Page) | ("fatal", message) | ("error", traceback) | ("done", rss_mb).
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
    from formats.records import Dropped
    from parsing.core import _hang_if, parse_window, windows
    from parsing.validate import open_pdf

    config = job["config"]
    hang = job.get("hang")
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
                send(("window", window))
                for rec in parse_window(doc, pdf_path, document, window, config, backends, hang):
                    send(("page" if not isinstance(rec, Dropped) else "dropped", rec))
            return 0.0
        return _pipelined(doc, pdf_path, document, list(windows(pages, size)), config, backends, helpers, hang, send)
    finally:
        doc.close()
        Path(pdf_path).unlink(missing_ok=True)


def _pipelined(
    doc: Any,
    pdf_path: str,
    document: Any,
    page_windows: list[list[int]],
    config: Any,
    backends: Any,
    helpers: Any,
    hang: str | None,
    send: Any,
) -> float:
    """Windows go to the backend in groups of ``1 + config.backend_lanes``, the first here, the others in the
    helpers' lanes; the finishers clean up and crop each window's pages while the backend parses the next
    group. Records go out in page order."""
    from concurrent.futures import Future
    from concurrent.futures.process import BrokenProcessPool

    from formats.records import Dropped
    from parsing.core import backend_window

    outbox: deque[tuple[int, Any]] = deque()  # (page, Future | Dropped) in page order
    peak = 0.0

    def result(fut: Future[Any]) -> Any:
        nonlocal peak
        value, rss = fut.result()
        peak = max(peak, rss)
        return value

    def enqueue(parsed: list[tuple[int, Any]]) -> None:
        for i, r in parsed:
            outbox.append((i, r if isinstance(r, Dropped) else helpers.finish(i, r, config, hang)))

    def emit(block: bool) -> None:
        while outbox:
            _, item = outbox[0]
            if isinstance(item, Future):
                if not block and not item.done():
                    return
                item = result(item)
            outbox.popleft()
            send(("dropped" if isinstance(item, Dropped) else "page", item))

    helpers.open(pdf_path, document)
    try:
        group = 1 + config.backend_lanes
        for k in range(0, len(page_windows), group):
            mine, *others = page_windows[k : k + group]
            lanes = [helpers.backend(w, config) for w in others]
            # The parent's deadline covers the pages the finishers still hold plus this group's windows.
            send(("window", [i for i, _ in outbox] + [i for w in (mine, *others) for i in w]))
            enqueue(backend_window(doc, pdf_path, document, mine, config, backends))
            emit(block=False)
            for lane in lanes:
                enqueue(result(lane))
                emit(block=False)
        emit(block=True)
    except BrokenProcessPool:  # a helper died (e.g. MuPDF crashed on a page): crash as the worker would have
        sys.stderr.write(traceback.format_exc(limit=4))
        sys.stderr.flush()
        os._exit(70)  # the parent sees EOF and retries the pages in flight one by one
    finally:
        for _, item in outbox:  # only after an error: do not finish pages nobody will read
            if isinstance(item, Future):
                item.cancel()
    return peak


def warm(config: Any, backends: Any, helpers: Any) -> None:
    """Load the backend and start the helpers before the first document arrives (the parent meanwhile
    loads its tokenizer). Failures are left for the first job to report."""
    try:
        backend = backends.get(config.backend, config.tier)
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
