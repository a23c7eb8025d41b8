"""The RL driver's semantics at full debug length, side by side (the long variants of tests/posttrain/rl/test_driver.py).

    python benchmarks/rl_semantics.py            # ~3 debug runs of 60 steps on 2 cores

1. fp32 + AdamW (the default) vs bfloat16 engine + Muon learner: reward of the last 10 steps minus the first 10.
2. Strong drift (lr 1e-2, 4 minibatches, partial rollout): the BKL mask at matched weights vs ``clip_fraction``.
Prints one line per run and the wall time; the numbers go to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from formats.overrides import with_overrides  # noqa: E402
from posttrain.rl.loop import run  # noqa: E402
from posttrain.rl.recipes import debug  # noqa: E402

RUNS = {
    "fp32 + adamw": {},
    "bf16 engine + muon": {"policy.dtype": "bfloat16", "learner.optimizer": "muon"},
    "drift: lr 1e-2, 4 minibatches": {"learner.lr": "0.01", "learner.n_minibatches": "4"},
}


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def main() -> int:
    for name, sets in RUNS.items():
        with tempfile.TemporaryDirectory() as out:
            t0 = time.perf_counter()
            rows = run(with_overrides(debug(), sets), out, progress=False)
            wall = time.perf_counter() - t0
        gain = mean([r["reward"] for r in rows[-10:]]) - mean([r["reward"] for r in rows[:10]])
        bkl = [r["bkl_masked_fraction"] for r in rows]
        clip = [r["clip_fraction"] for r in rows]
        lag = sum(1 for r in rows if r["max_lag"] >= 1)
        print(
            f"{name:32s} steps {len(rows)}  reward gain (last10-first10) {gain:+.3f}  "
            f"bkl_masked mean {100 * mean(bkl):.3f}% max {100 * max(bkl):.3f}%  "
            f"clip_fraction mean {mean(clip):.3f} (>0 on {sum(c > 0 for c in clip)} steps)  "
            f"steps with lag>=1: {lag}  matched mismatch max {max(r['matched_mismatch_abs_max'] for r in rows):.2e}  "
            f"wall {wall:.0f}s",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
