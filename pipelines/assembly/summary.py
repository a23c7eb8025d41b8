"""What the manifest says about a build, gathered where the data already is.

:class:`BuildSummary` is made by the shard writers (from the per-document tables they stream: shard entry, doc ids,
visual-gain page scores) and by the quarantine writers (from the dead letters they sort), merged inside the
pipeline (``beam.CombineGlobally(CombineSummaries())``, as datatrove merges stats) and finished into counts
and histograms, so the driver only writes the manifest: it never reads a shard or the quarantine back.

:func:`collect_visual_gain` reads a finished build's shards and quarantine (for the report, which needs the
pages nearest each threshold).

    python -c "from pipelines.assembly.summary import collect_visual_gain; print(collect_visual_gain('out')[0])"
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from formats import fs
from formats.manifest import QUARANTINE_DIR
from formats.outcomes import is_filtered
from formats.quarantine import iter_quarantine
from formats.records import Dropped, page_id, split_page_id
from formats.scores import VisualGainScore
from formats.shards import ChunkRow, ShardFile, list_shards


@dataclass
class BuildSummary:
    """Mergeable facts of (part of) a build; ``merge`` is associative and commutative, so Beam may combine the
    parts in any order and on any worker."""

    shards: list[dict[str, Any]] = field(default_factory=list)
    quarantine: list[dict[str, Any]] = field(default_factory=list)
    by_reason: Counter = field(default_factory=Counter)
    docs_in_shards: set[str] = field(default_factory=set)
    doc_level: set[str] = field(default_factory=set)
    """Item ids of document-level final dead letters (quarantined documents, duplicates included)."""
    retryable: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)
    filtered: set[str] = field(default_factory=set)
    """Document-level dead letters written by policy (visual gain, dedup, decontamination): outcomes, not failures."""
    page_drops: dict[str, bool] = field(default_factory=dict)
    """page id → filtered? of every page-level dead letter (a page of a retryable document is not counted)."""
    pages: dict[str, tuple[float, float | None, bool | None, str]] = field(default_factory=dict)
    """page id → (ΔH nats, threshold, kept, domain) of every scored page, kept or dropped."""

    def merge(self, other: BuildSummary) -> BuildSummary:
        self.shards += other.shards
        self.quarantine += other.quarantine
        self.by_reason.update(other.by_reason)
        self.docs_in_shards |= other.docs_in_shards
        self.doc_level |= other.doc_level
        self.retryable |= other.retryable
        self.failed |= other.failed
        self.filtered |= other.filtered
        self.page_drops.update(other.page_drops)
        self.pages.update(other.pages)
        return self

    @classmethod
    def of_shard(cls, entry: dict[str, Any], chunks: Iterable[ChunkRow]) -> BuildSummary:
        """A written shard: its entry, the documents it holds, the scores of their pages (``chunks``: the rows
        the writer streamed, with their ``pages`` part)."""
        out = cls(shards=[entry])
        for chunk in chunks:
            out.docs_in_shards.add(chunk.doc_id)
            for page in chunk.pages:
                vg = VisualGainScore.of(page)
                if vg is not None:  # a page in the overlap of two chunks counts once (same id)
                    out.pages[page_id(chunk.doc_id, page.page_index)] = _page(vg)
        return out

    @classmethod
    def of_quarantine(cls, entry: dict[str, Any], rows: list[dict[str, Any]]) -> BuildSummary:
        """One stage's dead-letter file: its entry, reasons, which documents are out, dropped pages' scores."""
        out = cls(quarantine=[entry])
        for d in (Dropped.from_row(r) for r in rows):
            out.by_reason[f"{d.stage}.{d.reason}"] += 1
            if d.reason == "retryable":
                out.retryable.add(d.item_id)
            elif split_page_id(d.item_id) is None:
                out.doc_level.add(d.item_id)
                (out.filtered if is_filtered(d.stage, d.reason) else out.failed).add(d.item_id)
            else:
                out.page_drops[d.item_id] = is_filtered(d.stage, d.reason)
            if d.stage == "visual_gain" and d.detail.get("delta_h_nats") is not None:
                out.pages[d.item_id] = _page(replace(VisualGainScore.from_dict(d.detail), kept=False))
        return out

    def finish(self, visual_gain: bool, bins: int = 20) -> dict[str, Any]:
        """Counts and histograms only (what the manifest holds), JSON-ready: O(shards + stages + domains)."""
        pages = [f for pid, f in self.page_drops.items() if split_page_id(pid)[0] not in self.retryable]
        return {
            "shards": sorted(self.shards, key=lambda e: e["file"]),
            "quarantine": sorted(self.quarantine, key=lambda e: e["stage"]),
            "dropped_by_reason": dict(sorted(self.by_reason.items())),
            "documents_in_shards": len(self.docs_in_shards),
            "documents_quarantined": len(self.doc_level),
            "documents_retryable": len(self.retryable),
            "documents_failed": len(self.failed - self.retryable),
            "documents_filtered": len(self.filtered),
            "pages_failed": sum(1 for f in pages if not f),
            "pages_filtered": sum(1 for f in pages if f),
            "visual_gain": histograms(self.pages.values(), bins) if visual_gain else None,
        }


def _page(vg: VisualGainScore) -> tuple[float, float | None, bool | None, str]:
    return (float(vg.delta_h_nats), vg.threshold, vg.kept, vg.domain or "default")


def histograms(pages, bins: int = 20) -> dict[str, Any]:
    """Per-domain ΔH histogram and kept/dropped counts of ``(ΔH, threshold, kept, domain)`` page tuples."""
    by_domain: dict[str, list] = defaultdict(list)
    for p in pages:
        by_domain[p[3]].append(p)
    summary: dict[str, Any] = {}
    for domain, rows in sorted(by_domain.items()):
        values = [r[0] for r in rows]
        lo, hi = min(values), max(values)
        width = (hi - lo) / bins or 1.0
        counts = [0] * bins
        for v in values:
            counts[min(bins - 1, int((v - lo) / width))] += 1
        decided = [r for r in rows if r[1] is not None]
        summary[domain] = {
            "pages": len(values),
            "kept": sum(1 for r in decided if r[2]),
            "dropped": sum(1 for r in decided if not r[2]),
            "threshold": decided[0][1] if decided else None,
            "delta_h_nats": {"edges": [lo + i * width for i in range(bins + 1)], "counts": counts},
        }
    return summary


def collect_visual_gain(
    out: str | os.PathLike[str], shard_files: list[str] | None = None
) -> tuple[dict[str, list[float]], list[tuple[float, str, VisualGainScore]]]:
    """ΔH per domain, and (distance to threshold, page id, score) of every page with a threshold."""
    delta_h: dict[str, list[float]] = defaultdict(list)
    near: list[tuple[float, str, VisualGainScore]] = []
    seen: set[str] = set()
    for path in list_shards(out) if shard_files is None else shard_files:
        for chunk in ShardFile(path).iter_chunks(parts=("pages",)):
            for page in chunk.pages:
                pid = page_id(chunk.doc_id, page.page_index)
                vg = VisualGainScore.of(page)
                if vg is not None and pid not in seen:  # a page in the overlap of two chunks counts once
                    seen.add(pid)
                    _collect(pid, vg, delta_h, near)
    for d in iter_quarantine(fs.join(out, QUARANTINE_DIR)):
        if d.stage == "visual_gain" and d.detail.get("delta_h_nats") is not None:
            _collect(d.item_id, replace(VisualGainScore.from_dict(d.detail), kept=False), delta_h, near)
    return delta_h, near


def _collect(pid: str, vg: VisualGainScore, delta_h: dict[str, list[float]], near: list) -> None:
    domain = vg.domain or "default"
    delta_h[domain].append(float(vg.delta_h_nats))
    if vg.threshold is not None:
        near.append((abs(float(vg.delta_h_nats) - float(vg.threshold)), pid, replace(vg, domain=domain)))
