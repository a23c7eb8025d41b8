"""``scifolio posttrain tasks figures``: a verifiable multimodal task from a corpus build
(pipelines/assembly/figure_task.py).

    scifolio posttrain tasks figures --shards out/ --out tasks/figures
    scifolio eval --model VLM --task jsonl --data tasks/figures/test.jsonl --n 4 --k 1,4 --out fig.json

Writes DIR/train.jsonl and DIR/test.jsonl (disjoint documents; one multiple-choice "which caption belongs to this
figure/table?" row per captioned crop and "which expression does this equation show?" per equation whose text the
build kept, the crop inlined as a PNG data URL, the answer a letter for ``--verifier exact``) and DIR/summary.json
(rows and documents per split, crops skipped by reason), and prints the summary.
"""

from __future__ import annotations

import argparse
import json
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tasks", help="verifiable tasks made from a corpus build (figures: caption multiple choice)")
    kinds = p.add_subparsers(dest="tasks_command", metavar="TASK", required=True)
    f = kinds.add_parser(
        "figures",
        help="which caption belongs to this figure/table, which expression is this equation? (multiple choice)",
        description="One row per figure/table crop of a build whose labelled caption was kept, with distractor "
        "captions from other crops of the corpus, and one per equation crop whose text the build kept (LaTeX, "
        "text-layer glyphs or OCR; the row's text_from says which), with other equations' texts as distractors; "
        "train/test split by document; exact letter answers.",
    )
    f.add_argument("--shards", required=True, help="a build output directory (what `scifolio build --out` wrote)")
    f.add_argument("--out", required=True, help="directory for train.jsonl, test.jsonl and summary.json")
    f.add_argument("--seed", type=int, default=0, help="seeds the split, the distractors and the choice order")
    f.add_argument("--test-fraction", type=float, default=0.2, help="share of documents in test.jsonl (default 0.2)")
    f.add_argument("--choices", type=int, default=4, help="options per question (default 4)")
    f.add_argument(
        "--kinds", default="figure,table,equation", help="crop kinds to ask about (default figure,table,equation)"
    )
    f.add_argument(
        "--min-equation-chars", type=int, default=8, help="skip equations whose text is shorter, spaces aside (8)"
    )
    f.set_defaults(func=run_figures)


def run_figures(args: argparse.Namespace) -> int:
    from pipelines.assembly.figure_task import KINDS, FigureTaskConfig, write_figure_task

    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    if not kinds or set(kinds) - set(KINDS):
        print(f"error: --kinds takes {', '.join(KINDS)}, got {args.kinds!r}", file=sys.stderr)
        return 2
    cfg = FigureTaskConfig(
        seed=args.seed,
        test_fraction=args.test_fraction,
        choices=args.choices,
        kinds=kinds,
        min_equation_chars=args.min_equation_chars,
    )
    summary = write_figure_task(args.shards, args.out, cfg)
    rows, docs = summary["rows"], summary["documents"]
    skipped = ", ".join(f"{k} {v}" for k, v in sorted(summary["skipped"].items())) or "none"
    print(
        f"figure task: train {rows['train']} rows ({docs['train']} documents), test {rows['test']} rows "
        f"({docs['test']} documents); crops skipped: {skipped}; written to {args.out}"
    )
    print(json.dumps(summary))
    return 0
