"""Human review of the visual-gain threshold: export pages near it, fit it to the decisions.

``export_review`` picks, per domain, the pages whose ΔH lies nearest the domain's threshold, stratified
over bands on both sides of it, and writes one self-contained static HTML file per batch (page render,
crops, text, scores as data URIs; no server, no network). Accept/reject buttons record decisions in the
page; "Save decisions" downloads ``decisions-<batch>.json``. ``fit_from_decisions`` reads those files
and fits each domain's threshold (``thresholds.fit_threshold``: maximal agreement).

Scored pages (kept and dropped alike) are read from parquet files of ``Page.to_row()`` rows, written by
``write_scored_pages`` (the build job puts them under ``OUT/visual_gain/``).

    scifolio review export OUT --out review/
    scifolio review fit review/decisions-*.json --out thresholds.json
"""

from __future__ import annotations

import base64
import json
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from formats import fs
from formats.records import Page
from formats.scores import VisualGainScore

from .thresholds import FitResult, Thresholds, fit_threshold, page_domain, page_text

TEMPLATE = Path(__file__).with_name("review_template.html")
DECISIONS_FORMAT = "scifolio.review.decisions/1"
PAGE_COLUMNS = {"doc_id", "page_index", "blocks", "scores"}


@dataclass(frozen=True)
class ReviewConfig:
    """What ``review export`` selects and how it batches."""

    per_domain: int = 40
    """Pages exported per domain (fewer when a domain has fewer scored pages with visuals)."""
    n_strata: int = 4
    """Bands of ΔH − threshold, half below and half above the threshold, sampled round-robin."""
    margin: float | None = None
    """Half-width of the band around the threshold; None: the distance of the 2·per_domain-th nearest page."""
    batch_size: int = 20
    """Pages per HTML file (one reviewer sitting)."""


