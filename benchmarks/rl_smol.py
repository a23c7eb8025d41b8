"""The CPU RL recipe on a real model (issue 40 §3): pass@1 before and after ``posttrain rl --config smol``, 3 seeds.

    scifolio models real real/ && python benchmarks/rl_smol.py --model real/lm --work rl-smol/     # ~2.5 h, 2 cores

Everything goes through the public CLI, with the same eval flags before and after (``--verifier numeric --n 8
--temperature 1 --max-new-tokens 16 --seed 0``; the RL reward is the same ``numeric`` check, from the one verifier
registry):

1. ``scifolio eval`` of the base model on ``test.jsonl`` (the recipe's phrasing, problems never in train) and on
   ``test-phrasings.jsonl`` (six other wordings, operands up to 40), both shipped in ``posttrain/data/smol``;
2. per seed, ``scifolio posttrain rl --config smol --set seed=S --set policy.path=MODEL`` (wall time recorded), then
   the same two evals of ``RUN/policy``.

Printed: a row per (seed, file) with pass@1 before → after and the gain, the mean gain per file, and sample outputs
of one problem before and after. ``WORK/summary.json`` keeps it all. A step whose output exists is not rerun
(``--resume`` semantics by default: delete WORK to start over). Targets: mean gain ≥ +0.30 on ``test.jsonl`` and
≥ +0.15 on ``test-phrasings.jsonl``. The weights are SmolLM2-135M-Instruct **dequantized from Q4_1**.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "posttrain" / "data" / "smol"
FILES = {"test": DATA / "test.jsonl", "phrasings": DATA / "test-phrasings.jsonl"}
EVAL_FLAGS = ["--verifier", "numeric", "--n", "8", "--k", "1,8", "--temperature", "1", "--max-new-tokens", "16"]


def scifolio(*args: str) -> float:
    """Run ``scifolio ARGS`` offline; seconds of wall time. A failure stops the benchmark with the command's output."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", *args], env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"scifolio {' '.join(args)} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
    return time.perf_counter() - t0


def evaluate(model: str, name: str, out: Path, batch: int) -> dict:
    if not out.exists():
        seconds = scifolio("eval", "--model", model, "--task", "jsonl", "--data", str(FILES[name]), *EVAL_FLAGS,
                           "--seed", "0", "--batch", str(batch), "--out", str(out), "--no-progress")  # fmt: skip
        print(f"  eval {name} of {model}: {seconds:.0f} s", flush=True)
    return json.loads(out.read_text())


def samples(result: dict, i: int = 0, k: int = 3) -> list[str]:
    problem = result["runs"][0]["problems"][i]
    return [f"{s['text']!r} ({'pass' if s['passed'] else 'fail'})" for s in problem["samples"][:k]]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the real LM directory (scifolio models real DIR writes DIR/lm)")
    p.add_argument("--work", default="rl-smol", help="output folder (runs, evals, summary.json)")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated RL seeds")
    p.add_argument("--batch", type=int, default=64, help="eval: requests decoded at once")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra recipe overrides")
    args = p.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    before = {name: evaluate(args.model, name, work / f"eval-base-{name}.json", args.batch) for name in FILES}
    rows, after = [], {}
    for seed in [int(s) for s in args.seeds.split(",")]:
        run = work / f"rl-seed{seed}"
        wall_file = run / "wall_s.txt"
        if not wall_file.exists():
            sets = [f"seed={seed}", f"policy.path={args.model}", *args.set]
            seconds = scifolio("posttrain", "rl", "--config", "smol", "--out", str(run), "--no-progress",
                               *[a for s in sets for a in ("--set", s)])  # fmt: skip
            wall_file.write_text(f"{seconds:.1f}\n")
        wall = float(wall_file.read_text())
        print(f"seed {seed}: posttrain rl --config smol {wall:.0f} s", flush=True)
        for name in FILES:
            res = evaluate(str(run / "policy"), name, work / f"eval-seed{seed}-{name}.json", args.batch)
            after[(seed, name)] = res
            b, a = before[name]["pass@1"], res["pass@1"]
            rows.append({"seed": seed, "file": name, "before": b, "after": a, "gain": a - b, "rl_wall_s": wall})
    print(f"\n{'seed':>4} {'file':<10} {'pass@1 before':>13} {'after':>7} {'gain':>7} {'rl wall s':>9}")
    for r in rows:
        print(
            f"{r['seed']:>4} {r['file']:<10} {r['before']:>13.3f} {r['after']:>7.3f} {r['gain']:>+7.3f} {r['rl_wall_s']:>9.0f}"
        )
    gains = {name: statistics.mean(r["gain"] for r in rows if r["file"] == name) for name in FILES}
    for name, target in (("test", 0.30), ("phrasings", 0.15)):
        print(f"mean gain {name}: {gains[name]:+.3f} (target ≥ +{target:.2f})")
    seed0 = min(s for s, _ in after)
    for name in FILES:
        print(f"\n{name}, problem 0 {before[name]['runs'][0]['problems'][0]['id']}: before")
        print("\n".join("  " + s for s in samples(before[name])))
        print(f"after (seed {seed0})")
        print("\n".join("  " + s for s in samples(after[(seed0, name)])))
    summary = {"rows": rows, "mean_gain": gains, "eval_flags": EVAL_FLAGS, "model": args.model}
    (work / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
