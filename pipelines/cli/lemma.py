"""``scifolio posttrain lemma solve``: the lemma-memory agent on a problem or a task file (posttrain/lemma/).

    scifolio posttrain lemma solve --model scripted --tasks test.jsonl --out trace.json
    scifolio posttrain lemma solve --model scripted --problem "Let x0 = 4. Let x1 = gcd(x0 + 8, 36). Find x1." --answer 12
    scifolio posttrain lemma solve --model DIR --tasks test.jsonl --verifier model --set agent.max_rounds=4
    python -m posttrain.lemma.tasks --out tasks/ --train 200 --test 100       # write the lemma-chain family

Prints each problem's rounds (new lemmas, answer, round value, masked rounds), the lemma memory (status and
passing checks), the dependency graph and the final answer; ``--out`` writes the whole trace as JSON (every
engine call's token ids and logprobs, memory, graph credit).

    scifolio posttrain lemma train --config debug --out runs/lemma            # OREAL-H, tiny policy, CPU
    scifolio posttrain lemma train --config s1mo --out runs/s1mo --set policy=/models/qwen
    scifolio posttrain lemma train --config debug --out runs/lemma --resume   # after a crash / kill -9

``train`` runs OREAL-H on the one RL driver (posttrain/lemma/train.py): cold-start BC, then per step questions ×
rollouts agent runs, conjugate reward + graph credit per round, one learner update; a metrics row per step.
"""

from __future__ import annotations

import argparse
import sys

from pipelines.cli.options import add_recipe_args, add_set, apply_sets, recipe_config


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

    t = sub.add_parser(
        "train",
        help="OREAL-H training of the agent on the RL driver (cold-start BC, then conjugate reward + graph credit)",
        description="debug: a tiny random policy (character codec) cold-started by cloning the scripted reasoner, "
        "noisy verifier, 20 steps on CPU. s1mo: Intern-S1-MO's recipe (64 questions x 16 rollouts, pass rate 0/1 "
        "dropped, AdamW lr 5e-7 cosine to 1/5, KL beta 0.01, calls up to 65,536 tokens); it needs a real policy: "
        "--set policy.path=DIR (a local Hugging Face model directory with its tokenizer). Ablations: --set reward=ratio, "
        "--set graph_credit=false.",
    )
    add_recipe_args(
        t,
        "posttrain/lemma/train.py: debug, s1mo",
        "run directory (config.json, metrics.jsonl, checkpoint/, policy/)",
        "steps=4, reward=ratio, graph_credit=false, policy.path=/models/qwen",
    )
    t.set_defaults(func=run_train)


def run_solve(args: argparse.Namespace) -> int:
    from formats.fs import read_jsonl
    from posttrain.lemma.credit import batch_metrics
    from posttrain.lemma.run import SolveConfig, describe, solve, write_trace

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


def run_train(args: argparse.Namespace) -> int:
    from posttrain.lemma.train import RECIPES, resolve, run
    from posttrain.rl.engines import EngineRefused

    if (cfg := recipe_config(RECIPES, args, finish=resolve, refused=(EngineRefused,))) is None:
        return 0
    if cfg.policy.path == "":
        print(
            f"error: --config {args.config} needs a policy: --set policy.path=DIR (a local HF model)", file=sys.stderr
        )
        return 2
    rows = run(cfg, args.out, resume=args.resume, progress=not args.no_progress)
    if rows:
        last = rows[-1]
        print(
            f"step {last['step']}: reward {last['reward']:.3f}, solved {last['solved']:.3f}, accepted lemmas per "
            f"round {last['accepted_per_round']:.2f}, uncertain {last['uncertain_per_round']:.2f}, masked rounds "
            f"{last['masked_rounds']:.2f}; policy at {args.out}/policy"
        )
    return 0
