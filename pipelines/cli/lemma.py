"""``scifolio posttrain lemma solve``: the lemma-memory agent on a problem or a task file (posttrain/lemma/).

    scifolio posttrain lemma solve --model scripted --tasks test.jsonl --out trace.json
    scifolio posttrain lemma solve --model scripted --problem "Let x0 = 4. Let x1 = gcd(x0 + 8, 36). Find x1." --answer 12
    scifolio posttrain lemma solve --model DIR --tasks test.jsonl --verifier model --set agent.max_rounds=4
    python -m posttrain.lemma.tasks --out tasks/ --train 200 --test 100       # write the lemma-chain family

Prints each problem's rounds (new lemmas, answer, round value, masked rounds), the lemma memory (status and
passing checks), the dependency graph and the final answer; ``--out`` writes the whole trace as JSON (every
engine call's token ids and logprobs, memory, graph credit). Training on the RL driver is not wired yet.
"""

from __future__ import annotations

import argparse
import sys

from pipelines.cli.options import add_set, apply_sets


def register(posttrain_sub: argparse._SubParsersAction) -> None:
    p = posttrain_sub.add_parser("lemma", help="the lemma-memory agent (Intern-S1-MO, SPEC §D)")
    sub = p.add_subparsers(dest="lemma_command", metavar="ACTION", required=True)
    s = sub.add_parser(
        "solve",
        help="run the agent (reasoner → summariser → verifier rounds, then revisions) and print its trace",
        description="Up to 8 reasoning rounds over a verified lemma memory, then up to 8 revision rounds; "
        "every role is a call on the rollout engine.",
    )
    s.add_argument("--model", required=True, help="scripted | tiny | a local Hugging Face model directory")
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--problem", help="one problem text")
    src.add_argument("--tasks", help="a jsonl of rows {id, prompt, answer}")
    s.add_argument("--answer", default=None, help="with --problem: the reference answer (formal answer checks)")
    s.add_argument("--verifier", default="formal", choices=["formal", "noisy", "model"])
    s.add_argument("--limit", type=int, default=None, help="first N rows of --tasks")
    s.add_argument("--out", default=None, help="write the JSON trace here")
    s.add_argument("--quiet", action="store_true", help="print only the summary line")
    add_set(s, "agent.max_rounds=4, p_correct=0.9, reward=ratio")
    s.set_defaults(func=run_solve)


def run_solve(args: argparse.Namespace) -> int:
    from posttrain.lemma.credit import batch_metrics
    from posttrain.lemma.run import SolveConfig, describe, solve, write_trace
    from posttrain.lemma.tasks import read_jsonl

    cfg = apply_sets(SolveConfig(model=args.model, verifier=args.verifier), args.set)
    if args.problem is not None:
        rows = [{"id": "problem", "prompt": args.problem, **({"answer": args.answer} if args.answer else {})}]
    else:
        rows = read_jsonl(args.tasks)[: args.limit]
    if not rows:
        print("error: no problems", file=sys.stderr)
        return 2
    traces, records = solve(cfg, rows)
    metrics = batch_metrics(traces, cfg.reward)
    if not args.quiet:
        for rec in records:
            print(describe(rec))
    graded = [r["solved"] for r in records if r["solved"] is not None]
    tokens = sum(r["policy_tokens"] for r in records) / len(records)
    solved = f"{sum(graded)}/{len(graded)} solved" if graded else "no reference answers"
    print(f"{len(records)} problems: {solved}; {tokens:.0f} policy tokens per problem")
    print(
        f"reward {metrics['reward']:.3f}; lemmas per reasoning round {metrics['accepted_per_round']:.2f} accepted, "
        f"{metrics['uncertain_per_round']:.2f} uncertain; masked rounds {metrics['masked_rounds']:.2f}"
    )
    if args.out:
        write_trace(args.out, cfg, records, metrics)
        print(f"trace: {args.out}")
    return 0
