"""``scifolio models tiny DIR``: tiny offline stand-in models."""

from __future__ import annotations

import argparse
from pathlib import Path


def cmd_models_tiny(args: argparse.Namespace) -> int:
    from pipelines.tiny import write_all

    for name, path in write_all(Path(args.dir)).items():
        print(f"{name}: {path}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser("models", help="model utilities")
    msub = m.add_subparsers(dest="models_command", metavar="COMMAND", required=True)
    t = msub.add_parser(
        "tiny",
        help="write tiny offline stand-in models (tokenizer, VLM, embedders, LM) to DIR",
        description="Write small random models built from configs, loadable by the same "
        "from_pretrained code as real ones. For smoke runs and tests only: scores and embeddings "
        "from them are meaningless.",
    )
    t.add_argument("dir")
    t.set_defaults(func=cmd_models_tiny)
