"""``scifolio report DIR``: DIR/report.html for a build output directory."""

from __future__ import annotations

import argparse


def cmd_report(args: argparse.Namespace) -> int:
    from pipelines.report import write_report

    path = write_report(args.dir, pages_with_boxes=args.pages)
    print(path)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("report", help="write DIR/report.html for a build output directory")
    r.add_argument("dir")
    r.add_argument("--pages", type=int, default=6, help="pages drawn with their layout boxes (default: 6)")
    r.set_defaults(func=cmd_report)
