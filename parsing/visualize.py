"""Draw a parsed page's boxes over its render, to look at box quality.

    python -m parsing.visualize paper.pdf --out /tmp/boxes [--backend pymupdf] [--dpi 72]

writes ``/tmp/boxes/<stem>_p<page>.png`` with figures red, tables green, equations blue, captions orange,
titles purple, other blocks grey; each box is labelled ``<reading order><kind>[><caption_of>]``, and with the fused layout ``[sources]``: the
backends that proposed it, the one whose box was kept first (``rules`` = MinerU + layout rules, ``yolo``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from formats.records import Page

COLOURS = {
    "figure": (1, 0, 0),
    "table": (0, 0.6, 0),
    "equation": (0, 0, 1),
    "caption": (1, 0.5, 0),
    "title": (0.6, 0, 0.6),
}


def draw_boxes(pdf_bytes: bytes, page: Page, dpi: int = 72) -> bytes:
    """PNG of ``page`` (rendered from ``pdf_bytes``) with its blocks drawn on top."""
    import pymupdf

    doc = pymupdf.open(stream=pdf_bytes)
    p = doc[page.page_index]
    for b in page.blocks:
        colour = COLOURS.get(b.kind, (0.55, 0.55, 0.55))
        p.draw_rect(pymupdf.Rect(b.bbox), color=colour, width=1.5 if b.kind in COLOURS else 0.5)
        label = f"{b.reading_order}{b.kind[:3]}" + (f">{b.caption_of}" if b.caption_of is not None else "")
        if b.proposed_by:  # the fused layout: which sources proposed the box, the kept box's first
            label += f" [{b.proposed_by}]"
        p.insert_text((b.bbox[0] + 1, b.bbox[1] + 6), label, fontsize=6, color=colour)
    return p.get_pixmap(dpi=dpi).tobytes("png")


def main(argv: list[str] | None = None) -> int:
    from parsing import Dropped, ParseConfig, iter_parse

    ap = argparse.ArgumentParser(
        prog="python -m parsing.visualize", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("pdf", nargs="+", help="PDF files to parse and draw")
    ap.add_argument("--out", required=True, type=Path, help="output directory for the PNGs")
    ap.add_argument("--backend", default="mineru", choices=["mineru", "pymupdf"])
    ap.add_argument("--layout", default="fused", choices=["fused", "fast"])
    ap.add_argument("--dpi", type=int, default=72, help="render resolution of the drawn pages")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    cfg = ParseConfig(backend=args.backend, layout=args.layout)
    for path in args.pdf:
        data = Path(path).read_bytes()
        for rec in iter_parse(data, path, cfg):
            if isinstance(rec, Page):
                out = args.out / f"{Path(path).stem}_p{rec.page_index}.png"
                out.write_bytes(draw_boxes(data, rec, args.dpi))
            elif isinstance(rec, Dropped):
                print(f"{path}: dropped {rec.item_id[-12:]} {rec.stage}/{rec.reason}: {rec.detail}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
