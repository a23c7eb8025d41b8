"""OREAL-H debug run of the lemma agent, and its two ablations with the same seeds (issue 23, item 5).

    PYTHONPATH=. nice python benchmarks/lemma_train.py --json benchmarks/results/lemma_train.json
    PYTHONPATH=. nice python benchmarks/lemma_train.py --arm ratio --torch-threads 1 --out /tmp/lemma_bench  # one arm

Arms (``posttrain.lemma.train.with_ablation``): ``full`` (centred conjugate reward + lemma-graph credit),
``ratio`` (raw pass ratio k/n as the final reward), ``no_graph`` (graph credit off: every unmasked round gets the
final reward). Each arm is ``scifolio posttrain lemma train --config debug`` (cold-start BC on the scripted
reasoner, then RL on the tiny policy) in its own run directory; the arms share every seed, so their cold starts and
first rollouts are identical. Reported per arm: the mean ``reward`` of the first and last 10 steps (the arm's own
reward), the same for the centred conjugate reward (``reward_conjugate``, comparable across arms) and for the
solve rate against the reference. Target (issue 23): last 10 ≥ first 10 + 0.1.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from posttrain.lemma.train import debug, run, with_ablation

ARMS = ("full", "ratio", "no_graph")


def summarise(rows: list[dict], window: int) -> dict[str, Any]:
    rl = [r for r in rows if r.get("step", 0) >= 1]
    out: dict[str, Any] = {"steps": len(rl)}
    w = min(window, len(rl) // 2) or 1
    for k in ("reward", "reward_conjugate", "solved", "accepted_per_round", "uncertain_per_round", "masked_rounds"):
        first = [r[k] for r in rl[:w]]
        last = [r[k] for r in rl[-w:]]
        out[f"{k}_first"] = sum(first) / len(first)
        out[f"{k}_last"] = sum(last) / len(last)
        out[f"{k}_gain"] = out[f"{k}_last"] - out[f"{k}_first"]
    # consecutive blocks of `window` steps: a steady climb and the recovery from an early dip read differently
    blocks = [[r["reward"] for r in rl[i : i + w]] for i in range(0, len(rl), w)]
    out["reward_blocks"] = [sum(b) / len(b) for b in blocks]
    out["skipped_updates"] = sum(r.get("skipped_update", 0) for r in rl)
    out["rl_s"] = sum(r.get("rollout_s", 0) + r.get("train_s", 0) for r in rl)  # RL steps only, not the cold start
    bc = next((r for r in rows if r.get("step") == 0), {})
    for k in ("bc_loss_last", "bc_epochs", "bc_updates"):
        if k in bc:
            out[k] = bc[k]
    return out


def read_rows(out: Path) -> list[dict]:
    p = out / "metrics.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.exists() else []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arm", action="append", choices=ARMS, help="arms to run (default: all three)")
    ap.add_argument("--steps", type=int, default=None, help="learner steps (default: the debug recipe's)")
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument(
        "--seed", type=int, default=None, help="run seed (policy init, sampling, verifier; the questions stay the same)"
    )
    ap.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="torch threads per arm (default: the recipe's; 1 when the "
        "three arms run as parallel processes on 2 cores, which otherwise oversubscribe them ~3x)",
    )
    ap.add_argument("--out", default="/tmp/lemma_train_bench")
    ap.add_argument("--report-only", action="store_true", help="summarise existing run directories, run nothing")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    results = {}
    for arm in a.arm or ARMS:
        out = Path(a.out) / arm
        t0 = time.time()
        if not a.report_only:
            cfg = debug() if a.steps is None else replace(debug(), steps=a.steps)
            if a.torch_threads is not None:
                cfg = replace(cfg, torch_threads=a.torch_threads)
            if a.seed is not None:
                cfg = replace(cfg, seed=a.seed, policy=replace(cfg.policy, seed=a.seed))
            run(with_ablation(cfg, arm), str(out), progress=False)
            (out / "wall_s").write_text(f"{time.time() - t0:.1f}\n")  # so --report-only reports the run's, not its own
        rows = read_rows(out)
        s = summarise(rows, a.window)
        s["wall_s"] = float((out / "wall_s").read_text()) if (out / "wall_s").exists() else float("nan")
        results[arm] = s
    print(
        "arm       steps  reward first→last (gain)  conjugate first→last  solved first→last  accepted/round  "
        "uncertain/round  masked rounds  skipped updates  RL s  wall_s"
    )
    for arm, s in results.items():
        print(
            f"{arm:<9} {s['steps']:>5}  {s['reward_first']:.3f}→{s['reward_last']:.3f} ({s['reward_gain']:+.3f})"
            f"   {s['reward_conjugate_first']:.3f}→{s['reward_conjugate_last']:.3f}"
            f"           {s['solved_first']:.3f}→{s['solved_last']:.3f}"
            f"        {s['accepted_per_round_first']:.2f}→{s['accepted_per_round_last']:.2f}"
            f"       {s['uncertain_per_round_first']:.2f}→{s['uncertain_per_round_last']:.2f}"
            f"        {s['masked_rounds_first']:.2f}→{s['masked_rounds_last']:.2f}"
            f"      {s['skipped_updates']:>3}          {s['rl_s']:.0f}  {s['wall_s']:.0f}"
        )
    for arm, s in results.items():
        print(f"{arm:<9} reward per {a.window} steps: " + " ".join(f"{b:.3f}" for b in s["reward_blocks"]))
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
