"""Visual-gain summary of a build: ΔH per domain over kept pages (shards' page provenance) and dropped ones
(quarantine). The job writes it into the manifest; the report draws it. Reads formats only.

    python -c "from pipelines.assembly.summary import collect_visual_gain; print(collect_visual_gain('out')[0])"
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import replace
from typing import Any

from formats import fs
from formats.manifest import QUARANTINE_DIR
from formats.quarantine import iter_quarantine
from formats.scores import VisualGainScore
from formats.shards import ShardFile, list_shards


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
                pid = f"{chunk.doc_id}:{page.page_index}"
                vg = VisualGainScore.of(page)
                if vg is not None and pid not in seen:  # a page in the overlap of two chunks counts once
                    seen.add(pid)
                    _collect(pid, vg, delta_h, near)
    for d in iter_quarantine(fs.join(out, QUARANTINE_DIR)):
        if d.stage == "visual_gain" and d.detail.get("delta_h_nats") is not None:
            _collect(d.item_id, replace(VisualGainScore.from_dict(d.detail), kept=False), delta_h, near)
    return delta_h, near


def visual_gain_summary(
    out: str | os.PathLike[str], shard_files: list[str] | None = None, bins: int = 20
) -> dict[str, Any]:
    """Per-domain ΔH histogram and kept/dropped counts, for the manifest."""
    delta_h, near = collect_visual_gain(out, shard_files)
    summary: dict[str, Any] = {}
    for domain, values in sorted(delta_h.items()):
        lo, hi = min(values), max(values)
        width = (hi - lo) / bins or 1.0
        counts = [0] * bins
        for v in values:
            counts[min(bins - 1, int((v - lo) / width))] += 1
        rows = [r for _, _, r in near if r.domain == domain]
        summary[domain] = {
            "pages": len(values),
            "kept": sum(1 for r in rows if r.kept),
            "dropped": sum(1 for r in rows if not r.kept),
            "threshold": rows[0].threshold if rows else None,
            "delta_h_nats": {"edges": [lo + i * width for i in range(bins + 1)], "counts": counts},
        }
    return summary


def _collect(pid: str, vg: VisualGainScore, delta_h: dict[str, list[float]], near: list) -> None:
    domain = vg.domain or "default"
    delta_h[domain].append(float(vg.delta_h_nats))
    if vg.threshold is not None:
        near.append((abs(float(vg.delta_h_nats) - float(vg.threshold)), pid, replace(vg, domain=domain)))
