"""Process helpers shared by the parse worker and its helper processes (no imports of the parser)."""

from __future__ import annotations

import os


def rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return 0.0


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this worker when its parent dies (no orphans after a kill -9 of the pipeline)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # not Linux: the worker still exits on stdin EOF
        pass
