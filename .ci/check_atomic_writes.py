"""`make lint`: every write-and-rename goes through ``formats.fs`` (``open_output``, ``commit``, ``swap_dir``).

Flags ``os.replace``/``os.rename`` calls and one-argument ``.replace(x)``/``.rename(x)`` method calls (``Path``'s:
``str.replace`` takes two arguments, ``dataclasses.replace`` keywords) outside ``formats/``. The native kernel's
build cache (``posttrain/objectives/native``) keeps its own rename: it runs before any project I/O exists.

    python .ci/check_atomic_writes.py       # exit 1 and list offenders
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AREAS = ("parsing", "visual_gain", "retrieval", "pretrain", "posttrain", "pipelines", "benchmarks")
ALLOWED = ("posttrain/objectives/native/",)


def offenders(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(), str(path))
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        name, owner = node.func.attr, node.func.value
        if name not in ("replace", "rename"):
            continue
        if isinstance(owner, ast.Name) and owner.id == "os":
            lines.append(node.lineno)
        elif isinstance(owner, ast.Name) and owner.id == "dataclasses":
            continue
        elif len(node.args) == 1 and not node.keywords and not isinstance(owner, ast.Constant):
            lines.append(node.lineno)
    return lines


def scan(find: Callable[[Path], list[int]], allowed: tuple[str, ...], why: str) -> int:
    """Print ``PATH:LINE: why`` for every line ``find`` flags in the areas' Python files outside ``allowed``
    (path prefixes); 1 when there is one (``.ci/check_backward.py`` scans with it too)."""
    bad = []
    for area in AREAS:
        for path in sorted((ROOT / area).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(allowed):
                continue
            bad += [f"{rel}:{n}" for n in find(path)]
    for b in bad:
        print(f"{b}: {why}")
    return 1 if bad else 0


def main() -> int:
    return scan(offenders, ALLOWED, "rename outside formats/: use formats.fs (open_output, commit, swap_dir)")


if __name__ == "__main__":
    sys.exit(main())
