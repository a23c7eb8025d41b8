"""``scifolio posttrain rl``: RL post-training with partial rollout (posttrain/rl/loop.py).

    scifolio posttrain rl --config debug --out runs/rl                  # tiny policy, built on the spot
    scifolio posttrain rl --config debug --out runs/rl --resume         # continue after a crash / kill -9
    scifolio posttrain rl --config debug --out runs/rl --set steps=10 --set scheduler.partial=false
    scifolio posttrain rl --config debug --out runs/rl --ray local --engine-workers 2
    scifolio posttrain rl --config debug --out runs/rl --speculative --set speculative.k=4   # draft trained online
    scifolio posttrain rl --config debug --out runs/rl --ray local --speculative   # draft synced to the Ray workers
    scifolio posttrain rl --config small --out runs/rl --set policy.path=/models/qwen --set task.jsonl=train.jsonl
    scifolio posttrain distill --config debug --out runs/opd                  # two-teacher on-policy distillation
    scifolio posttrain distill --config experts --out runs/opd --student runs/sft/policy \\
        --teacher reasoning=runs/exp-r/policy --teacher agentic=runs/exp-a/policy \\
        --prompts reasoning=r.jsonl --prompts agentic=a.jsonl                  # real models, real prompts
    scifolio posttrain sft --config debug --model models/base --data chats.jsonl --out runs/sft   # SFT → policy/

    scifolio posttrain gateway --model tiny/posttrain-student --port 8000   # OpenAI/Anthropic APIs over the engine
    scifolio posttrain agentic --config debug --out runs/agentic            # harness x task rollouts + learner steps
    scifolio posttrain distill --config debug --out runs/distill            # two-teacher on-policy distillation
    scifolio posttrain rl --config debug --out runs/rl --speculative        # rollouts with a draft trained online

Writes DIR/metrics.jsonl (one row per step), DIR/tb (TensorBoard), DIR/checkpoint and DIR/policy (HF checkpoint).
``--ray`` starts a local Ray (``local``) or joins a cluster (``HOST:PORT``); Ray binds every interface, so run a
local one inside a loopback-only namespace (``unshare -n``).
"""

from __future__ import annotations

import argparse
import json
import sys

from pipelines.cli import sft, tasks
from pipelines.cli.options import add_recipe_args, recipe_config

