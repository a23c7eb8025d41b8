"""Dead letters on disk: ``OUT/quarantine/<stage>.jsonl``, one ``Dropped.to_row()`` JSON object per line, sorted.

from formats.quarantine import iter_quarantine
for d in iter_quarantine("out/quarantine"):
    print(d.stage, d.reason, d.item_id)
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from formats import fs
from formats.records import Dropped


def write_quarantine(
    directory: str | os.PathLike[str], stage: str, rows: Iterable[Mapping[str, Any]]
) -> dict[str, Any]:
    """All dead letters of one stage, sorted (so the file is a function of the set), committed whole."""
    lines = sorted(json.dumps(dict(r), sort_keys=True) for r in rows)
    fs.write_text(fs.join(directory, f"{stage}.jsonl"), "".join(line + "\n" for line in lines))
    return {"stage": stage, "file": f"{stage}.jsonl", "count": len(lines)}


def quarantine_files(directory: str | os.PathLike[str]) -> list[str]:
    return [p for p in fs.glob(fs.join(directory, "*.jsonl")) if not os.path.basename(p).startswith(".")]


def iter_quarantine(directory: str | os.PathLike[str]) -> Iterator[Dropped]:
    for path in quarantine_files(directory):
        for line in fs.read_text(path).splitlines():
            if line.strip():
                yield Dropped.from_row(json.loads(line))
