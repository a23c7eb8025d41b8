"""The import contracts of .importlinter hold on this tree, and they bite: a forbidden import added to a copy
of the tree makes ``lint-imports`` fail."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("formats", "parsing", "visual_gain", "retrieval", "pretrain", "posttrain", "pipelines")
LINT = Path(sys.executable).with_name("lint-imports")


def _copy_tree(dst: Path) -> Path:
    for name in PACKAGES:
        shutil.copytree(ROOT / name, dst / name, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(ROOT / ".importlinter", dst / ".importlinter")
    return dst


def _lint(tree: Path) -> subprocess.CompletedProcess:
    # PYTHONPATH=tree first: grimp must analyse the copy, not the installed checkout.
    return subprocess.run(
        [str(LINT), "--no-cache"],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_contracts_hold_on_this_tree():
    r = _lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "BROKEN" not in r.stdout and r.stdout.count("KEPT") == 6


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("retrieval/weights.py", "from pipelines.report import svg_histogram", "Layers"),  # area → higher layer
        ("pretrain/data.py", "import retrieval.index", "Layers"),  # area → another area
        ("formats/records.py", "import parsing.geometry", "formats imports nothing"),
        ("parsing/core.py", "import apache_beam", "Beam is imported only"),
        ("posttrain/objectives/advantages.py", "import ray", "Ray is imported only"),
        ("parsing/geometry.py", "import parsing.core", "No import loops"),  # core imports geometry: a loop
        ("posttrain/objectives/r3.py", "import posttrain.rl.learner", "posttrain.objectives is a torch-only leaf"),
    ],
)
def test_a_forbidden_import_fails_lint(tmp_path: Path, module: str, line: str, contract: str):
    tree = _copy_tree(tmp_path)
    path = tree / module
    path.write_text(path.read_text() + f"\n{line}  # noqa\n")
    r = _lint(tree)
    assert r.returncode != 0, r.stdout
    broken = r.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, r.stdout[-2000:]
