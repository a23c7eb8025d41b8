"""Fusion of several layout backends' figure / table / equation boxes: a weighted vote per kind.

    python benchmarks/layout.py ../shared/devset --fit      # fit the parameters leave-one-file-out, report

Each source (``rules`` = MinerU flash + ``parsing.layout_rules``, ``yolo`` = the DocLayNet detector,
``pymupdf`` = PyMuPDF's layout model) proposes boxes of a kind with a score (1.0 when the backend gives
none). Boxes of one kind that overlap (IoU >= ``iou``) form a cluster; a cluster's confidence is the
weighted vote of the sources that ran on the page::

    conf = sum_s w_s * (best score of source s in the cluster) / sum_s w_s

and the cluster is kept when ``conf >= keep``. Its box is the box of the highest-weighted member
(``box="best"``; the rules' boxes are already trimmed to ink) or the score-weighted mean of the members'
coordinates (``box="mean"``, weighted box fusion). Per kind that is a handful of numbers (``KindParams``),
fitted on the development set by leave-one-file-out in ``benchmarks/layout.py``; ``FITTED`` holds the fit
on all files, which the parser uses on digital pages; ``FITTED_SCAN`` (on pages the OCR backend parsed) holds
the equations' fit on degraded copies of the sample PDFs against their self-labels (``--labelled --degraded``).
Pure Python (``fuse``; ``fuse_blocks`` applies it to a page's blocks): ``tests/parsing/test_fusion.py`` pins it
by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from formats.records import Block
from parsing.geometry import BBox, iou

FUSED_KINDS = ("figure", "table", "equation")
SOURCES = ("rules", "yolo", "pymupdf")


@dataclass(frozen=True)
class KindParams:
    """How one kind's proposals are fused."""

    weights: Mapping[str, float]
    """Vote weight per source; a source missing here (or at 0) does not vote and proposes nothing."""
    keep: float = 0.5
    """Lowest weighted-vote confidence of a kept cluster (0..1)."""
    iou: float = 0.5
    """Boxes of the kind overlapping at least this much are one proposal."""
    box: str = "best"
    """``best``: the box of the member with the largest weight × score; ``mean``: score-weighted mean."""


@dataclass(frozen=True)
class FusionParams:
    """Per-kind fusion parameters."""

    kinds: Mapping[str, KindParams] = field(default_factory=dict)


@dataclass(frozen=True)
class Proposal:
    """One source's box of a kind."""

    source: str
    kind: str
    bbox: BBox
    score: float = 1.0
    ref: int = -1
    """The caller's index of the block this proposal came from (-1: none)."""


@dataclass(frozen=True)
class Fused:
    """A kept box: its kind and geometry, its confidence, the sources that voted for it (best first) and its
    members, strongest first (the first is the one whose box ``best`` keeps)."""

    kind: str
    bbox: BBox
    confidence: float
    sources: tuple[str, ...]
    members: tuple[Proposal, ...]


def fuse(proposals: Sequence[Proposal], params: FusionParams, ran: Sequence[str]) -> list[Fused]:
    """Fused boxes of every kind in ``params`` from ``proposals``; ``ran``: the sources that looked at this page
    (a source that ran and proposed nothing votes "no"). Deterministic: clusters are grown from the
    strongest proposal down, ties broken by the input order."""
    out: list[Fused] = []
    for kind, kp in params.kinds.items():
        voters = {s: w for s, w in kp.weights.items() if w > 0 and s in ran}
        total = sum(voters.values())
        if total <= 0:
            continue
        props = [p for p in proposals if p.kind == kind and p.source in voters]
        order = sorted(range(len(props)), key=lambda i: (-voters[props[i].source] * props[i].score, i))
        clusters: list[list[Proposal]] = []
        for i in order:
            p = props[i]
            best, best_iou = None, kp.iou
            for c in clusters:
                v = iou(p.bbox, c[0].bbox)  # against the cluster's strongest member: no chaining
                if v >= best_iou:
                    best, best_iou = c, v
            if best is None:
                clusters.append([p])
            else:
                best.append(p)
        for c in clusters:
            vote: dict[str, float] = {}
            for p in c:
                vote[p.source] = max(vote.get(p.source, 0.0), p.score)
            conf = sum(voters[s] * v for s, v in vote.items()) / total
            if conf < kp.keep:
                continue
            lead = c[0]
            if kp.box == "mean":
                ws = [voters[p.source] * p.score for p in c]
                sw = sum(ws) or 1.0
                bbox = tuple(sum(w * p.bbox[k] for w, p in zip(ws, c)) / sw for k in range(4))
            else:
                bbox = lead.bbox
            srcs = tuple(sorted(vote, key=lambda s: -voters[s] * vote[s]))
            out.append(Fused(kind, bbox, conf, srcs, tuple(c)))  # type: ignore[arg-type]
    return out


