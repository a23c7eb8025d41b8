"""Agentic RL rollout time: sessions one at a time vs concurrent vs concurrent with partial rollout (issue 34).

Runs ``posttrain agentic``'s debug recipe (2 built-in coding tasks × groups of 4 sessions, the scripted agent, real
jailed test runs and grading) for ``--steps`` learner steps in three modes, in turns, and prints the seconds per
step (collect + train) of each and the ratios to the first:

- ``serial``: ``max_sessions=1, partial=false``: one session at a time (what the stage did before partial rollout);
- ``sync``: ``max_sessions=8, partial=false``: a step's sessions at once, none in flight across an update;
- ``partial``: ``max_sessions=8, partial=true``: later groups start as slots free and run across the update.

The scripted agent has no model, so ``--step-ms`` gives its engine a cost per decode step (batched over every running
request, like a real engine's step). The first step of each run is excluded (start-up).

    PYTHONPATH=. python benchmarks/agentic_rollout.py [--steps 5] [--step-ms 5] [--repeats 2]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
from pathlib import Path

MODES = {
    "serial": dict(max_sessions=1, partial=False),
    "sync": dict(max_sessions=8, partial=False),
    "partial": dict(max_sessions=8, partial=True),
}


def run_mode(mode: str, steps: int, out: Path) -> list[dict]:
    from posttrain.agentic.rl import AgenticConfig, run_agentic

    run_agentic(AgenticConfig(steps=steps, **MODES[mode]), out)
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--step-ms", type=float, default=5.0, help="the scripted engine's cost per decode step")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each mode, in turns")
    args = ap.parse_args()

    from posttrain.rollout.engines import scripted

    scripted.ScriptedTokenEngine = functools.partial(scripted.ScriptedTokenEngine, step_delay_s=args.step_ms / 1e3)
    per_step: dict[str, list[float]] = {m: [] for m in MODES}
    extra: dict[str, list[dict]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for mode in MODES:
                rows = run_mode(mode, args.steps, Path(tmp) / f"{mode}{rep}")[1:]
                s = [r["rollout_s"] + r["train_s"] for r in rows]
                per_step[mode] += s
                extra[mode] += rows
                print(f"{mode:8s} run {rep}: {statistics.mean(s):.2f} s/step over {len(s)} steps", flush=True)
    base = statistics.median(per_step["serial"])
    for mode in MODES:
        med = statistics.median(per_step[mode])
        rows = extra[mode]
        print(
            f"{mode:8s} median {med:.2f} s/step  speed-up vs serial {base / med:.2f}x  "
            f"reward {statistics.mean(r['reward'] for r in rows):.3f}  "
            f"sessions in flight at the update {statistics.mean(r['sessions_in_flight'] for r in rows):.1f}  "
            f"old-version tokens {sum(r['old_version_tokens'] for r in rows)}"
        )
    print(f"speedup: {base / statistics.median(per_step['partial']):.2f}")


if __name__ == "__main__":
    main()
