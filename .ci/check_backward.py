"""`make lint`: gradients flow through a few places only. ``.backward(`` calls (read on the AST, not in comments or
strings) stand in the RL learner (``posttrain/rl/learner.py``), ``posttrain.fit.fit`` (every supervised loop of
post-training) and pre-training's train steps (``pretrain/``), plus the exceptions below, each with its reason.

    python .ci/check_backward.py       # exit 1 and list offenders
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AREAS = ("parsing", "visual_gain", "retrieval", "pretrain", "posttrain", "pipelines", "formats", "benchmarks")
ALLOWED = ("posttrain/rl/learner.py", "posttrain/fit.py", "pretrain/")
EXCEPTIONS = {
    "posttrain/sft.py": "DeepSpeed's engine.backward (ZeRO); not on fit() yet",
    "benchmarks/pretrain_step.py": "times pre-training's step itself",
    "benchmarks/rl_math.py": "times the Eq 29 loss's backward itself",
    "benchmarks/rollout_real.py": "a bare forward/backward step, the baseline the learner is timed against",
}


def offenders(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(), str(path))
    return [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "backward"
    ]


def main() -> int:
    bad = []
    for area in AREAS:
        for path in sorted((ROOT / area).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(ALLOWED) or rel in EXCEPTIONS:
                continue
            bad += [f"{rel}:{line}" for line in offenders(path)]
    for b in bad:
        print(f"{b}: .backward( outside the RL learner, posttrain.fit and pre-training (use posttrain.fit.fit)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
