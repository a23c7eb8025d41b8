"""``scifolio report OUT``: a self-contained ``OUT/report.html`` for a build output directory.

Counts and dead letters from the manifest, crop thumbnails per kind, a tokens-per-chunk histogram,
the visual-gain ΔH histogram per domain with the pages nearest their threshold, and a few pages
rendered with their layout boxes drawn (boxes from the shards' page provenance, pixels from the source PDFs).
It reads the manifest and the shards only (and the source PDFs, when they are still there, to draw pages).

    scifolio report out/
"""

from __future__ import annotations

import html
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from formats import fs
from formats.chat_images import data_url
from formats.manifest import Manifest
from formats.shards import PageInfo, ShardFile, list_shards
from pipelines.assembly.summary import collect_visual_gain


def svg_histogram(
    values: Sequence[float],
    bins: int = 20,
    width: int = 520,
    height: int = 180,
    label: str = "",
    marker: float | None = None,
) -> str:
    """A dependency-free SVG histogram (with an optional vertical marker, e.g. a threshold)."""
    if not values:
        return "<p><em>no data</em></p>"
    lo, hi = min(values), max(values)
    if marker is not None:
        lo, hi = min(lo, marker), max(hi, marker)
    if math.isclose(lo, hi):
        lo, hi = lo - 0.5, hi + 0.5
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, int((v - lo) / (hi - lo) * bins))] += 1
    top = max(counts)
    bw = (width - 40) / bins
    bars = "".join(
        f'<rect x="{30 + i * bw:.1f}" y="{height - 20 - c / top * (height - 40):.1f}" width="{bw - 1:.1f}" '
        f'height="{c / top * (height - 40):.1f}" fill="#268bd2"><title>{c}</title></rect>'
        for i, c in enumerate(counts)
    )
    mark = ""
    if marker is not None:
        x = 30 + (marker - lo) / (hi - lo) * (width - 40)
        mark = f'<line x1="{x:.1f}" x2="{x:.1f}" y1="10" y2="{height - 20}" stroke="#dc322f" stroke-dasharray="4"/>'
    return (
        f'<svg width="{width}" height="{height}" role="img" aria-label="{html.escape(label)}">{bars}{mark}'
        f'<text x="30" y="{height - 4}" font-size="11">{lo:.4g}</text>'
        f'<text x="{width - 60}" y="{height - 4}" font-size="11">{hi:.4g}</text>'
        f'<text x="30" y="12" font-size="11">max {top} · n={len(values)} {html.escape(label)}</text></svg>'
    )


def _img_tag(png: bytes, max_w: int = 180) -> str:
    return f'<img src="{data_url(png)}" style="max-width:{max_w}px;max-height:{max_w}px">'


def _draw_page(source: str, page: PageInfo, dpi: int = 60) -> bytes | None:
    """A page of the source PDF with its layout boxes drawn (None if the PDF is gone)."""
    from formats.records import Block, Page
    from parsing.visualize import draw_boxes

    if not source or not fs.exists(source):
        return None
    blocks = tuple(Block(kind=b.kind, bbox=b.bbox, reading_order=i) for i, b in enumerate(page.blocks))
    record = Page("", page.page_index, page.width, page.height, blocks, parser=page.parser)
    return draw_boxes(fs.read_bytes(source), record, dpi=dpi)


