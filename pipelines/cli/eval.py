"""``scifolio eval``: pass@k of a model on a verifiable task, or its perplexity on a build's shards (posttrain/eval.py).

    scifolio eval --model runs/sft/policy --task countdown --n 16 --k 1,4,16 --out eval.json
    scifolio eval --model M --task jsonl --data test.jsonl --verifier numeric --n 16 --k 1,4 --repeats 3 --out e.json
    scifolio eval --model M --task perplexity --shards out/ --out ppl.json
    scifolio eval --model VLM --task jsonl --data figures/test.jsonl --n 4 --k 1,4 --out fig.json  # image rows

Rows whose messages hold image parts (``formats.chat_images``: data URLs or local paths) need a vision-language
model (``scifolio pretrain export RUN --out VLM``, the default for a run with a vision encoder): its processor
renders the chat and its pixels go to the HF engine's prefill (vLLM gets the decoded images). A row whose image
fails (missing file, unreadable, too large) is skipped and counted with its reason (``skipped`` in the JSON); a
text-only model given image rows is refused.

Writes one JSON file (summary keys ``pass@1``, ``pass@4``… or ``perplexity``, plus per-problem results) and prints
a one-line summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter


def register(subparsers: argparse._SubParsersAction) -> None:
    from posttrain.eval import TASKS, VERIFIERS

    p = subparsers.add_parser(
        "eval",
        help="pass@k on a verifiable task (countdown, jsonl, ...) or held-out perplexity on shards",
        description="Unbiased pass@k over N samples per problem, sampled in batches by the RL stack's engine; "
        "or --task perplexity --shards BUILD_OUT.",
    )
    p.add_argument("--model", required=True, help="Hugging Face model directory or name (with its tokenizer)")
    p.add_argument(
        "--task",
        required=True,
        choices=[*sorted(TASKS), "agentic", "perplexity"],
        help="what to measure (agentic: the coding tasks through the gateway and the harness, graded in the jail)",
    )
    p.add_argument(
        "--engine",
        default="hf",
        choices=["hf", "vllm"],
        help="the RL stack's engine that samples: hf (in process, any device) or vllm (needs vLLM and a GPU)",
    )
    p.add_argument("--max-turns", type=int, default=6, help="--task agentic: harness turns per session")
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--n", type=int, default=16, help="samples per problem (default 16)")
    p.add_argument("--k", default="1,4,16", help="comma-separated k values of pass@k, each ≤ N (default 1,4,16)")
    p.add_argument("--repeats", type=int, default=1, help="independent sampling runs averaged (spread reported)")
    p.add_argument("--data", default=None, help="--task jsonl: problems, one {id, prompt|messages, answer} a line")
    p.add_argument("--verifier", default="exact", choices=sorted(VERIFIERS), help="--task jsonl: how to check")
    p.add_argument(
        "--problems", type=int, default=64, help="generated tasks (countdown) or coding tasks (agentic): how many"
    )
    p.add_argument("--max-new-tokens", type=int, default=None, help="response budget (default: the task's)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=64, help="requests the engine decodes at once")
    p.add_argument("--shards", default=None, help="--task perplexity: build output directory")
    p.add_argument("--seq-len", type=int, default=512, help="--task perplexity: window length")
    p.add_argument("--max-chunks", type=int, default=None, help="--task perplexity: stop after this many chunks")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from formats import fs
    from posttrain import eval as ev
    from posttrain.rl import engines

    if args.task == "perplexity":
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
        if not args.shards:
            print("error: --task perplexity needs --shards BUILD_OUT", file=sys.stderr)
            return 2
        result = {"model": args.model, "task": "perplexity", "shards": args.shards}
        result |= ev.perplexity(model, args.shards, args.seq_len, args.max_chunks, progress=not args.no_progress)
        fs.write_text(args.out, json.dumps(result, indent=2))
        print(f"perplexity {result['perplexity']:.3f} over {result['tokens']} tokens ({result['chunks']} chunks)")
        return 0

    if (make_engine := _engine(args)) is None:
        return 2
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    ks = [int(k) for k in args.k.split(",") if k.strip()]
    if args.task == "agentic":
        return _agentic(args, make_engine, tokenizer, ks)
    opts = ev.TaskOptions(args.data, args.verifier, args.problems, args.seed, args.max_new_tokens)
    try:
        task = ev.TASKS[args.task](opts)
        result = ev.evaluate(
            make_engine,
            tokenizer,
            task,
            args.n,
            ks,
            args.repeats,
            args.temperature,
            args.top_p,
            args.seed,
            progress=not args.no_progress,
            processor=engines.load_processor(engines.PolicyConfig(path=args.model)),
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result = {"model": args.model, "task": args.task, **result}
    fs.write_text(args.out, json.dumps(result, indent=2))
    scores = ", ".join(
        f"pass@{k} {result[f'pass@{k}']:.3f}" + (f"±{result[f'pass@{k}_std']:.3f}" if args.repeats > 1 else "")
        for k in ks
    )
    skipped = Counter(s["reason"] for s in result["skipped"])
    said = f", skipped {sum(skipped.values())} ({', '.join(f'{r} {c}' for r, c in sorted(skipped.items()))})"
    print(
        f"{args.task}: {scores} ({result['problems_count']} problems, n={args.n}, repeats={args.repeats}"
        + (said if skipped else "")
        + ")"
    )
    return 0


def _engine(args: argparse.Namespace):
    """A factory of the engine ``--engine`` names (``posttrain.rl.engines.EngineFactory``, the one every stage uses),
    or None (after saying why) when it cannot run here."""
    import copy
    import functools

    from posttrain.rl import engines
    from posttrain.rl.recipes import RLConfig

    cfg = RLConfig(policy=engines.PolicyConfig(path=args.model), engine=engines.EngineConfig(kind=args.engine))
    try:
        cfg = engines.resolve(cfg, ("hf", "vllm"), "scifolio eval")
    except engines.EngineRefused as e:
        print(f"error: --engine {args.engine}: {e}", file=sys.stderr)
        return None
    if args.engine == "vllm":
        return engines.EngineFactory(cfg, args.batch)
    model = engines.build_policy(cfg.policy)[0].eval()  # loaded once; each engine holds a copy
    return engines.EngineFactory(cfg, args.batch, build=functools.partial(copy.deepcopy, model))


def _agentic(args: argparse.Namespace, make_engine, tokenizer, ks: list[int]) -> int:  # noqa: ANN001
    from formats import fs
    from posttrain import eval as ev

    if not tokenizer.chat_template:
        print(
            f"error: {args.model}: the tokenizer has no chat template; the gateway cannot render sessions",
            file=sys.stderr,
        )
        return 2
    try:
        result = ev.evaluate_agentic(
            make_engine,
            tokenizer,
            args.n,
            ks,
            args.repeats,
            tasks=args.problems,
            max_turns=args.max_turns,
            max_tokens=args.max_new_tokens or 192,
            seed=args.seed,
            progress=not args.no_progress,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result = {"model": args.model, "task": "agentic", **result}
    fs.write_text(args.out, json.dumps(result, indent=2))
    scores = ", ".join(f"pass@{k} {result[f'pass@{k}']:.3f}" for k in ks)
    print(
        f"agentic: {scores} ({result['problems_count']} tasks, n={args.n}, repeats={args.repeats}, infra {result['infra']})"
    )
    return 0
