"""``scifolio parse``: the parser's debugging view, one row per block in ``OUT/blocks.parquet``.

    scifolio parse ../shared/samples --out parsed/ --backend pymupdf

Runs only the parsing stage (same ``parsing.iter_parse`` as the Beam job), locally with a progress bar.
Crops are written as ``OUT/crops/<sha256>.png``; rejected documents/pages go to ``OUT/quarantine/parse.jsonl``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from formats import fs
from formats.records import Document, Dropped, Page

BLOCKS_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("source", pa.string()),
        ("page_index", pa.int32()),
        ("reading_order", pa.int32()),
        ("kind", pa.string()),
        ("x0", pa.float32()),
        ("y0", pa.float32()),
        ("x1", pa.float32()),
        ("y1", pa.float32()),
        ("text", pa.string()),
        ("latex", pa.string()),
        ("html", pa.string()),
        ("crop_sha256", pa.string()),
        ("caption_of", pa.int32()),
        ("backend", pa.string()),
        ("proposed_by", pa.string()),
        ("text_from", pa.string()),
    ]
)


def page_rows(page: Page) -> list[dict[str, Any]]:
    return [
        {
            "doc_id": page.doc_id,
            "source": page.source,
            "page_index": page.page_index,
            "reading_order": b.reading_order,
            "kind": b.kind,
            "x0": b.bbox[0],
            "y0": b.bbox[1],
            "x1": b.bbox[2],
            "y1": b.bbox[3],
            "text": b.text,
            "latex": b.latex,
            "html": b.html,
            "crop_sha256": b.crop.sha256 if b.crop else None,
            "caption_of": b.caption_of,
            "backend": page.parser,
            "proposed_by": b.proposed_by,
            "text_from": b.text_from,
        }
        for b in page.blocks
    ]


def write_view_index(view_dir: Path, pages: list[tuple[str, int, str]]) -> Path:
    """``view_dir/index.html``: every drawn page (source, page index, PNG name), grouped by document, with the
    colour legend of ``parsing.visualize``. Returns its path."""
    import html

    from parsing.visualize import COLOURS

    legend = " ".join(
        f'<span style="color:rgb({int(r * 255)},{int(g * 255)},{int(b * 255)})">&#9632; {k}</span>'
        for k, (r, g, b) in COLOURS.items()
    )
    parts = [
        "<!doctype html><meta charset=utf-8><title>scifolio parse: boxes</title>",
        "<style>body{font-family:sans-serif}img{border:1px solid #ccc;margin:4px;max-width:48%}</style>",
        f"<p>Each box is labelled &lt;reading order&gt;&lt;kind&gt;[&gt;&lt;caption of&gt;] [sources that proposed it, "
        f"the kept box's first]. {legend} "
        '<span style="color:grey">&#9632; other kinds</span></p>',
    ]
    current = None
    for source, index, name in pages:
        if source != current:
            parts.append(f"<h3>{html.escape(source)}</h3>")
            current = source
        parts.append(f'<img src="{html.escape(name)}" title="page {index}" alt="page {index}">')
    target = view_dir / "index.html"
    target.write_text("\n".join(parts) + "\n")
    return target


def run_parse(
    inputs: Sequence[str], out: Path, config: Any, save_crops: bool = True, view: bool = False
) -> dict[str, int]:
    """Parse ``inputs`` into ``out``; ``view``: also draw every page with its boxes, kinds and reading order
    into ``out/view/*.png`` and ``out/view/index.html`` (for a person to check a document at a glance)."""
    from tqdm import tqdm

    from parsing import iter_parse
    from pipelines.jobs.corpus import list_inputs

    out.mkdir(parents=True, exist_ok=True)
    (out / "quarantine").mkdir(exist_ok=True)
    crops_dir = out / "crops"
    if save_crops:
        crops_dir.mkdir(exist_ok=True)
    counts = {"documents": 0, "pages": 0, "blocks": 0, "dropped": 0}
    dropped: list[Dropped] = []
    drawn: list[tuple[str, int, str]] = []
    view_dir = out / "view"
    if view:
        from parsing.visualize import draw_boxes

        view_dir.mkdir(exist_ok=True)
    tmp = out / ".blocks.parquet.tmp"
    with pq.ParquetWriter(tmp, BLOCKS_SCHEMA, compression="zstd") as writer:
        for path in tqdm(list_inputs(inputs, series=False), desc="parse", unit="doc", file=sys.stderr):
            try:
                with FileSystems.open(path) as f:
                    data = f.read()
            except Exception as e:
                dropped.append(Dropped(path, "read", "unreadable", {"error": repr(e)}))
                continue
            for item in iter_parse(data, path, config):
                if isinstance(item, Document):
                    counts["documents"] += 1
                elif isinstance(item, Page):
                    rows = page_rows(item)
                    counts["pages"] += 1
                    counts["blocks"] += len(rows)
                    if rows:
                        writer.write_table(pa.Table.from_pylist(rows, schema=BLOCKS_SCHEMA))
                    if view:
                        name = f"{item.doc_id[:12]}_{Path(path).stem[:40]}_p{item.page_index:04d}.png"
                        (view_dir / name).write_bytes(draw_boxes(data, item, 100))
                        drawn.append((path, item.page_index, name))
                    if save_crops:
                        for crop in item.crops:
                            target = crops_dir / f"{crop.sha256}.png"
                            if not target.exists():
                                target.write_bytes(crop.png)
                else:
                    dropped.append(item)
    fs.commit(tmp, out / "blocks.parquet")
    if view:
        write_view_index(view_dir, drawn)
    counts["dropped"] = len(dropped)
    (out / "quarantine" / "parse.jsonl").write_text("".join(json.dumps(d.to_row()) + "\n" for d in dropped))
    return counts
