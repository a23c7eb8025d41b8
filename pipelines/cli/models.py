"""``scifolio models tiny DIR``: tiny offline stand-in models."""

from __future__ import annotations

import argparse
from pathlib import Path


def cmd_models_tiny(args: argparse.Namespace) -> int:
    from pipelines.tiny import write_tiny_tokenizer
    from posttrain.tiny import write_tiny_posttrain
    from pretrain.tiny import write_tiny_pretrain
    from retrieval.tiny import write_tiny_retrieval
    from visual_gain.tiny import write_tiny_visual_gain

    out = Path(args.dir)
    tokenizer = write_tiny_tokenizer(out / "tokenizer")
    written = {"tokenizer": str(tokenizer)}
    written.update(write_tiny_visual_gain(out))
    written.update(write_tiny_retrieval(out))
    written.update(write_tiny_pretrain(out, tokenizer))  # the LM shares the corpus job's tokenizer
    written.update(write_tiny_posttrain(out))
    for name, path in written.items():
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
