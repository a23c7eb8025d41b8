"""Command-line arguments of a pre-training run, kept torch-free so ``scifolio --help`` stays instant.

python -m pretrain.train --help
"""

from __future__ import annotations

import argparse
from typing import Any

from formats.overrides import parse_sets, with_overrides
from pretrain.config import RECIPES, TrainConfig


def build_parser(
    parser: argparse.ArgumentParser | None = None, shards_required: bool = True
) -> argparse.ArgumentParser:
    """Arguments shared by ``python -m pretrain.train`` and ``scifolio pretrain`` (whose ``export`` subcommand
    takes no shards, so it checks ``--shards`` itself)."""
    p = parser or argparse.ArgumentParser(
        prog="pretrain.train",
        description="Pre-train with L_text + L_VP (one process; `scifolio pretrain` launches many).",
    )
    p.add_argument("--config", default="debug", choices=sorted(RECIPES), help="named recipe (pretrain/config.py)")
    p.add_argument(
        "--shards",
        required=shards_required,
        help="build output directory (`scifolio build --out`; local or fsspec URL)",
    )
    p.add_argument("--models", default="tiny", help="directory the debug recipe loads pretrain-lm/-vision from")
    p.add_argument("--out", default=None, help="output dir: ckpt/, metrics.jsonl, tb/ (default: out/pretrain)")
    p.add_argument(
        "--weights",
        default=None,
        help="sample-weights table from `scifolio index weights`: a chunk's draw weight = its own sample_weight x "
        "the listed weight (1 when unlisted); see formats/weights.py",
    )
    p.add_argument("--max-steps", type=int, default=None, help="optimizer steps to reach")
    p.add_argument("--zero-stage", type=int, default=None, choices=[0, 1, 2, 3], help="ZeRO stage")
    p.add_argument("--precision", default=None, choices=["fp32", "bf16"])
    p.add_argument("--save-every", type=int, default=None, help="checkpoint every N steps (always at the end)")
    p.add_argument("--resume", action="store_true", help="continue from OUT/ckpt/latest with its data cursor")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any field, e.g. data.seq_len=64 or optim.lr=1e-3 (repeatable)",
    )
    return p


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    cfg = RECIPES[args.config](shards=args.shards, models=args.models)
    overrides: dict[str, Any] = {}
    for flag, key in (
        ("out", "out_dir"),
        ("weights", "data.weights"),
        ("max_steps", "max_steps"),
        ("zero_stage", "zero_stage"),
        ("precision", "precision"),
        ("save_every", "save_every"),
    ):
        if getattr(args, flag) is not None:
            overrides[key] = getattr(args, flag)
    overrides.update(parse_sets(args.set))
    return with_overrides(cfg, overrides)


FORWARDED = ("config", "shards", "models", "out", "weights", "max_steps", "zero_stage", "precision", "save_every")


def to_argv(args: argparse.Namespace) -> list[str]:
    """The ``pretrain.train`` arguments that reproduce ``args`` (what the launcher hands each rank)."""
    argv: list[str] = []
    for name in FORWARDED:
        value = getattr(args, name)
        if value is not None:
            argv += [f"--{name.replace('_', '-')}", str(value)]
    if args.resume:
        argv.append("--resume")
    for item in args.set:
        argv += ["--set", item]
    return argv