# -- scored page files ---------------------------------------------------------------------------
def write_scored_pages(pages: Iterable[Page], path: str | Path) -> str:
    """Pages (carrying a ``VisualGainScore``) as one parquet file of ``Page.to_row()`` rows, committed whole
    (local path or object-store URL)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with fs.open_output(path) as f:
        pq.write_table(pa.Table.from_pylist([p.to_row() for p in pages]), f)
    return str(path)


def read_scored_pages(root: str | Path) -> Iterator[Page]:
    """Every page with visual-gain scores in parquet files under ``root`` holding page rows."""
    import pyarrow.parquet as pq

    root = str(root)
    files = [root] if root.endswith(".parquet") else fs.glob(fs.join(root, "**", "*.parquet"))
    for f in files:
        with fs.open_input(f) as fh:
            pf = pq.ParquetFile(fh)
            if not PAGE_COLUMNS.issubset(pf.schema_arrow.names):
                continue  # shards and other tables live beside page files
            for batch in pf.iter_batches(batch_size=64):
                for row in batch.to_pylist():
                    page = Page.from_row(row)
                    if VisualGainScore.of(page) is not None:
                        yield page


# -- selection -----------------------------------------------------------------------------------
def select_for_review(
    pages: Sequence[Page], thresholds: Thresholds, config: ReviewConfig = ReviewConfig()
) -> dict[str, list[Page]]:
    """domain → pages near its threshold, stratified over bands of ΔH − threshold, nearest first per band.

    Only pages with visuals and text are reviewable (the others' fate does not depend on the threshold).
    """
    by_domain: dict[str, list[tuple[float, Page]]] = defaultdict(list)
    for p in pages:
        vg = VisualGainScore.of(p)
        if vg is None or vg.n_images == 0 or vg.n_text_tokens == 0:
            continue
        dom = vg.domain or page_domain(p)
        by_domain[dom].append((vg.delta_h_nats - thresholds.threshold_for(dom), p))
    half = max(1, config.n_strata // 2)
    out: dict[str, list[Page]] = {}
    for dom, items in sorted(by_domain.items()):
        items.sort(key=lambda x: abs(x[0]))
        if config.margin is not None:
            m = config.margin
        else:
            m = abs(items[min(len(items), 2 * config.per_domain) - 1][0])
        m = m if m > 0 else 1e-12
        # bands ordered near-above, near-below, next-above, next-below, ...: the round robin then
        # alternates sides, so both sides of the threshold are equally represented
        bands: list[list[tuple[float, Page]]] = [[] for _ in range(2 * half)]
        for d, p in items:
            if abs(d) > m:
                continue
            k = min(int(abs(d) / m * half), half - 1)
            bands[2 * k + (0 if d >= 0 else 1)].append((d, p))
        picked: list[tuple[float, Page]] = []
        while len(picked) < config.per_domain and any(bands):
            for band in bands:
                if band and len(picked) < config.per_domain:
                    picked.append(band.pop(0))
        picked.sort(key=lambda x: x[0])
        out[dom] = [
            replace(VisualGainScore.of(p), domain=dom, threshold=thresholds.threshold_for(dom)).on(p) for _, p in picked
        ]
    return out


# -- export --------------------------------------------------------------------------------------
def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def review_item(page: Page) -> dict[str, Any]:
    vg = VisualGainScore.of(page).to_dict()
    return {
        "page_id": page.page_id,
        "source": page.source,
        "page_index": page.page_index,
        "domain": vg["domain"],
        "threshold": vg["threshold"],
        "delta_h_nats": vg["delta_h_nats"],
        "scores": {
            k: vg[k]
            for k in (
                "ppl_text",
                "ppl_inter",
                "delta_h_nats",
                "delta_h_bits",
                "page_bits",
                "n_text_tokens",
                "n_images",
                "model",
            )
        },
        "render": _data_uri(page.render.png) if page.render is not None else None,
        "crops": [_data_uri(b.crop.png) for kind, b in page.content() if kind == "image" and b.crop is not None],
        "text": page_text(page),
    }


def render_batch_html(batch_name: str, items: Sequence[dict[str, Any]]) -> str:
    data = json.dumps({"batch": batch_name, "format": DECISIONS_FORMAT, "items": list(items)})
    # inside <script> only "</" can end the element early; JSON allows the escaped form
    data = data.replace("</", "<\\/")
    return TEMPLATE.read_text().replace("__TITLE__", f"scifolio review {batch_name}").replace("__REVIEW_DATA__", data)


def export_review(
    pages: Sequence[Page], out_dir: str | Path, thresholds: Thresholds, config: ReviewConfig = ReviewConfig()
) -> list[Path]:
    """Write ``batch-NNN.html`` files (domains interleaved in each batch) and ``index.json``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    selected = select_for_review(pages, thresholds, config)
    # interleave domains so a reviewer's batch is not one domain's low tail
    queues = [list(v) for v in selected.values()]
    ordered: list[Page] = []
    while any(queues):
        for q in queues:
            if q:
                ordered.append(q.pop(0))
    paths = []
    for b, start in enumerate(range(0, len(ordered), config.batch_size)):
        name = f"batch-{b:03d}"
        items = [review_item(p) for p in ordered[start : start + config.batch_size]]
        path = out_dir / f"{name}.html"
        path.write_text(render_batch_html(name, items), encoding="utf-8")
        paths.append(path)
    index = {
        "format": "scifolio.review.index/1",
        "batches": [p.name for p in paths],
        "per_domain": {d: len(v) for d, v in selected.items()},
        "thresholds": dict(thresholds.by_domain),
    }
    (out_dir / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    return paths


# -- fit -----------------------------------------------------------------------------------------
def load_decisions(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """All decisions of the given files; a page decided twice keeps its last decision (files in order)."""
    latest: dict[str, dict[str, Any]] = {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        if data.get("format") != DECISIONS_FORMAT:
            raise ValueError(f"{path}: not a decisions file (format {data.get('format')!r})")
        for d in data["decisions"]:
            if d["decision"] not in ("accept", "reject"):
                raise ValueError(f"{path}: decision must be accept|reject, got {d['decision']!r}")
            latest[d["page_id"]] = d
    return list(latest.values())


def fit_from_decisions(
    decisions: Sequence[dict[str, Any]], base: Thresholds
) -> tuple[Thresholds, dict[str, FitResult]]:
    """Refit every domain that has decisions; other domains keep ``base``'s thresholds."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for d in decisions:
        groups[d["domain"]].append(d)
    fits = {
        dom: fit_threshold([float(d["delta_h_nats"]) for d in ds], [d["decision"] == "accept" for d in ds])
        for dom, ds in sorted(groups.items())
    }
    by = {**base.by_domain, **{dom: f.threshold for dom, f in fits.items()}}
    record = {
        **base.fit,
        **{
            dom: {"n": f.n, "n_accept": f.n_accept, "agreement": f.agreement, "previous": base.threshold_for(dom)}
            for dom, f in fits.items()
        },
    }
    return replace(base, by_domain=by, fit=record), fits
