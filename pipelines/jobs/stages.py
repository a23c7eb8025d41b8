"""Adapters from stage code to the corpus job's slots (Beam-free; called inside DoFn.setup).

The visual-gain slot sits between parsing and interleaving: a page filter that scores a document's
pages with the VLM in batches and keeps those at or above their domain's threshold. The corpus job scores
through Beam's RunInference (``pipelines.jobs.corpus.VisualGainScoring``) and decides with
``VisualGainDecider``; ``VisualGainFilter`` does both in one call, with the same ``run_batch`` per document.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from formats.records import Document, Dropped, Page


@dataclass(frozen=True)
class VisualGainSlot:
    """What the corpus job needs to build the visual-gain stage on a worker."""

    scorer: Any
    """visual_gain.scorer.VisualGainConfig."""
    thresholds_path: str | None = None
    """Per-domain thresholds file; None = the built-in defaults."""
    export_dir: str | None = None
    """Where every scored page (kept or dropped) is saved per document, for `scifolio review export`."""


def visual_gain_config(args: argparse.Namespace) -> VisualGainSlot | None:
    if args.no_visual_gain or not args.visual_gain_model:
        return None
    import os

    from formats import fs
    from visual_gain.scorer import VisualGainConfig

    return VisualGainSlot(
        scorer=VisualGainConfig(
            model=args.visual_gain_model,
            batch_size=args.visual_gain_batch,
            local_files_only=os.path.isdir(args.visual_gain_model),
        ),
        thresholds_path=args.thresholds,
        export_dir=fs.join(args.out, "visual_gain"),
    )


class VisualGainDecider:
    """The model-free half of the visual-gain slot: exports a document's scored pages for review, finds its
    domain and applies the thresholds. The corpus job runs it after its RunInference step."""

    def __init__(self, slot: VisualGainSlot):
        from visual_gain.thresholds import Thresholds

        self.thresholds = Thresholds.load(slot.thresholds_path)
        self.export_dir = slot.export_dir

    def _export(self, doc_id: str, pages: list[Page]) -> None:
        """Scored pages of one document, committed whole (reruns overwrite with identical content)."""
        from formats import fs
        from visual_gain.review import write_scored_pages

        write_scored_pages(pages, fs.join(self.export_dir, doc_id[:2], f"{doc_id}.parquet"))

    def __call__(self, document: Document, scored: Sequence[Page]) -> tuple[list[Page], list[Dropped]]:
        from visual_gain.thresholds import domain_of, page_text

        scored = list(scored)
        if self.export_dir:
            self._export(document.doc_id, scored)
        # One domain per document (metadata first, else the lexicon over the whole document's text).
        domain = domain_of(document.meta, "\n".join(page_text(p) for p in scored))
        kept: list[Page] = []
        dropped: list[Dropped] = []
        for page in scored:
            decision = self.thresholds.decide(page, domain)
            (dropped if isinstance(decision, Dropped) else kept).append(decision)
        return kept, dropped


class VisualGainFilter:
    """The whole slot in one call (the direct path: unit tests, benchmarks): loads the model once, scores a
    document's pages in one ``run_batch``, then decides as ``VisualGainDecider``."""

    def __init__(self, slot: VisualGainSlot):
        from visual_gain.scorer import VisualGainScorer

        self.scorer = VisualGainScorer(slot.scorer)
        self.model = self.scorer.load()
        self.decide = VisualGainDecider(slot)

    def __call__(self, document: Document, pages: Sequence[Page]) -> tuple[list[Page], list[Dropped]]:
        return self.decide(document, self.scorer.run_batch(list(pages), self.model))
