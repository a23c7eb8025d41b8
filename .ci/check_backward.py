"""`make lint`: gradients flow through a few places only. ``.backward(`` calls (read on the AST, not in comments or
strings) stand in ``posttrain.fit.fit`` (the RL learner's minibatch steps and every supervised loop of
post-training) and pre-training's train steps (``pretrain/``), plus the exceptions below, each with its reason.

    python .ci/check_backward.py       # exit 1 and list offenders
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from check_atomic_writes import scan  # noqa: E402  (the one walk over the areas)

ALLOWED = ("posttrain/fit.py", "pretrain/")
EXCEPTIONS = {
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
    why = ".backward( outside the RL learner, posttrain.fit and pre-training (use posttrain.fit.fit)"
    return scan(offenders, (*ALLOWED, *EXCEPTIONS), why)


if __name__ == "__main__":
    sys.exit(main())
