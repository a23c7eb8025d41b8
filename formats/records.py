"""The contract between stages: frozen records and their one serialisation place.

Stdlib and typing only, so every stage (and every worker image) can import it cheaply.
Rows are plain dicts of JSON/Arrow-friendly values: ``Record.to_row()`` / ``Record.from_row()``.

Geometry: bbox in PDF points, top-left origin, ``(x0, y0, x1, y1)``; page index 0-based.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

_PAGE_ID = re.compile(r"^([0-9a-f]{64}):(\d+)$")


def page_id(doc_id: str, page_index: int) -> str:
    """The id of a page (``doc_id:page_index``): dead letters of a page and page provenance use it."""
    return f"{doc_id}:{int(page_index)}"


def split_page_id(item_id: str) -> tuple[str, int] | None:
    """``(doc_id, page_index)`` of a page id, or None for any other item id (a document's, an input path)."""
    m = _PAGE_ID.match(item_id)
    return (m.group(1), int(m.group(2))) if m else None


BlockKind = Literal[
    "text",
    "title",
    "figure",
    "table",
    "equation",
    "caption",
    "header",
    "footer",
    "page_number",
    "code",
    "list",
    "other",
]
BLOCK_KINDS: tuple[str, ...] = BlockKind.__args__  # type: ignore[attr-defined]
CROPPED_KINDS: frozenset[str] = frozenset({"figure", "table", "equation"})
# Kinds that carry page furniture rather than content; never interleaved into training text.
FURNITURE_KINDS: frozenset[str] = frozenset({"header", "footer", "page_number"})

BBox = tuple[float, float, float, float]


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Crop:
    """A rendered region of a page, content-addressed by the sha256 of its PNG bytes."""

    sha256: str
    png: bytes = field(repr=False)
    width: int
    height: int
    dpi: int

    @classmethod
    def from_png(cls, png: bytes, width: int, height: int, dpi: int) -> Crop:
        return cls(sha256=sha256_hex(png), png=png, width=width, height=height, dpi=dpi)

    def to_row(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "png": self.png, "width": self.width, "height": self.height, "dpi": self.dpi}

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Crop:
        return cls(
            sha256=row["sha256"],
            png=bytes(row["png"]),
            width=int(row["width"]),
            height=int(row["height"]),
            dpi=int(row["dpi"]),
        )


@dataclass(frozen=True)
class Block:
    """One layout region of a page, in reading order.

    ``latex`` (equations) or ``html`` (tables) are kept when the layout backend gives them.
    ``caption_of`` links a caption block to the ``reading_order`` of the figure/table it describes.
    """

    kind: str
    bbox: BBox
    text: str = ""
    reading_order: int = 0
    latex: str | None = None
    html: str | None = None
    crop: Crop | None = None
    caption_of: int | None = None
    score: float | None = None
    text_from: str | None = None
    """Where ``text`` came from when the backend did not read it: ``text-layer-math`` for a display equation
    whose glyphs were taken from the PDF's text layer (plain characters as drawn, not LaTeX); ``ocr`` for one on a
    scanned page whose characters OCR read (``parsing.backends.OCR_TEXT``)."""
    proposed_by: str | None = None
    """The layout source(s) whose box this is, ``+``-joined, the one whose box was kept first (e.g.
    ``rules+yolo``); None when one backend parsed the page alone."""

    def __post_init__(self) -> None:
        if self.kind not in BLOCK_KINDS:
            raise ValueError(f"unknown block kind {self.kind!r}; expected one of {BLOCK_KINDS}")
        object.__setattr__(self, "bbox", tuple(float(v) for v in self.bbox))

    def to_row(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "bbox": list(self.bbox),
            "text": self.text,
            "reading_order": self.reading_order,
            "latex": self.latex,
            "html": self.html,
            "crop": self.crop.to_row() if self.crop is not None else None,
            "caption_of": self.caption_of,
            "score": self.score,
            "text_from": self.text_from,
            "proposed_by": self.proposed_by,
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Block:
        crop = row.get("crop")
        return cls(
            kind=row["kind"],
            bbox=tuple(row["bbox"]),  # type: ignore[arg-type]
            text=row.get("text") or "",
            reading_order=int(row.get("reading_order") or 0),
            latex=row.get("latex"),
            html=row.get("html"),
            crop=Crop.from_row(crop) if crop else None,
            caption_of=row.get("caption_of"),
            score=row.get("score"),
            text_from=row.get("text_from"),
            proposed_by=row.get("proposed_by"),
        )


@dataclass(frozen=True)
class Document:
    """A validated input PDF. ``doc_id`` is the sha256 of the file bytes (reruns are idempotent)."""

    doc_id: str
    source: str
    n_pages: int
    meta: Mapping[str, Any] = field(default_factory=dict)

    def to_row(self) -> dict[str, Any]:
        return {"doc_id": self.doc_id, "source": self.source, "n_pages": self.n_pages, "meta": _dumps(self.meta)}

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Document:
        return cls(
            doc_id=row["doc_id"], source=row["source"], n_pages=int(row["n_pages"]), meta=_loads(row.get("meta"))
        )


@dataclass(frozen=True)
class Page:
    """A parsed page: blocks in reading order, the backend that produced it, and stage scores.

    ``scores`` is where later stages write (e.g. ``visual_gain``: delta_h, threshold, kept).
    """

    doc_id: str
    page_index: int
    width: float
    height: float
    blocks: tuple[Block, ...]
    parser: str
    scores: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)
    render: Crop | None = None  # whole-page render (optional; next-patch pre-training, review pages)

    def __post_init__(self) -> None:
        object.__setattr__(self, "blocks", tuple(self.blocks))

    def content(self) -> list[tuple[str, Block]]:
        """The page's content in reading order as ``("text"|"image", block)`` pairs.

        The single definition of "what a page says" shared by the interleaver and the visual-gain
        scorer: furniture (headers, footers, page numbers) is skipped, cropped kinds become images at
        their position, a cropped kind whose crop is missing falls back to its text, captions are text.
        """
        items: list[tuple[str, Block]] = []
        for b in sorted(self.blocks, key=lambda b: b.reading_order):
            if b.kind in FURNITURE_KINDS:
                continue
            if b.kind in CROPPED_KINDS and b.crop is not None:
                items.append(("image", b))
            elif b.text.strip():
                items.append(("text", b))
        return items

    @property
    def page_id(self) -> str:
        return page_id(self.doc_id, self.page_index)

    @property
    def crops(self) -> list[Crop]:
        return [b.crop for b in self.blocks if b.crop is not None]

    def to_row(self) -> dict[str, Any]:
        return {
            "doc_id": self.doc_id,
            "page_index": self.page_index,
            "width": self.width,
            "height": self.height,
            "blocks": [b.to_row() for b in self.blocks],
            "parser": self.parser,
            "scores": _dumps(self.scores),
            "source": self.source,
            "meta": _dumps(self.meta),
            "render": self.render.to_row() if self.render is not None else None,
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Page:
        return cls(
            doc_id=row["doc_id"],
            page_index=int(row["page_index"]),
            width=float(row["width"]),
            height=float(row["height"]),
            blocks=tuple(Block.from_row(b) for b in row["blocks"]),
            parser=row["parser"],
            scores=_loads(row.get("scores")),
            source=row.get("source") or "",
            meta=_loads(row.get("meta")),
            render=Crop.from_row(row["render"]) if row.get("render") else None,
        )


@dataclass(frozen=True)
class Dropped:
    """A dead letter: what was rejected, at which stage, why (a short reason code), and details."""

    item_id: str
    stage: str
    reason: str
    detail: Mapping[str, Any] = field(default_factory=dict)

    def to_row(self) -> dict[str, Any]:
        return {"item_id": self.item_id, "stage": self.stage, "reason": self.reason, "detail": _dumps(self.detail)}

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Dropped:
        return cls(item_id=row["item_id"], stage=row["stage"], reason=row["reason"], detail=_loads(row.get("detail")))


def _dumps(obj: Mapping[str, Any]) -> str:
    return json.dumps(dict(obj), sort_keys=True, default=str)


def _loads(text: str | Mapping[str, Any] | None) -> dict[str, Any]:
    if not text:
        return {}
    if isinstance(text, Mapping):
        return dict(text)
    return json.loads(text)