def write_report(out: str | Path, pages_with_boxes: int = 6, thumbs_per_kind: int = 8) -> str:
    """Write ``OUT/report.html`` (OUT local or an object-store URL) and return its path."""
    manifest = Manifest.read(out)
    shard_files = list_shards(out)
    parts: list[str] = [
        f"<h1>scifolio build report</h1><p>{html.escape(str(out))} · "
        f"config {manifest.config_hash} · parser {html.escape(manifest.parser_version)}</p>"
    ]

    totals = asdict(manifest.totals)
    parts.append(
        "<h2>Counts</h2><table>"
        + "".join(f"<tr><td>{html.escape(k)}</td><td>{v}</td></tr>" for k, v in totals.items())
        + "</table>"
    )
    parts.append(
        "<h2>Dropped, by stage and reason</h2><table>"
        + (
            "".join(f"<tr><td>{html.escape(k)}</td><td>{v}</td></tr>" for k, v in manifest.dropped_by_reason.items())
            or "<tr><td>nothing dropped</td></tr>"
        )
        + "</table>"
    )

    # tokens per chunk and crop thumbnails, streamed from the shards
    tokens: list[float] = []
    thumbs: dict[str, list[bytes]] = defaultdict(list)
    for path in shard_files:
        for chunk in ShardFile(path).iter_chunks(parts=("images",)):
            tokens.append(chunk.n_tokens)
            for img in chunk.images:
                if len(thumbs[img.kind]) < thumbs_per_kind:
                    thumbs[img.kind].append(img.png)
    delta_h, near = collect_visual_gain(out, shard_files)

    parts.append("<h2>Tokens per chunk</h2>" + svg_histogram(tokens, label="tokens/chunk"))
    parts.append("<h2>Crops by kind</h2>")
    for kind, pngs in sorted(thumbs.items()):
        parts.append(f"<h3>{html.escape(kind)}</h3><div class=grid>" + "".join(_img_tag(p) for p in pngs) + "</div>")
    if not thumbs:
        parts.append("<p><em>no crops in the shards</em></p>")

    if delta_h:
        parts.append("<h2>Visual gain: ΔH (nats/token) per domain</h2>")
        for domain, values in sorted(delta_h.items()):
            thr = next((r.threshold for _, _, r in near if r.domain == domain and r.threshold is not None), None)
            parts.append(f"<h3>{html.escape(domain)}</h3>" + svg_histogram(values, label=domain, marker=thr))
        near.sort(key=lambda x: x[0])
        parts.append(
            "<h3>Pages nearest their threshold</h3><table><tr><th>page</th><th>domain</th><th>ΔH</th>"
            "<th>threshold</th><th>kept</th></tr>"
            + "".join(
                f"<tr><td>{html.escape(pid)}</td><td>{html.escape(str(r.domain))}</td>"
                f"<td>{r.delta_h_nats:.4f}</td><td>{r.threshold}</td><td>{r.kept}</td></tr>"
                for _, pid, r in near[:20]
            )
            + "</table>"
        )

    parts.append("<h2>Pages with their layout boxes</h2><div class=grid>")
    drawn = 0
    # prefer pages that hold cropped regions (that is what the boxes are for), two per document at most
    for path in shard_files:
        if drawn >= pages_with_boxes:
            break
        by_doc: dict[str, tuple[str, dict[int, PageInfo]]] = {}
        for chunk in ShardFile(path).iter_chunks(parts=("pages", "meta")):
            src, pages = by_doc.setdefault(chunk.doc_id, (str(chunk.meta.get("source", "")), {}))
            pages.update({p.page_index: p for p in chunk.pages})
        for source, pages in by_doc.values():
            ranked = sorted(pages.values(), key=lambda p: (-sum(b.crop is not None for b in p.blocks), p.page_index))
            for page in ranked[: min(2, pages_with_boxes - drawn)]:
                png = _draw_page(source, page)
                if png is None:
                    continue
                parts.append(
                    f"<figure>{_img_tag(png, 420)}<figcaption>{html.escape(Path(source).name)} "
                    f"p.{page.page_index} ({html.escape(page.parser)})</figcaption></figure>"
                )
                drawn += 1
            if drawn >= pages_with_boxes:
                break
    parts.append("</div>")
    from parsing.visualize import COLOURS

    legend = (
        " ".join(f'<span style="color:rgb{tuple(round(255 * v) for v in c)}">■ {k}</span>' for k, c in COLOURS.items())
        + ' <span style="color:grey">■ other blocks</span>'
    )

    parts.append(f"<p>{legend}</p>")

    doc = (
        "<!doctype html><html><head><meta charset=utf-8><title>scifolio report</title><style>"
        "body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse}"
        "td,th{border:1px solid #ddd;padding:2px 8px;text-align:left}.grid{display:flex;flex-wrap:wrap;gap:8px}"
        "figure{margin:0}</style></head><body>" + "".join(parts) + "</body></html>"
    )
    path = fs.join(out, "report.html")
    fs.write_text(path, doc)
    return path
