"""``scifolio posttrain sft``: supervised fine-tuning on chat jsonl and trace exports (posttrain/sft.py).

    scifolio posttrain sft --config debug --model models/base --data chats.jsonl --out runs/sft
    scifolio posttrain sft --config debug --model models/base --data chats.jsonl --out runs/sft --resume
    scifolio posttrain sft --config small --model M --data a.jsonl b.jsonl --out runs/sft --nproc 2

Writes DIR/config.json, DIR/metrics.jsonl, DIR/tb, DIR/ckpt (DeepSpeed), DIR/skipped.jsonl (bad rows and why) and
DIR/policy (the Hugging Face model + tokenizer the next stage loads). ``--nproc N`` starts N ranks through the
deepspeed launcher, as ``scifolio pretrain`` does (c10d binds every interface: use a loopback-only namespace).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from pipelines.cli.options import add_recipe_args, recipe_config


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sft",
        help="supervised fine-tuning: chat jsonl / trace exports, loss on assistant tokens, packed rows, DeepSpeed",
        description="Fine-tune MODEL on chat rows {messages: [...]} (system/user/assistant/tool, OpenAI tool calls) "
        "and trace-store exports {token_ids, loss_mask}; only assistant tokens are in the loss; bad rows are "
        "skipped with a reason (DIR/skipped.jsonl). Writes DIR/policy.",
    )
    p.add_argument("--model", required=True, help="Hugging Face model dir or name (e.g. `pretrain export` output)")
    p.add_argument("--data", required=True, nargs="+", help="jsonl files: chats and/or trace exports")
    p.add_argument("--nproc", type=int, default=1, help="ranks on this machine (deepspeed launcher)")
    add_recipe_args(
        p,
        "posttrain/sft.py: debug, small",
        "run directory (config.json, metrics.jsonl, tb/, ckpt/, policy/)",
        "steps=200, lr=1e-4, zero_stage=3, seq_len=1024",
        resume="continue from DIR/ckpt/latest with its data cursor",
    )
    p.set_defaults(func=run_sft)


def run_sft(args: argparse.Namespace) -> int:
    from posttrain.sft import RECIPES

    if (cfg := recipe_config(RECIPES, args, given={"model": args.model, "data": tuple(args.data)})) is None:
        return 0
    if args.nproc > 1 and "RANK" not in os.environ:
        return _launch(args)
    from posttrain.sft import train
    from pretrain.train import init_distributed, prepare_env, shutdown_distributed

    prepare_env()
    try:
        rows = train(cfg, args.out, setup=init_distributed, resume=args.resume, progress=not args.no_progress)
    except ValueError as e:  # refused before training: no usable row, image rows for a text-only model
        print(f"error: {e}", file=sys.stderr)
        return 2
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # a launched rank (its own process) leaves the group with the
        shutdown_distributed()  # others: a live gloo group can abort a finished rank; in process, DeepSpeed keeps it
    if rows and int(os.environ.get("RANK", "0")) == 0:
        print(f"step {rows[-1]['step']}: loss {rows[-1]['loss']:.4f}, policy at {args.out}/policy")
    return 0


def _launch(args: argparse.Namespace) -> int:
    """Re-run this command on ``--nproc`` ranks through the deepspeed launcher (each rank sees RANK set)."""
    from pipelines.cli.pretrain import _free_port, launcher_env

    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", str(args.nproc)]
    cmd += ["--master_addr", "127.0.0.1", "--master_port", str(_free_port()), "--no_local_rank"]
    return subprocess.run([*cmd, "--module", "pipelines.cli", *_argv(args)], env=launcher_env()).returncode


def _argv(args: argparse.Namespace) -> list[str]:
    argv = ["posttrain", "sft", "--config", args.config, "--model", args.model, "--data", *args.data]
    argv += ["--out", args.out, *(["--resume"] if args.resume else []), "--no-progress"]
    return argv + [x for s in args.set for x in ("--set", s)]
