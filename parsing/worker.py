"""The parse worker: a child process that opens, validates and parses documents sent to it over a pipe.

Started by ``parsing.api.Parser`` as ``python -m parsing.worker``; never run by hand. Running the backends
in a separate process lets the parent kill a page or document that hangs the renderer (some real PDFs do)
and keeps MinerU's process pool under a proper ``__main__``. Frames are length-prefixed pickles; the
protocol uses a private copy of stdout, and fd 1 is pointed at stderr so library prints cannot corrupt it.

Messages worker -> parent: ("doc", Document) | ("dropped", Dropped) | ("window", [pages]) | ("page", Page)
| ("fatal", message) | ("error", traceback) | ("done", rss_mb).
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import sys
import time
import traceback
from pathlib import Path
from typing import Any, BinaryIO

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


def rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return 0.0


def run_job(job: dict[str, Any], backends: Any, send: Any) -> None:
    """One job: a document (bytes) and the pages to parse (None = all), in windows."""
    from parsing.core import _hang_if, parse_window, windows
    from parsing.records import Dropped
    from parsing.validate import open_pdf

    config = job["config"]
    hang = job.get("hang")
    _hang_if(hang, "open")
    opened = open_pdf(job["data"], job["source"], config.limits)
    if isinstance(opened, Dropped):
        send(("dropped", opened))
        return
    document, doc = opened
    send(("doc", document))
    pages = job["pages"] if job["pages"] is not None else list(range(document.n_pages))
    # The parent owns the work directory (a killed worker cannot clean up after itself); one file per job.
    Path(job["workdir"]).mkdir(parents=True, exist_ok=True)  # e.g. a tmp cleaner removed it
    pdf_path = str(Path(job["workdir"]) / "doc.pdf")
    Path(pdf_path).write_bytes(job["data"])  # MinerU and pymupdf4llm read from a path
    try:
        for window in windows(pages, job.get("window") or config.page_window):
            send(("window", window))
            for rec in parse_window(doc, pdf_path, document, window, config, backends, hang):
                send(("page" if not isinstance(rec, Dropped) else "dropped", rec))
    finally:
        doc.close()
        Path(pdf_path).unlink(missing_ok=True)


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this worker when its parent dies (no orphans after a kill -9 of the pipeline)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # not Linux: the worker still exits on stdin EOF
        pass


def main() -> int:
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed by libraries goes to the worker log, not into the protocol
    proto_in = sys.stdin.buffer
    _die_with_parent()

    from parsing.backends import BackendUnavailable, ensure_mineru_env
    from parsing.core import BackendSet

    ensure_mineru_env()
    backends = BackendSet()

    def send(msg: Any) -> None:
        write_frame(proto_out, msg)

    while True:
        job = read_frame_blocking(proto_in)
        if job is EOF:
            return 0
        try:
            run_job(job, backends, send)
        except BackendUnavailable as exc:
            send(("fatal", str(exc)))
        except Exception:
            send(("error", traceback.format_exc(limit=8)[-4000:]))
        send(("done", rss_mb()))


if __name__ == "__main__":
    sys.exit(main())