def fuse_blocks(
    blocks: Sequence[Block],
    proposals: Sequence[tuple[str, Block]],
    params: FusionParams,
    ran: Sequence[str],
    text_at: Callable[[BBox], str],
    text_from: str = "text-layer-math",
) -> list[Block]:
    """A page's blocks after fusion. ``blocks``: the page as the backend and the rules left it (source
    ``rules``); ``proposals``: (source, block) from the other backends. A kept box that a rules block is part
    of keeps that block (its text, LaTeX, HTML, caption links) with the fused box; one the rules missed
    becomes a new block (text from ``text_at``; an equation's marked ``text_from``), placed in reading order
    after the blocks above it, and the text blocks it covers are dropped (their text is in it). Rules visuals
    nobody kept are dropped. Every fused block records ``proposed_by`` (the sources that voted for it, strongest
    first). Reading order is left to the caller to renumber (``backends.with_order``)."""
    import dataclasses

    from parsing.geometry import containment

    props = [
        Proposal("rules", b.kind, b.bbox, 1.0 if b.score is None else b.score, i)
        for i, b in enumerate(blocks)
        if b.kind in FUSED_KINDS
    ]
    props += [
        Proposal(src, b.kind, b.bbox, 1.0 if b.score is None else b.score)
        for src, b in proposals
        if b.kind in FUSED_KINDS
    ]
    kept = fuse(props, params, ran)
    out: list[Block | None] = [b if b.kind not in params.kinds else None for b in blocks]
    new: list[Block] = []
    order = min((b.reading_order for b in blocks), default=0) - 10_000
    for f in kept:
        mine = [m for m in f.members if m.source == "rules"]
        tag = "+".join(f.sources)
        if mine:
            b = blocks[mine[0].ref]
            out[mine[0].ref] = dataclasses.replace(b, bbox=f.bbox, proposed_by=tag)
            continue
        text = text_at(f.bbox) if f.kind != "figure" else ""
        math = text_from if f.kind == "equation" and text else None  # glyphs as drawn or OCR'd, not LaTeX
        new.append(
            Block(f.kind, f.bbox, text=text, reading_order=order, score=f.confidence, proposed_by=tag, text_from=math)
        )
        order -= 1
    result = [b for b in out if b is not None]
    for v in new:
        result = [b for b in result if b.kind in FUSED_KINDS or containment(b.bbox, v.bbox) < 0.8]
        box = v.bbox
        above = [
            i for i, b in enumerate(result) if b.bbox[3] <= box[1] + 2 and b.bbox[0] < box[2] and b.bbox[2] > box[0]
        ]
        result.insert(above[-1] + 1 if above else 0, v)
    return result


def _kp(weights: dict[str, float], keep: float, box: str) -> KindParams:
    return KindParams(weights=weights, keep=keep, box=box)


DEFAULT_KEEP = 0.4
DEFAULT = FusionParams({k: _kp({"rules": 1.0, "yolo": 1.0}, DEFAULT_KEEP, "best") for k in FUSED_KINDS})
"""The prior, chosen before any fit: the rules and the detector vote equally; a box two sources agree on is
always kept, and so is one source's box when it is confident (score >= 0.8 at equal weights: the rules' boxes,
which carry no score, always). The fit moves away from it only where the training files score better
elsewhere (on five files the F1 surface is flat over wide ranges, so the prior decides the ties)."""

FITTED = DEFAULT
"""The parameters the parser uses: the fit on all five development files (``benchmarks/layout.py --fit``,
sources rules + yolo) returned the prior for every kind, and so did each leave-one-file-out fold."""

FITTED_SCAN = FusionParams(
    {
        "figure": FITTED.kinds["figure"],
        "table": FITTED.kinds["table"],
        "equation": _kp({"rules": 1.0, "yolo": 1.0}, 0.1, "best"),
    }
)
"""The parameters for pages the OCR backend parsed (scans, no usable text layer). Equations: fitted on degraded
image-only copies of the 9 sample PDFs against their self-labels (``parsing.selflabel``; 151 pages, 267 display
equations, leave-one-document-out; ``python benchmarks/layout.py ../shared/samples --labelled --degraded --only
rules,yolo --fit``): keep 0.1 at equal weights, i.e. every box either source proposes (the scan path's equation
regions are few and the detector's formula boxes, floor 0.2, add the recall), where the prior keeps 0.4. Figures
and tables keep ``FITTED``: self-labels do not mark every figure or any table, so their precision cannot be fitted
there."""
