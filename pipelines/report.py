"""``scifolio report OUT``: a self-contained ``OUT/report.html`` for a build output directory.

Counts and dead letters from the manifest, crop thumbnails per kind, a tokens-per-chunk histogram,
the visual-gain ΔH histogram per domain with the pages nearest their threshold, and a few pages
rendered with their layout boxes drawn (from the job's layout sidecars and the source PDFs).
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from pipelines.assembly.build import iter_quarantine


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
    return f'<img src="data:image/png;base64,{base64.b64encode(png).decode()}" style="max-width:{max_w}px;max-height:{max_w}px">'


def _iter_shard_rows(out: Path, manifest: dict[str, Any], columns: list[str]) -> Iterable[dict[str, Any]]:
    for entry in manifest.get("shards", []):
        pf = pq.ParquetFile(out / "shards" / entry["file"])
        for batch in pf.iter_batches(batch_size=32, columns=columns):
            yield from batch.to_pylist()


def _draw_page(source: str, page: dict[str, Any], dpi: int = 60) -> bytes | None:
    """A page of the source PDF with the boxes of its layout sidecar drawn (None if the PDF is gone)."""
    from formats.records import Block, Page
    from parsing.visualize import draw_boxes

    if not Path(source).is_file():
        return None
    blocks = tuple(Block(kind=b["kind"], bbox=b["bbox"], reading_order=i) for i, b in enumerate(page["blocks"]))
    record = Page("", page["page_index"], page["width"], page["height"], blocks, parser=page["parser"])
    return draw_boxes(Path(source).read_bytes(), record, dpi=dpi)


def write_report(out: Path, pages_with_boxes: int = 6, thumbs_per_kind: int = 8) -> Path:
    manifest_path = out / "manifest.json"
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{manifest_path} not found: run `scifolio build ... --out {out}` first")
    manifest = json.loads(manifest_path.read_text())
    parts: list[str] = [
        f"<h1>scifolio build report</h1><p>{html.escape(str(out.resolve()))} · "
        f"config {manifest['config_hash']} · parser {html.escape(manifest['parser_version'])}</p>"
    ]

    totals = manifest["totals"]
    parts.append(
        "<h2>Counts</h2><table>"
        + "".join(f"<tr><td>{html.escape(k)}</td><td>{v}</td></tr>" for k, v in totals.items())
        + "</table>"
    )
    parts.append(
        "<h2>Dropped, by stage and reason</h2><table>"
        + (
            "".join(f"<tr><td>{html.escape(k)}</td><td>{v}</td></tr>" for k, v in manifest["dropped_by_reason"].items())
            or "<tr><td>nothing dropped</td></tr>"
        )
        + "</table>"
    )

    # tokens per chunk and crop thumbnails, streamed from the shards
    tokens: list[float] = []
    thumbs: dict[str, list[bytes]] = defaultdict(list)
    for row in _iter_shard_rows(out, manifest, ["n_tokens", "images"]):
        tokens.append(row["n_tokens"])
        for img in row["images"]:
            if len(thumbs[img["kind"]]) < thumbs_per_kind:
                thumbs[img["kind"]].append(img["png"])
    delta_h, near = collect_visual_gain(out, manifest)

    parts.append("<h2>Tokens per chunk</h2>" + svg_histogram(tokens, label="tokens/chunk"))
    parts.append("<h2>Crops by kind</h2>")
    for kind, pngs in sorted(thumbs.items()):
        parts.append(f"<h3>{html.escape(kind)}</h3><div class=grid>" + "".join(_img_tag(p) for p in pngs) + "</div>")
    if not thumbs:
        parts.append("<p><em>no crops in the shards</em></p>")

    if delta_h:
        parts.append("<h2>Visual gain: ΔH (nats/token) per domain</h2>")
        for domain, values in sorted(delta_h.items()):
            thr = next(
                (t for _, _, r in near if r.get("domain") == domain and (t := r.get("threshold")) is not None), None
            )
            parts.append(f"<h3>{html.escape(domain)}</h3>" + svg_histogram(values, label=domain, marker=thr))
        near.sort(key=lambda x: x[0])
        parts.append(
            "<h3>Pages nearest their threshold</h3><table><tr><th>page</th><th>domain</th><th>ΔH</th>"
            "<th>threshold</th><th>kept</th></tr>"
            + "".join(
                f"<tr><td>{html.escape(pid)}</td><td>{html.escape(str(r.get('domain')))}</td>"
                f"<td>{r.get('delta_h_nats', float('nan')):.4f}</td><td>{r.get('threshold')}</td>"
                f"<td>{r.get('kept')}</td></tr>"
                for _, pid, r in near[:20]
            )
            + "</table>"
        )

    parts.append("<h2>Pages with their layout boxes</h2><div class=grid>")
    drawn = 0
    work = out / "_work" / manifest["config_hash"]
    for layout_path in sorted(work.glob("*/*.layout.json")):
        if drawn >= pages_with_boxes:
            break
        layout = json.loads(layout_path.read_text())
        # prefer pages that hold cropped regions: that is what the boxes are for
        pages = sorted(layout["pages"], key=lambda p: -sum(b["crop"] is not None for b in p["blocks"]))
        for page in pages[: min(2, pages_with_boxes - drawn)]:
            png = _draw_page(layout["source"], page)
            if png is None:
                continue
            parts.append(
                f"<figure>{_img_tag(png, 420)}<figcaption>{html.escape(Path(layout['source']).name)} "
                f"p.{page['page_index']} ({html.escape(page['parser'])})</figcaption></figure>"
            )
            drawn += 1
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
    path = out / "report.html"
    path.write_text(doc)
    return path


def collect_visual_gain(out: Path, manifest: dict[str, Any]) -> tuple[dict[str, list[float]], list]:
    """ΔH per domain over kept pages (shards' page provenance) and dropped ones (quarantine), and the
    (distance to threshold, page id, scores) of every page, for "nearest the threshold" listings."""
    delta_h: dict[str, list[float]] = defaultdict(list)
    near: list[tuple[float, str, dict[str, Any]]] = []
    seen: set[str] = set()
    for row in _iter_shard_rows(out, manifest, ["doc_id", "pages"]):
        for page in row["pages"]:
            pid = f"{row['doc_id']}:{page['page_index']}"
            vg = json.loads(page["scores"] or "{}").get("visual_gain")
            if vg and pid not in seen:  # a page in the overlap of two chunks counts once
                seen.add(pid)
                _collect_vg(pid, vg, delta_h, near)
    for d in iter_quarantine(out / "quarantine"):
        if d.stage == "visual_gain":
            _collect_vg(d.item_id, {**dict(d.detail), "kept": False}, delta_h, near)
    return delta_h, near


def visual_gain_summary(out: Path, manifest: dict[str, Any], bins: int = 20) -> dict[str, Any]:
    """Per-domain ΔH histogram and kept/dropped counts, for the manifest."""
    delta_h, near = collect_visual_gain(out, manifest)
    summary: dict[str, Any] = {}
    for domain, values in sorted(delta_h.items()):
        lo, hi = min(values), max(values)
        width = (hi - lo) / bins or 1.0
        counts = [0] * bins
        for v in values:
            counts[min(bins - 1, int((v - lo) / width))] += 1
        rows = [r for _, _, r in near if r.get("domain") == domain]
        summary[domain] = {
            "pages": len(values),
            "kept": sum(1 for r in rows if r.get("kept")),
            "dropped": sum(1 for r in rows if not r.get("kept")),
            "threshold": rows[0].get("threshold") if rows else None,
            "delta_h_nats": {"edges": [lo + i * width for i in range(bins + 1)], "counts": counts},
        }
    return summary


def _collect_vg(pid: str, vg: dict[str, Any], delta_h: dict[str, list[float]], near: list) -> None:
    value = vg.get("delta_h_nats")
    if value is None:
        return
    domain = str(vg.get("domain", "default"))
    delta_h[domain].append(float(value))
    thr = vg.get("threshold")
    if thr is not None:
        near.append((abs(float(value) - float(thr)), pid, {**vg, "domain": domain}))
