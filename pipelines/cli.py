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
from pathlib import Path

# Subcommand modules contributed by each area; each exposes register(subparsers).
_EXTENSIONS = ("pipelines.cli_review", "pipelines.cli_index", "pipelines.cli_pretrain", "pipelines.cli_posttrain")


def _add_parse_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("parsing")
    g.add_argument(
        "--backend",
        choices=["mineru", "pymupdf"],
        default="mineru",
        help="layout backend (default: mineru; scanned pages fall back to rapid-layout + RapidOCR)",
    )
    g.add_argument(
        "--tier",
        default="flash",
        choices=["flash", "basic", "standard"],
        help="MinerU tier (flash runs offline; basic/standard need MinerU's models)",
    )
    g.add_argument("--dpi", type=int, default=200, help="crop render DPI (default: 200)")
    g.add_argument("--no-ocr", action="store_true", help="do not OCR pages that have no text layer")
    g.add_argument("--page-timeout", type=float, default=60.0, help="seconds per page before it is quarantined")
    g.add_argument("--doc-timeout", type=float, default=600.0, help="seconds per document before it is quarantined")
    g.add_argument(
        "--backend-lanes",
        type=int,
        default=1,
        help="extra parser processes per parse worker for the windows of long documents (default 1; 0 = one "
        "process). The local default of Beam workers is cores / (1 + lanes)",
    )