# Recipe notes for --help, here rather than read from the recipes' docstrings: importing those pulls in torch,
# seconds on every CLI start. Keep them in step with posttrain/rl/recipes.py:small and posttrain/rl/distill.py.
RL_SMALL = (
    "--config small: a real model at policy.path (default Qwen/Qwen2.5-0.5B-Instruct: a local directory or a hub "
    "name already cached; nothing is downloaded offline) on posttrain/data/rl/train.jsonl, which ships with the "
    "project (512 generated arithmetic chats with exact integer answers; test.jsonl beside it for scifolio eval; "
    "python -m posttrain.rl.task --write DIR regenerates them). A real run needs a chat model with its tokenizer and "
    "chat template, rows {id, prompt|messages, answer} in task.jsonl with a fitting task.verifier (exact|prefix|numeric|"
    "math-verify), and for 500 steps of 1024-token rollouts a GPU (engine.kind=vllm). --config smol: "
    "SmolLM2-135M-Instruct at policy.path (default real/lm: scifolio models real real/ writes it) learning "
    "one-operation arithmetic (posttrain/data/smol) on 2 CPU cores in 16 steps (DAPO on), rewarded by the numeric verifier "
    "that scifolio eval --verifier numeric measures with (python benchmarks/rl_smol.py --model real/lm: 3 seeds)."
)
DISTILL_RECIPES = (
    "--config debug: toy teachers, student and prompts built on the spot; takes no paths. "
    "--config experts: real models and prompts. A real run needs --teacher DOMAIN=DIR for each domain (Hugging Face "
    "directories with their tokenizers, e.g. two posttrain sft/rl runs from one SFT checkpoint: their DIR/policy), "
    "--student DIR (e.g. that SFT checkpoint's DIR/policy), every teacher tokenizer identical to the student's "
    '(refused otherwise), and --prompts DOMAIN=FILE per teacher domain (jsonl rows {"prompt": ...} or '
    '{"messages": [...]}, chats rendered with the student\'s chat template). Memory: the student in fp32 with Adam '
    "state plus every teacher in fp32 (two 0.5B teachers and a 0.5B student: ~12 GB). Defaults: 200 steps, 8 "
    "queries x 4 samples per domain per step, 256-token responses ending at the tokenizer's EOS, lr 1e-6."
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("posttrain", help="RL post-training (partial rollout, detached-IS loss, BKL mask)")
    sub = p.add_subparsers(dest="posttrain_command", metavar="STAGE", required=True)
    rl = sub.add_parser(
        "rl",
        help="RL on a verifiable task with the partial-rollout scheduler",
        description="Collect with partial rollout, train with Eq 29 + BKL mask, sync, checkpoint; one metrics row per step.",
    )
    rl.epilog = RL_SMALL
    add_recipe_args(
        rl,
        "posttrain/rl/recipes.py: debug, debug-moe, small, smol",
        "run directory (metrics.jsonl, tb/, checkpoint/, policy/)",
        "steps=10, scheduler.partial=false, learner.lr=1e-3, policy.arch=qwen2_moe, engine.kind=hf",
        resume="continue from DIR/checkpoint (in-flight rollouts included)",
    )
    rl.add_argument(
        "--ray", default=None, metavar="local|ADDRESS", help="rollout engines as Ray actors (= --set engine.ray=...)"
    )
    rl.add_argument(
        "--engine-workers", type=int, default=2, help="with --ray: number of engine workers (= engine.workers)"
    )
    rl.add_argument(
        "--speculative",
        action="store_true",
        help="speculative rollouts with a draft trained online (= --set engine.kind=speculative; k via speculative.k)",
    )
    rl.set_defaults(func=run_rl)

    gw = sub.add_parser(
        "gateway",
        help="serve a model as OpenAI Chat Completions, OpenAI Responses and Anthropic Messages, capturing tokens",
        description="A model service for agent harnesses (session = API key, or /s/SID/v1): every call's exact "
        "input/output token ids, logprobs and routed experts go to a PrefixTree trace store (SQLite).",
    )
    gw.add_argument("--model", required=True, help="Hugging Face name or local path with a tokenizer + chat template")
    gw.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    gw.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    gw.add_argument("--traces", default=None, help="SQLite trace store path (default: in memory)")
    gw.add_argument(
        "--api-keys",
        default=None,
        metavar="FILE",
        help="allowed API keys, each mapped to a session prefix (JSON {key: prefix} or 'KEY PREFIX' lines); "
        "required to bind anything but loopback",
    )
    gw.set_defaults(func=run_gateway)

    ag = sub.add_parser(
        "agentic",
        help="agentic RL: a harness solves coding tasks through the gateway; verified sessions train the policy",
        description="Rollouts of a harness over sandboxed coding tasks (hidden tests overlaid after the agent "
        "stops), Eq 30 session credit on the stored token spans, learner steps; traces.sqlite + metrics.jsonl.",
    )
    add_recipe_args(
        ag,
        "posttrain/agentic/rl.py: debug",
        "run directory (traces.sqlite, metrics.jsonl, checkpoint/, policy/)",
        "steps=2, engine.kind=hf, policy.path=DIR, tasks=tasks.jsonl",
        progress=False,
    )
    ag.set_defaults(func=run_agentic_cmd)

    ds = sub.add_parser(
        "distill",
        help="two-teacher on-policy distillation (reasoning / agentic teachers, posttrain/rl/distill.py)",
        description="Student samples on-policy; each query scored by its domain's teacher (sampled-token logprobs "
        "only); Eq 33 advantage against the batch's proximal student; one metrics row per step.",
        epilog=DISTILL_RECIPES,
    )
    ds.add_argument(
        "--teacher",
        action="append",
        default=[],
        metavar="DOMAIN=DIR",
        help="a domain's teacher model directory (experts; repeatable; = teacher_paths)",
    )
    ds.add_argument("--student", default=None, metavar="DIR", help="student model directory (experts; = student_path)")
    ds.add_argument(
        "--prompts",
        action="append",
        default=[],
        metavar="DOMAIN=FILE",
        help='a domain\'s prompt jsonl, rows {"prompt": ...} or {"messages": [...]} (experts; repeatable)',
    )
    add_recipe_args(
        ds,
        "posttrain/rl/distill.py: debug, experts",
        "run directory (metrics.jsonl, checkpoint/, policy/)",
        "steps=4, policy.arch=qwen2_moe, engine.ray=local",
    )
    ds.set_defaults(func=run_distill)

    from pipelines.cli import lemma  # `posttrain lemma solve` lives in its own module

    lemma.register(sub)

    from pipelines.cli import memdec

    memdec.register(sub, alias=False)  # `scifolio posttrain memdec` = `scifolio memdec`

    sft.add_parser(sub)  # `posttrain sft`: its flags and dispatch live in pipelines/cli/sft.py
    tasks.add_parser(sub)  # `posttrain tasks figures`: pipelines/cli/tasks.py


def run_gateway(args: argparse.Namespace) -> int:
    from posttrain.agentic.gateway import serve_gateway

    return serve_gateway(args.model, args.host, args.port, args.traces, args.api_keys)


def run_agentic_cmd(args: argparse.Namespace) -> int:
    from posttrain.agentic.rl import RECIPES, resolve, run_agentic
    from posttrain.rl.engines import EngineRefused

    if (cfg := recipe_config(RECIPES, args, finish=resolve, refused=(EngineRefused,))) is None:
        return 0
    metrics = run_agentic(cfg, args.out, resume=args.resume)
    print(json.dumps(metrics, default=str))
    return 0


def run_distill(args: argparse.Namespace) -> int:
    from posttrain.rl.distill import RECIPES, DistillRefused, build
    from posttrain.rl.loop import run_stage

    given: dict[str, object] = {}
    try:  # the flags are spellings of teacher_paths / student_path / prompts; --set still applies after them
        if args.teacher:
            given["teacher_paths"] = _domain_pairs(args.teacher, "--teacher")
        if args.prompts:
            given["prompts"] = _domain_pairs(args.prompts, "--prompts")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.student:
        given["student_path"] = args.student
    if (cfg := recipe_config(RECIPES, args, given=given)) is None:
        return 0
    try:
        stage = build(cfg)
    except DistillRefused as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = run_stage(stage, args.out, resume=args.resume, progress=not args.no_progress)
    last = rows[-1] if rows else {"step": 0}
    kl = ", ".join(f"{k} {v:.3f}" for k, v in last.items() if k.startswith(("rkl_", "gap_")))
    print(f"step {last['step']}: {kl}; student at {args.out}/policy")
    return 0


def _domain_pairs(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        domain, sep, path = item.partition("=")
        if not sep or not domain or not path:
            raise ValueError(f"{flag} {item}: expected DOMAIN=PATH")
        out[domain] = path
    return out


def run_rl(args: argparse.Namespace) -> int:
    from posttrain.rl.engines import EngineRefused, resolve
    from posttrain.rl.recipes import RECIPES, to_dict

    sets = list(args.set)  # the flags are spellings of engine fields
    if args.speculative:
        sets.append("engine.kind=speculative")
    if args.ray:
        sets += [f"engine.ray={args.ray}", f"engine.workers={args.engine_workers}"]
    cfg = recipe_config(RECIPES, args, sets, finish=resolve, refused=(EngineRefused,), to_dict=to_dict)
    if cfg is None:
        return 0
    from posttrain.rl.loop import run
    from posttrain.rollout.scheduler import Starved

    try:
        rows = run(cfg, args.out, resume=args.resume, progress=not args.no_progress)
    except EngineRefused as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Starved as e:
        print(f"\nerror: posttrain rl stopped, {e}", file=sys.stderr)
        return 3
    if rows:
        last = rows[-1]
        print(f"step {last['step']}: reward {last['reward']:.3f}, policy at {args.out}/policy")
    return 0
