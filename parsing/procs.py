"""Process helpers shared by the parse worker and its helper processes (no imports of the parser)."""

from __future__ import annotations

import os


def rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return 0.0


def die_with_parent(parent_pid: int | None = None) -> None:
    """Ask Linux to SIGKILL this worker when its parent dies (no orphans after a kill -9 of the pipeline).

    The kernel signals only a death that comes after the request: a helper whose parent was killed while the helper
    was still starting is already an orphan here. Given the pid of the process that started it, this one exits
    instead of waiting for work that never comes (a spawned pool process holds both ends of its call queue, so it
    never sees EOF).
    """
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # not Linux: the worker still exits on stdin EOF
        return
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)
