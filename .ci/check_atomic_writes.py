"""`make lint`: every write-and-rename goes through ``formats.fs`` (``open_output``, ``commit``, ``swap_dir``).

Flags ``os.replace``/``os.rename`` calls and one-argument ``.replace(x)``/``.rename(x)`` method calls (``Path``'s:
``str.replace`` takes two arguments, ``dataclasses.replace`` keywords) outside ``formats/``. The native kernel's
build cache (``posttrain/objectives/native``) keeps its own rename: it runs before any project I/O exists.

    python .ci/check_atomic_writes.py       # exit 1 and list offenders
"""

from __future__ import annotations

import ast
import sys
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


def main() -> int:
    bad = []
    for area in AREAS:
        for path in sorted((ROOT / area).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(ALLOWED):
                continue
            bad += [f"{rel}:{n}" for n in offenders(path)]
    for b in bad:
        print(f"{b}: rename outside formats/: use formats.fs (open_output, commit, swap_dir)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
