"""One filesystem layer for every output and every cross-area read: local paths and fsspec URLs alike.

    from formats import fs
    fs.write_text("s3://bucket/out/manifest.json", text)      # committed whole, or not at all
    fs.read_text("out/manifest.json")

Local paths commit by writing a temporary sibling and renaming it over the target (atomic on POSIX). Object
stores have no atomic rename; there the object itself is written whole by one PUT, which readers see either
entirely or not at all, and callers that need "finished" semantics for a group of files write a marker last.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import IO, Any

import fsspec


def is_url(path: str | os.PathLike[str]) -> bool:
    return "://" in str(path)


def split(path: str | os.PathLike[str]) -> tuple[Any, str]:
    """(fsspec filesystem, path inside it)."""
    return fsspec.core.url_to_fs(str(path))


def join(base: str | os.PathLike[str], *parts: str) -> str:
    """Join path segments with ``/`` for URLs and the OS separator locally."""
    base = str(base)
    if is_url(base):
        return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])
    return os.path.join(base, *parts)


def exists(path: str | os.PathLike[str]) -> bool:
    fs, p = split(path)
    return fs.exists(p)


def makedirs(path: str | os.PathLike[str]) -> None:
    fs, p = split(path)
    fs.makedirs(p, exist_ok=True)


def glob(pattern: str) -> list[str]:
    """Sorted matches, in the caller's notation (a URL pattern gives URLs back)."""
    fs, p = split(pattern)
    found = sorted(fs.glob(p))
    if is_url(pattern):
        return [fs.unstrip_protocol(f) for f in found]
    return found


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    with fsspec.open(str(path), "rb") as f:
        return f.read()


def read_text(path: str | os.PathLike[str]) -> str:
    return read_bytes(path).decode("utf-8")


def read_jsonl(path: str | os.PathLike[str]) -> list[Any]:
    """One JSON value per non-blank line; a line that is not JSON raises ``ValueError`` naming ``path:line``."""
    rows = []
    for n, line in enumerate(read_text(path).splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON: {e}") from e
    return rows


def open_input(path: str | os.PathLike[str]) -> Any:
    """A binary file object for reading (a context manager)."""
    return fsspec.open(str(path), "rb")


@contextmanager
def open_output(path: str | os.PathLike[str]) -> Iterator[IO[bytes]]:
    """Write ``path`` so that readers never see a partial file: local = temporary sibling + rename."""
    path = str(path)
    if is_url(path):
        fs, p = split(path)
        with fs.open(p, "wb") as f:
            yield f
        return
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            yield f
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def commit(tmp: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Move a finished local file that a library wrote at ``tmp`` (a parquet writer, ``save_pretrained``) over
    ``path`` in one rename. The one place outside ``open_output`` that renames (``make lint`` checks it)."""
    os.replace(tmp, path)


def swap_dir(tmp: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Put a finished directory ``tmp`` in place of ``path``: the old one is renamed aside first and removed
    only after the new one is in place, so a crash leaves one complete directory (``path`` or ``path.old``)."""
    import shutil

    path = os.fspath(path)
    old = path + ".old"
    if os.path.exists(path):
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with open_output(path) as f:
        f.write(data)


def write_text(path: str | os.PathLike[str], text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_jsonl(path: str | os.PathLike[str], rows: Iterable[Any]) -> None:
    """``rows`` one JSON value a line, committed whole like ``write_text``."""
    write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


def remove(path: str | os.PathLike[str]) -> None:
    fs, p = split(path)
    if fs.exists(p):
        fs.rm(p)


def size(path: str | os.PathLike[str]) -> int:
    fs, p = split(path)
    return int(fs.size(p))
