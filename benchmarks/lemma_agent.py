"""Multi-round lemma agent with memory vs one round with the same total token budget (issue 23, SPEC §D).

    python benchmarks/lemma_agent.py                       # 100 test problems of 6 steps, p_correct 0.7/0.8/0.9
    python benchmarks/lemma_agent.py --n 40 --p 0.8 --steps 4 --json out.json

The policy is the scripted reasoner of ``posttrain/lemma/scripted.py`` (every derived step right with probability
``p_correct``, a slip gives a plausible wrong value that later steps build on; each step costs
``tokens_per_step`` tokens) on a ``ScriptedTokenEngine``, so every call goes through the real agent, parser,
verifier and engine. Arms, on the same fixed-seed test split:

- ``multi+memory (noisy)``: 8 reasoning rounds of ≤ 2 steps + 8 revision rounds, lemmas and answers checked by
  the noisy verifier at the report's P 0.931 / R 0.818 (base rate 1/2), n = 4 checks, accepted iff > 1/4;
- ``multi+memory (formal)``: the same with the exact sympy / math-verify checker;
- ``multi, no memory (noisy)``: the same rounds and verifier, but the memory is never shown (each round and each
  revision starts from x0): what the memory, rather than the extra verification, buys;
- ``single round``: one reasoner call whose token budget is the multi-round arm's whole policy budget
  (8 × (reasoner + summariser) + 8 × reviser tokens); its answer is committed unverified.

"solved" is the committed answer against the reference (math-verify), never the verifier's opinion. Tokens are
the policy's generated tokens per problem (reasoner + summariser + reviser; verifier calls excluded).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 0.0
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return c - h, c + h


def run_arm(rows: list[dict], p: float, arm: str, seed: int, tokens_per_step: int) -> dict:
    from posttrain.lemma.agent import AgentConfig, LemmaAgent
    from posttrain.lemma.scripted import scripted_caller
    from posttrain.lemma.statements import answers_match, decide
    from posttrain.lemma.verifiers import FormalVerifier, NoisyVerifier

    reason_tokens = 2 * tokens_per_step + 40
    multi = AgentConfig(reasoner_tokens=reason_tokens, summariser_tokens=600, reviser_tokens=reason_tokens)
    budget = (
        multi.max_rounds * (multi.reasoner_tokens + multi.summariser_tokens)
        + multi.max_revisions * multi.reviser_tokens
    )
    cfg = {
        "multi+memory (noisy)": multi,
        "multi+memory (formal)": multi,
        "multi, no memory (noisy)": AgentConfig(**{**multi.__dict__, "show_memory": False}),
        "single round": AgentConfig(max_rounds=1, max_revisions=0, reasoner_tokens=budget, summariser_tokens=600),
    }[arm]
    verifier = FormalVerifier() if "formal" in arm else NoisyVerifier(0.931, 0.818, 0.5, seed=seed)
    caller = scripted_caller(p_correct=p, tokens_per_step=tokens_per_step, seed=seed)
    t0 = time.perf_counter()
    traces = LemmaAgent(caller, verifier, cfg).solve(rows)
    wall = time.perf_counter() - t0
    solved = sum(bool(t.final_answer() and answers_match(t.final_answer().value, t.problem["answer"])) for t in traces)
    lemmas = [m for t in traces for m in t.memory]
    truth = [decide(m.statement).ok is True for m in lemmas]
    acc = [m.status == "accepted" for m in lemmas]
    tp = sum(a and tr for a, tr in zip(acc, truth))
    lo, hi = wilson(solved, len(traces))
    return {
        "arm": arm,
        "p_correct": p,
        "solved": solved,
        "n": len(traces),
        "solve_rate": solved / len(traces),
        "ci95": [round(lo, 3), round(hi, 3)],
        "budget_tokens": budget,
        "mean_policy_tokens": sum(t.policy_tokens() for t in traces) / len(traces),
        "mean_rounds": sum(len(t.rounds) for t in traces) / len(traces),
        "lemmas": len(lemmas),
        "accepted": sum(acc),
        "uncertain": len(lemmas) - sum(acc),
        "lemma_precision": tp / sum(acc) if sum(acc) else None,
        "lemma_recall": tp / sum(truth) if sum(truth) else None,
        "wall_s": round(wall, 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100, help="test problems")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--magnitude", type=int, default=1)
    ap.add_argument("--p", type=float, nargs="+", default=[0.7, 0.8, 0.9], help="p_correct of the scripted reasoner")
    ap.add_argument("--tokens-per-step", type=int, default=120)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the rows here")
    a = ap.parse_args(argv)
    from posttrain.lemma.tasks import train_test_split

    _, test = train_test_split(0, a.n, seed=a.seed, steps=a.steps, magnitude=a.magnitude)
    arms = ["multi+memory (noisy)", "multi+memory (formal)", "multi, no memory (noisy)", "single round"]
    rows = []
    print(f"{len(test)} test problems, {a.steps} steps, magnitude {a.magnitude}, seed {a.seed}")
    print(
        f"{'p':>4} {'arm':<26} {'solved':>9} {'95% CI':>13} {'tokens':>7} {'budget':>7} {'rounds':>6} {'acc/unc':>9} {'P':>6} {'R':>6}"
    )
    for p in a.p:
        for arm in arms:
            r = run_arm(test, p, arm, a.seed, a.tokens_per_step)
            rows.append(r)
            prec = f"{r['lemma_precision']:.3f}" if r["lemma_precision"] is not None else "-"
            rec = f"{r['lemma_recall']:.3f}" if r["lemma_recall"] is not None else "-"
            print(
                f"{p:>4} {arm:<26} {r['solved']:>4}/{r['n']:<4} {str(r['ci95']):>13} {r['mean_policy_tokens']:>7.0f} "
                f"{r['budget_tokens']:>7} {r['mean_rounds']:>6.2f} {r['accepted']:>4}/{r['uncertain']:<4} {prec:>6} {rec:>6}",
                flush=True,
            )
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
