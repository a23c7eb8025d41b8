"""``scifolio review export|fit``: human review of the visual-gain thresholds.

scifolio review export OUT --out review/            # pages near each domain's threshold → HTML
scifolio review fit review/decisions-*.json --out thresholds.json
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

from pipelines.cli.options import add_set, apply_sets, default


def register(subparsers: Any) -> None:
    from visual_gain.review import ReviewConfig

    d = functools.partial(default, ReviewConfig)
    review = subparsers.add_parser(
        "review",
        help="export pages near the visual-gain threshold for review; fit thresholds to decisions",
        description="Human review of per-domain visual-gain thresholds (static HTML, no server).",
    )
    sub = review.add_subparsers(dest="review_command", required=True)

    ex = sub.add_parser(
        "export",
        help="write static HTML review pages for pages near each domain's threshold",
        description="Select scored pages near each domain's threshold (stratified on both sides) and write "
        "one self-contained HTML file per batch. Open them in a browser, click accept/reject, then "
        "'Save decisions' to download decisions-<batch>.json.",
    )
    ex.add_argument("dir", help="build output (or any folder/parquet file) holding scored page rows")
    ex.add_argument("--out", required=True, help="folder for batch-NNN.html and index.json")
    ex.add_argument("--thresholds", default=None, help="thresholds JSON (default: the packaged defaults)")
    ex.add_argument(
        "--per-domain", type=int, default=d("per_domain"), help=f"pages per domain (default {d('per_domain')})"
    )
    ex.add_argument(
        "--batch-size", type=int, default=d("batch_size"), help=f"pages per HTML file (default {d('batch_size')})"
    )
    ex.add_argument(
        "--strata", type=int, default=d("n_strata"), help=f"ΔH bands around the threshold (default {d('n_strata')})"
    )
    ex.add_argument("--margin", type=float, default=d("margin"), help="band half-width in nats (default: adaptive)")
    add_set(ex, "per_domain=80")
    ex.set_defaults(func=_export)

    fit = sub.add_parser(
        "fit",
        help="fit each domain's threshold to saved review decisions",
        description="Fit each reviewed domain's threshold to maximise agreement with the accept/reject "
        "decisions; print the agreement and write the thresholds file.",
    )
    fit.add_argument("decisions", nargs="+", help="decisions-*.json files saved from the review pages")
    fit.add_argument("--thresholds", default=None, help="thresholds to start from (default: packaged defaults)")
    fit.add_argument("--out", required=True, help="thresholds JSON to write")
    fit.set_defaults(func=_fit)


def _export(args: argparse.Namespace) -> int:
    from visual_gain.review import ReviewConfig, export_review, read_scored_pages
    from visual_gain.thresholds import Thresholds

    pages = list(read_scored_pages(args.dir))
    if not pages:
        print(f"no pages with visual-gain scores under {args.dir}")
        return 1
    cfg = ReviewConfig(per_domain=args.per_domain, n_strata=args.strata, margin=args.margin, batch_size=args.batch_size)
    cfg = apply_sets(cfg, args.set)
    paths = export_review(pages, args.out, Thresholds.load(args.thresholds), cfg)
    print(f"{len(pages)} scored pages → {len(paths)} review batch(es) in {args.out}")
    for p in paths:
        print(f"  {p}")
    return 0 if paths else 1


def _fit(args: argparse.Namespace) -> int:
    from visual_gain.review import fit_from_decisions, load_decisions
    from visual_gain.thresholds import Thresholds

    base = Thresholds.load(args.thresholds)
    decisions = load_decisions(args.decisions)
    if not decisions:
        print("no decisions in the given files")
        return 1
    new, fits = fit_from_decisions(decisions, base)
    print(f"{'domain':<20} {'n':>5} {'accept':>6} {'agreement':>9} {'threshold':>20}")
    for dom, f in fits.items():
        print(
            f"{dom:<20} {f.n:>5} {f.n_accept:>6} {f.agreement:>9.3f} {base.threshold_for(dom):>9.4f} → {f.threshold:.4f}"
        )
    new.save(args.out)
    print(f"wrote {args.out}")
    return 0
