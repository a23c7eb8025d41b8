"""The one entry point: ``scifolio <command> --help``.

    scifolio models tiny tiny/                       # offline stand-in models for smoke runs
    scifolio build ../shared/samples --out out/ --tokenizer tiny/tokenizer
    scifolio parse ../shared/samples --out parsed/   # parser debugging view (blocks.parquet)
    scifolio report out/                             # out/report.html

Subcommands mirror the packages; heavy imports happen inside each command. Unknown flags of
``build`` are Apache Beam pipeline options and pass through untouched (``--runner``, ``--project``,
``--flink_master``, ``--direct_num_workers`` ...).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

# One module per subcommand, in --help order; each exposes register(subparsers) and sets ``func``. A module
# listed here that cannot be imported is an error, never silently skipped.
COMMANDS = (
    "build",
    "parse",
    "report",
    "models",
    "review",
    "index",
    "pretrain",
    "posttrain",
    "memdec",
    "timeseries",
    "eval",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scifolio",
        description="Scientific PDFs → interleaved multimodal pre-training corpora, an image index, and training.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"pipelines.cli.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args, unknown = parser.parse_known_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if getattr(args, "beam", False):
        return args.func(args, unknown)
    if getattr(args, "command", None) == "index" and getattr(args, "index_command", None) == "build":
        args.beam_args = unknown  # Beam pipeline options pass through to the ingest job
        return args.func(args)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
