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
        }
        for b in page.blocks
    ]


def run_parse(inputs: Sequence[str], out: Path, config: Any, save_crops: bool = True) -> dict[str, int]:
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
    tmp = out / ".blocks.parquet.tmp"
    with pq.ParquetWriter(tmp, BLOCKS_SCHEMA, compression="zstd") as writer:
        for path in tqdm(list_inputs(inputs), desc="parse", unit="doc", file=sys.stderr):
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
                    if save_crops:
                        for crop in item.crops:
                            target = crops_dir / f"{crop.sha256}.png"
                            if not target.exists():
                                target.write_bytes(crop.png)
                else:
                    dropped.append(item)
    tmp.replace(out / "blocks.parquet")
    counts["dropped"] = len(dropped)
    (out / "quarantine" / "parse.jsonl").write_text("".join(json.dumps(d.to_row()) + "\n" for d in dropped))
    return counts
