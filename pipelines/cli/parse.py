"""``scifolio parse``: the parser's debugging view (blocks.parquet + crops + quarantine).

scifolio parse ../shared/samples --out parsed/ [--view]
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

from pipelines.cli.options import add_set, apply_sets, default


def _add_parse_options(p: argparse.ArgumentParser) -> None:
    from parsing.config import ParseConfig

    d = functools.partial(default, ParseConfig)
    g = p.add_argument_group("parsing")
    g.add_argument(
        "--backend",
        choices=["mineru", "pymupdf"],
        default=d("backend"),
        help=f"layout backend (default: {d('backend')}; scanned pages fall back to rapid-layout + RapidOCR)",
    )
    g.add_argument(
        "--layout",
        choices=["fused", "fast"],
        default=d("layout"),
        help=f"fused: the backend's boxes (after the layout rules) fused with the DocLayNet YOLO detector's, "
        f"which also covers scans; fast: the backend alone (default: {d('layout')})",
    )
    g.add_argument(
        "--tier",
        default=d("tier"),
        choices=["flash", "basic", "standard"],
        help="MinerU tier (flash runs offline; basic/standard need MinerU's models)",
    )
    g.add_argument("--dpi", type=int, default=d("dpi"), help=f"crop render DPI (default: {d('dpi')})")
    g.add_argument("--no-ocr", action="store_true", help="do not OCR pages that have no text layer")
    g.add_argument(
        "--page-timeout",
        type=float,
        default=d("page_timeout_s"),
        help=f"seconds per page before it is quarantined (default: {d('page_timeout_s')})",
    )
    g.add_argument(
        "--doc-timeout",
        type=float,
        default=d("doc_timeout_s"),
        help=f"seconds per document before it is quarantined (default: {d('doc_timeout_s')})",
    )
    g.add_argument(
        "--backend-lanes",
        type=int,
        default=d("backend_lanes"),
        help=f"extra parser processes per parse worker for the windows of long documents (default "
        f"{d('backend_lanes')}; 0 = one process). The local default of Beam workers is cores / (1 + lanes)",
    )


def _parse_config(args: argparse.Namespace, page_render_dpi: int | None = None):
    from parsing.config import ParseConfig

    try:
        return ParseConfig(
            backend=args.backend,
            layout=args.layout,
            tier=args.tier,
            dpi=args.dpi,
            ocr_fallback=not args.no_ocr,
            page_timeout_s=args.page_timeout,
            doc_timeout_s=args.doc_timeout,
            page_render_dpi=page_render_dpi,
            backend_lanes=args.backend_lanes,
        )
    except ValueError as e:  # a bad flag value: say which, no traceback
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def cmd_parse(args: argparse.Namespace) -> int:
    from pipelines.jobs.parse_view import run_parse

    config = apply_sets(_parse_config(args), args.set)
    summary = run_parse(args.inputs, Path(args.out), config, save_crops=not args.no_crops, view=args.view)
    print(
        f"blocks: {summary['blocks']}  pages: {summary['pages']}  documents: {summary['documents']}  "
        f"quarantined: {summary['dropped']}  → {Path(args.out) / 'blocks.parquet'}"
    )
    if args.view:
        print(f"boxes drawn: {Path(args.out) / 'view' / 'index.html'}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    pa_ = sub.add_parser(
        "parse",
        help="parse PDFs only and write DIR/blocks.parquet (the parser's debugging view)",
        description="Run only the parsing stage: one row per block (doc_id, source, page_index, kind, "
        "x0, y0, x1, y1, text, crop_sha256, backend), crops as PNG files, and quarantine.",
    )
    pa_.add_argument("inputs", nargs="+", metavar="INPUT")
    pa_.add_argument("--out", required=True)
    pa_.add_argument("--no-crops", action="store_true", help="do not write crop PNGs")
    pa_.add_argument(
        "--view",
        action="store_true",
        help="also draw every page with its boxes, kinds and reading order into OUT/view/ (index.html + PNGs)",
    )
    _add_parse_options(pa_)
    add_set(pa_, "page_window=32 or limits.max_pages=500")
    pa_.set_defaults(func=cmd_parse)