def _parse_config(args: argparse.Namespace, page_render_dpi: int | None = None):
    from parsing import ParseConfig

    try:
        return ParseConfig(
            backend=args.backend,
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


def cmd_build(args: argparse.Namespace, beam_args: list[str]) -> int:
    from pipelines.build import BuildConfig
    from pipelines.chunk import DEFAULT_MAX_TOKENS
    from pipelines.corpus import run
    from pipelines.interleave import ImageTokenRule
    from pipelines.stages import visual_gain_config

    if args.overlap >= args.max_tokens:
        print(
            f"error: --overlap ({args.overlap}) must be smaller than --max-tokens ({args.max_tokens})", file=sys.stderr
        )
        return 2
    config = BuildConfig(
        tokenizer=args.tokenizer,
        max_tokens=args.max_tokens,
        overlap=args.overlap,
        image_tokens=ImageTokenRule(max_tokens=min(args.max_image_tokens, args.max_tokens or DEFAULT_MAX_TOKENS)),
        docs_per_shard=args.docs_per_shard,
        parse=_parse_config(args, args.page_render_dpi if args.page_renders else None),
        visual_gain=visual_gain_config(args),
    )
    if not any(a.startswith("--direct_num_workers") for a in beam_args) and not any(
        a.startswith("--runner") for a in beam_args
    ):
        from pipelines.corpus import local_beam_args

        beam_args = [*beam_args, *local_beam_args(config)]
    if not any(a.startswith("--default_sdk_harness_log_level") for a in beam_args):
        beam_args = [*beam_args, f"--default_sdk_harness_log_level={'INFO' if args.verbose else 'WARNING'}"]
    manifest = run(args.inputs, args.out, config, beam_args, progress=not args.no_progress)
    t = manifest["totals"]
    print(
        f"shards: {len(manifest['shards'])}  chunks: {t['chunks']}  tokens: {t['tokens']}  "
        f"documents in shards: {t['documents_in_shards']}  quarantined: {t['documents_quarantined']}  "
        f"({manifest['elapsed_s']} s)"
    )
    print("metrics:")
    for key, value in manifest["metrics"].items():
        print(f"  {key}: {value}")
    if manifest["dropped_by_reason"]:
        print("dropped:")
        for key, value in manifest["dropped_by_reason"].items():
            print(f"  {key}: {value}")
    print(f"manifest: {Path(args.out) / 'manifest.json'}")
    return 0


def cmd_parse(args: argparse.Namespace) -> int:
    from pipelines.parse_view import run_parse

    summary = run_parse(args.inputs, Path(args.out), _parse_config(args), save_crops=not args.no_crops)
    print(
        f"blocks: {summary['blocks']}  pages: {summary['pages']}  documents: {summary['documents']}  "
        f"quarantined: {summary['dropped']}  → {Path(args.out) / 'blocks.parquet'}"
    )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from pipelines.report import write_report

    path = write_report(Path(args.dir), pages_with_boxes=args.pages)
    print(path)
    return 0


def cmd_models_tiny(args: argparse.Namespace) -> int:
    from pipelines.tiny import write_tiny_tokenizer

    out = Path(args.dir)
    written = {"tokenizer": str(write_tiny_tokenizer(out / "tokenizer"))}
    for module, fn in (
        ("visual_gain.tiny", "write_tiny_visual_gain"),
        ("retrieval.tiny", "write_tiny_retrieval"),
        ("pretrain.tiny", "write_tiny_pretrain"),
        ("posttrain.tiny", "write_tiny_posttrain"),
    ):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith(module.split(".")[0]):
                continue  # that area is not installed in this distribution
            raise
        written.update(getattr(mod, fn)(out))
    for name, path in written.items():
        print(f"{name}: {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scifolio",
        description="Scientific PDFs → interleaved multimodal pre-training corpora, an image index, and training.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    b = sub.add_parser(
        "build",
        help="the corpus job: PDFs → parsed pages → crops → interleaved chunks → shards (Apache Beam)",
        description="Run the corpus job. INPUT: files, directories (every PDF below), globs, or Beam filesystem "
        "URLs (gs://, s3://). Unknown flags are Beam pipeline options (default runner: DirectRunner, "
        "multi-process). Reruns over the same inputs and config skip finished documents.",
        epilog="example: scifolio build ../shared/samples --out out --tokenizer tiny/tokenizer",
    )
    b.add_argument("inputs", nargs="+", metavar="INPUT")
    b.add_argument("--out", required=True, help="output directory (shards/, quarantine/, manifest.json)")
    b.add_argument(
        "--tokenizer",
        default="Qwen/Qwen2.5-VL-7B-Instruct",
        help="Hugging Face tokenizer name or local path (default: Qwen/Qwen2.5-VL-7B-Instruct)",
    )
    b.add_argument("--max-tokens", type=int, default=262_144, help="chunk cap C in tokens (default: 262144)")
    b.add_argument("--overlap", type=int, default=512, help="tokens shared by consecutive chunks (default: 512)")
    b.add_argument("--max-image-tokens", type=int, default=16384, help="token cap per image (default: 16384)")
    b.add_argument("--docs-per-shard", type=int, default=256, help="target documents per shard file")
    b.add_argument(
        "--page-renders",
        action="store_true",
        help="store whole-page renders in the shards (needed by the next-patch pre-training objective)",
    )
    b.add_argument("--page-render-dpi", type=int, default=72, help="DPI of page renders (default: 72)")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_parse_options(b)
    vg = b.add_argument_group("visual gain")
    vg.add_argument(
        "--visual-gain-model",
        default=None,
        help="VLM (Hugging Face name or local path) scoring each page's visual gain; pages below "
        "their domain threshold are dropped. Off when not given.",
    )
    vg.add_argument("--no-visual-gain", action="store_true", help="disable visual-gain scoring")
    vg.add_argument("--thresholds", default=None, help="per-domain thresholds file (from `scifolio review fit`)")
    vg.add_argument("--visual-gain-batch", type=int, default=8, help="pages per model batch")
    b.set_defaults(func=cmd_build, beam=True)

    pa_ = sub.add_parser(
        "parse",
        help="parse PDFs only and write DIR/blocks.parquet (the parser's debugging view)",
        description="Run only the parsing stage: one row per block (doc_id, source, page_index, kind, "
        "x0, y0, x1, y1, text, crop_sha256, backend), crops as PNG files, and quarantine.",
    )
    pa_.add_argument("inputs", nargs="+", metavar="INPUT")
    pa_.add_argument("--out", required=True)
    pa_.add_argument("--no-crops", action="store_true", help="do not write crop PNGs")
    _add_parse_options(pa_)
    pa_.set_defaults(func=cmd_parse)

    r = sub.add_parser("report", help="write DIR/report.html for a build output directory")
    r.add_argument("dir")
    r.add_argument("--pages", type=int, default=6, help="pages drawn with their layout boxes (default: 6)")
    r.set_defaults(func=cmd_report)

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

    for module in _EXTENSIONS:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name == module:
                continue
            raise
        mod.register(sub)
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
