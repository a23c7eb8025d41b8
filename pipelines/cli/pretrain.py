"""``scifolio pretrain``: launch the DeepSpeed pre-training loop (pretrain/train.py) through the deepspeed launcher.

    scifolio pretrain --config debug --shards out --models tiny --max-steps 50
    scifolio pretrain --config debug --shards out --nproc 2            # world size 2 (CPU: gloo)
    scifolio pretrain --config small --shards gs://bucket/shards --hostfile infra/deepspeed/hostfile
    scifolio pretrain export runs/pretrain --out models/vlm        # latest complete checkpoint → HF VLM dir
    scifolio pretrain export runs/pretrain --out models/base --text-only   # ... or a text causal LM

On a machine without a GPU the ranks run on CPU (``DS_ACCELERATOR=cpu``, gloo). Ranks rendezvous over TCP at
127.0.0.1 (multi-node: the hostfile's first host); c10d's store listens on every interface, so on a shared host
run multi-process jobs inside a loopback-only namespace (see infra/deepspeed/README.md).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    from pretrain.args import build_parser

    p = subparsers.add_parser(
        "pretrain",
        help="DeepSpeed pre-training: text loss + contrastive next-patch loss on page renders (+ the time-series "
        "lane's forecasting loss when the shards hold series)",
        description="Launch pretrain.train on N local ranks (or a hostfile's nodes) with the deepspeed launcher.",
    )
    build_parser(p, shards_required=False)  # `pretrain export RUN` needs no shards; a training run checks below
    p.add_argument("--nproc", type=int, default=1, help="ranks on this machine (GPUs, or CPU processes)")
    p.add_argument("--hostfile", default=None, help="DeepSpeed hostfile for multi-node runs (infra/deepspeed/)")
    p.add_argument("--master-port", type=int, default=None, help="rendezvous port (default: a free one)")
    p.add_argument("--dry-run", action="store_true", help="print the launcher command and exit")
    p.set_defaults(func=run_pretrain)
    sub = p.add_subparsers(dest="pretrain_command", metavar="export", required=False)
    ex = sub.add_parser(
        "export",
        help="a run's latest complete checkpoint (any ZeRO stage, any world size) → Hugging Face model dir",
        description="Consolidate RUN/ckpt (ZeRO partitions of every rank merged) into MODEL: safetensors, "
        "config.json, tokenizer + chat template, generation_config.json, and vision_heads.safetensors/.json "
        "(W_in and the patch head ψ; pretrain.export.load_vision_heads). A run that trained with a vision encoder "
        "exports as a LLaVA-style vision-language model by default (--text-only for a text causal LM). A run in "
        "progress exports its latest complete checkpoint; the step and the format are printed and the step "
        "recorded in MODEL/export.json.",
    )
    ex.add_argument("run", help="pre-training output directory (`scifolio pretrain --out`)")
    ex.add_argument("--out", required=True, help="model directory to write")
    ex.add_argument("--backbone", default=None, help="backbone config/tokenizer path (default: RUN/config.json's)")
    fmt = ex.add_mutually_exclusive_group()
    fmt.add_argument(
        "--vlm",
        action="store_true",
        help="a LLaVA-style vision-language model (AutoModelForImageTextToText + AutoProcessor: the backbone, the "
        "run's CLIP tower, W_in as the projector; chat messages take {'type': 'image'} parts); the default for a "
        "run with a vision encoder, an error for one without",
    )
    fmt.add_argument(
        "--text-only",
        action="store_true",
        help="a text causal LM (AutoModelForCausalLM) with vision_heads.* beside it (the pre-vision-language "
        "export): the default for a run without a vision encoder",
    )
    ex.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    from pretrain.export import default_format, export, export_vlm
    from pretrain.train import prepare_env

    prepare_env()
    try:
        vlm = args.vlm or (not args.text_only and default_format(args.run, args.backbone) == "vlm")
        ck = (export_vlm if vlm else export)(args.run, args.out, backbone=args.backbone)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    kind = "vision-language model" if vlm else "text-only model"
    print(
        f"exported {args.run} step {ck.step} ({ck.tag}, ZeRO-{ck.zero_stage}, {ck.world_size} rank(s)) → {args.out} "
        f"as a {kind}"
    )
    return 0


def launcher_command(args: argparse.Namespace) -> list[str]:
    """``python -m deepspeed.launcher.runner ... --module pretrain.train <args>`` for ``args``."""
    from pretrain.args import to_argv

    cmd = [sys.executable, "-m", "deepspeed.launcher.runner"]
    if args.hostfile:
        # Without --master_addr the launcher asks the first host for `hostname -I`, which lists no loopback
        # address and, on a multi-homed node, may pick an interface the others cannot reach; the name the
        # hostfile gives is the one every node already resolves for ssh.
        cmd += ["--hostfile", args.hostfile, "--master_addr", first_host(args.hostfile)]
    else:
        cmd += ["--num_gpus", str(args.nproc), "--master_addr", "127.0.0.1"]
    cmd += ["--master_port", str(args.master_port or _free_port()), "--no_local_rank", "--module", "pretrain.train"]
    return cmd + to_argv(args)


def first_host(hostfile: str) -> str:
    """The first node of a DeepSpeed hostfile (``HOST slots=N`` lines, ``#`` comments): the rendezvous master."""
    for line in Path(hostfile).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            return line.split()[0]
    raise ValueError(f"hostfile {hostfile} lists no host")


def launcher_env() -> dict[str, str]:
    import torch

    repo = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    if "DS_ACCELERATOR" not in env and not torch.cuda.is_available():
        env["DS_ACCELERATOR"] = "cpu"
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(repo) / ".cache" / "torch_extensions"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH", "")) if p)
    return env


def run_pretrain(args: argparse.Namespace) -> int:
    if not args.shards:
        print(
            "error: scifolio pretrain: --shards is required (or: scifolio pretrain export RUN --out MODEL)",
            file=sys.stderr,
        )
        return 2
    cmd = launcher_command(args)
    if args.dry_run:
        print(" ".join(cmd))
        return 0
    for sub in ("pretrain-lm", "pretrain-vision"):
        if args.config == "debug" and not (Path(args.models) / sub).exists():
            print(
                f"error: {Path(args.models) / sub} missing; write tiny models with `scifolio models tiny "
                f"{args.models}`",
                file=sys.stderr,
            )
            return 2
    return subprocess.run(cmd, env=launcher_env()).returncode


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
