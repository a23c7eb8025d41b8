"""Display equations found from pixels: a small classifier over the text-line pieces of a page image, trained
on self-labelled pages (``parsing.selflabel``) (issue 39 item 2).

    python benchmarks/layout.py --self-label ../shared/samples --out /tmp/selflabel      # the training data
    python -m parsing.eqfinder train /tmp/selflabel                                      # retrain the weights
    python -m parsing.eqfinder find page-scan.pdf                                        # print found boxes

At inference it sees only the page's pixels. The image is binarised; rows of ink (the horizontal projection)
are cut into pieces at horizontal gaps of 1.2 row heights or more (a column gutter, the space before an
equation number). Each piece is described by a few numbers in units of the page's median row height:
height, width, indentation from the column's text on both sides, centring, word spaces, strata (a fraction
has empty pixel rows inside), long horizontal strokes (fraction bars), ink density, whether a short piece
sits alone at the right of its row (an equation number), and the same for the rows above and below. A
logistic regression (numpy, standardised features) gives each piece a probability of being part of a
display equation; touching positive pieces form one box. The weights live in ``eqfinder_weights.json`` beside
this file, with the command and the data that made them.

Status (issue 39 item 2, **not achieved**): trained on ``../shared/samples`` (151 pages, but nearly all positive
pieces from one lecture-notes PDF), it scores equation F1 0.066 on the degraded dev set and 0.037 on synthetic
scans (``benchmarks/layout.py ... --only eqfinder``), far below the detectors; the parser does not use it.
Neither this linear model nor a boosted-tree check separates display lines from text lines across documents on
these features; the data set holds one math-heavy document. See benchmarks/RESULTS.md (#39).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from parsing.geometry import BBox, containment, union

if TYPE_CHECKING:
    import numpy as np

WEIGHTS = Path(__file__).with_name("eqfinder_weights.json")
INK = 150
"""Grey level below which a pixel is ink."""
THRESHOLD = 0.5
"""Probability above which a piece is part of an equation (the weights file may override it)."""


@dataclass(frozen=True)
class Piece:
    """A horizontal run of ink on one row band of the page image, in pixels."""

    box: tuple[int, int, int, int]
    features: tuple[float, ...]


def _runs(mask: np.ndarray, min_gap: int) -> list[tuple[int, int]]:
    """[start, end) runs of True in a 1-D mask, runs separated by fewer than ``min_gap`` False merged."""
    import numpy as np

    idx = np.flatnonzero(mask)
    if idx.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(idx) > min_gap)
    starts = np.concatenate(([idx[0]], idx[breaks + 1]))
    ends = np.concatenate((idx[breaks], [idx[-1]])) + 1
    return list(zip(starts.tolist(), ends.tolist()))


def pieces(gray: np.ndarray) -> tuple[list[Piece], float]:
    """The page's text-line pieces and their features; and the median character height (pixels)."""
    import numpy as np
    from scipy import ndimage

    ink = gray < INK
    h_img, w_img = ink.shape
    lab, n = ndimage.label(ink)
    if n == 0:
        return [], 0.0
    objs = ndimage.find_objects(lab)
    hs = np.asarray([o[0].stop - o[0].start for o in objs])
    ws = np.asarray([o[1].stop - o[1].start for o in objs])
    glyph = (hs >= 3) & (hs < h_img / 20) & (ws < w_img / 4)
    if not glyph.any():
        return [], 0.0
    mh = float(np.median(hs[glyph]))  # a character's height
    # glyphs joined along their baseline into line pieces: word spaces close, gutters and wide gaps stay
    joined = ndimage.binary_dilation(ink, structure=np.ones((1, max(3, int(2.0 * mh)) | 1), dtype=bool))
    lab2, n2 = ndimage.label(joined)
    raw: list[tuple[int, int, int, int]] = []
    for o in ndimage.find_objects(lab2):
        y0, y1, x0, x1 = o[0].start, o[0].stop, o[1].start, o[1].stop
        if y1 - y0 >= 0.4 * mh and x1 - x0 >= 0.5 * mh and y1 - y0 < h_img / 6:
            raw.append((x0, y0, x1, y1))
    if not raw:
        return [], mh
    # rows: pieces overlapping vertically by half the smaller height
    raw.sort(key=lambda p: (p[1], p[0]))
    row_of = [-1] * len(raw)
    k = 0
    for i, p in enumerate(raw):
        if row_of[i] >= 0:
            continue
        row_of[i] = k
        for j in range(i + 1, len(raw)):
            q = raw[j]
            if q[1] > p[3]:
                break
            inter = min(p[3], q[3]) - max(p[1], q[1])
            if row_of[j] < 0 and inter >= 0.5 * min(p[3] - p[1], q[3] - q[1]):
                row_of[j] = k
        k += 1
    wide = [p for p in raw if p[2] - p[0] >= 0.25 * w_img]
    centre = float(np.median([(p[0] + p[2]) / 2 for p in wide])) if wide else w_img / 2
    base = []
    for (x0, y0, x1, y1), k in zip(raw, row_of):
        sub = ink[y0:y1, x0:x1]
        h, w = y1 - y0, x1 - x0
        # the column: wide pieces within 12 lines above/below overlapping this one in x
        near = [p for p in wide if abs(p[1] - y0) < 25 * mh and p[0] < x1 and p[2] > x0]
        c0 = min((p[0] for p in near), default=x0)
        c1 = max((p[2] for p in near), default=x1)
        colw = max(c1 - c0, 1)
        words = _runs(sub.any(0), max(1, int(0.5 * mh)))
        strata = _runs(sub.any(1), 1)
        longest = 0
        for row in sub[:: max(1, h // 12)]:
            r = _runs(row, 0)
            if r:
                longest = max(longest, max(e - s for s, e in r))
        same_row = [p for p, kk in zip(raw, row_of) if kk == k and p != (x0, y0, x1, y1)]
        right_short = any(p[0] > x1 and p[2] - p[0] < 6 * mh for p in same_row)
        level = [p for p in raw if p[1] < y1 and p[3] > y0 and p != (x0, y0, x1, y1)]  # any vertical overlap
        is_short_right = w < 6 * mh and any(p[2] < x0 for p in level) and not any(p[0] > x1 for p in level)
        base.append(
            [
                h / mh,
                w / mh,
                w / colw,
                (x0 - c0) / mh,
                (c1 - x1) / mh,
                abs((x0 + x1) / 2 - (c0 + c1) / 2) / colw,
                abs((x0 + x1) / 2 - centre) / w_img,
                len(words) / max(w / mh, 1.0),
                float(len(strata)),
                longest / mh,
                float(sub.mean()),
                float(right_short),
                float(is_short_right),
                float(len(same_row)),
            ]
        )
    # context: the pieces just above and below (nearest overlapping in x)
    out = []
    n_base = len(base[0])
    for i, (box, k) in enumerate(zip(raw, row_of)):
        ctx = []
        for step in (-1, 1):
            nb = [j for j, kk in enumerate(row_of) if kk == k + step and raw[j][0] < box[2] and raw[j][2] > box[0]]
            if nb:
                j = max(nb, key=lambda j: min(raw[j][2], box[2]) - max(raw[j][0], box[0]))
                gap = (box[1] - raw[j][3]) if step < 0 else (raw[j][1] - box[3])
                ctx += [base[j][2], base[j][3], base[j][4], base[j][7], gap / mh]
            else:
                ctx += [0.0, 0.0, 0.0, 0.0, 10.0]
        out.append(Piece(box, tuple(base[i]) + tuple(ctx)))
    assert all(len(p.features) == n_base + 10 for p in out)
    return out, mh


def _design(x: np.ndarray) -> np.ndarray:
    """Features plus a few nonlinear terms (logs of sizes, squares of indents)."""
    import numpy as np

    extra = [np.log1p(np.abs(x[:, [0, 1, 3, 4, 9]])), np.minimum(x[:, [3, 4]], 20.0) ** 2 / 20.0]
    return np.concatenate([x, *extra], axis=1)


@dataclass
class Model:
    """Standardised logistic regression over ``_design`` features."""

    mean: list[float]
    std: list[float]
    coef: list[float]
    bias: float
    threshold: float = THRESHOLD

    def prob(self, feats: np.ndarray) -> np.ndarray:
        import numpy as np

        z = (_design(feats) - np.asarray(self.mean)) / np.asarray(self.std)
        return 1.0 / (1.0 + np.exp(-(z @ np.asarray(self.coef) + self.bias)))


def load(path: Path = WEIGHTS) -> Model:
    d = json.loads(path.read_text())
    return Model(d["mean"], d["std"], d["coef"], d["bias"], d.get("threshold", THRESHOLD))


def find(gray: np.ndarray, model: Model) -> list[tuple[tuple[float, float, float, float], float]]:
    """Equation boxes (pixels) with scores on a grey page image: positive pieces, grown into the pieces
    touching them that are positive too, short right-hand pieces (equation numbers) left out."""
    import numpy as np

    ps, mh = pieces(gray)
    if not ps:
        return []
    probs = model.prob(np.asarray([p.features for p in ps], dtype=float))
    pos = [(p, float(q)) for p, q in zip(ps, probs) if q >= model.threshold and not p.features[12]]
    boxes: list[tuple[list[BBox], list[float]]] = []
    for p, q in sorted(pos, key=lambda t: t[0].box[1]):
        b = tuple(float(v) for v in p.box)
        for group, qs in boxes:
            g = union(group)
            if b[1] - g[3] <= 0.9 * mh and b[0] < g[2] + mh and b[2] > g[0] - mh:
                group.append(b)  # type: ignore[arg-type]
                qs.append(q)
                break
        else:
            boxes.append(([b], [q]))  # type: ignore[list-item]
    out = []
    for group, qs in boxes:
        box = union(group)
        if box[3] - box[1] >= 0.8 * mh and box[2] - box[0] >= 2 * mh:
            out.append((box, float(np.mean(qs))))
    return out


def find_on_page(page, model: Model, dpi: int = 150) -> list[tuple[BBox, float]]:
    """``find`` on a PyMuPDF page rendered at ``dpi`` in grey; boxes in PDF points."""
    import numpy as np
    import pymupdf

    zoom = dpi / 72.0
    pix = page.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom), colorspace=pymupdf.csGRAY, alpha=False)
    gray = np.frombuffer(pix.samples, dtype=np.uint8).reshape(pix.height, pix.width)
    return [(tuple(v / zoom for v in b), s) for b, s in find(gray, model)]  # type: ignore[misc]


# ---- training ------------------------------------------------------------------------------------------
def dataset(folder: Path, split: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Features, labels (1: the piece lies in a labelled equation box) and document names of a split."""
    import numpy as np
    from PIL import Image

    xs, ys, docs = [], [], []
    path = folder / split / "labels.jsonl"
    if not path.exists():
        return np.zeros((0, 1)), np.zeros(0), []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        gray = np.asarray(Image.open(folder / split / row["image"]).convert("L"))
        eqs = [tuple(b["bbox_px"]) for b in row["boxes"] if b["kind"] == "equation"]
        ps, _ = pieces(gray)
        for p in ps:
            xs.append(p.features)
            ys.append(float(any(containment(p.box, e) >= 0.5 for e in eqs)))  # type: ignore[arg-type]
            docs.append(row["pdf"])
    return np.asarray(xs, dtype=float), np.asarray(ys), docs


def fit(x: np.ndarray, y: np.ndarray, l2: float = 1e-2, steps: int = 3000, lr: float = 0.5) -> Model:
    """Logistic regression by full-batch gradient descent, positives weighted to balance the classes."""
    import numpy as np

    d = _design(x)
    mean, std = d.mean(0), d.std(0) + 1e-6
    z = (d - mean) / std
    wpos = (len(y) - y.sum()) / max(y.sum(), 1.0)
    sw = np.where(y > 0, wpos, 1.0)
    sw = sw / sw.mean()
    w = np.zeros(z.shape[1])
    b = 0.0
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(z @ w + b)))
        g = sw * (p - y)
        w -= lr * (z.T @ g / len(y) + l2 * w)
        b -= lr * g.mean()
    return Model(mean.tolist(), std.tolist(), w.tolist(), float(b))


def train(folder: Path, out: Path = WEIGHTS) -> dict:
    """Fit on ``folder``'s train split, pick the threshold with the best piece F1 on train, report test."""
    import numpy as np

    x, y, docs = dataset(folder, "train")
    model = fit(x, y)
    p = model.prob(x)
    best = (0.0, THRESHOLD)
    for t in np.arange(0.3, 0.95, 0.05):
        tp = float(((p >= t) & (y > 0)).sum())
        pr, rc = tp / max((p >= t).sum(), 1), tp / max(y.sum(), 1)
        f1 = 2 * pr * rc / (pr + rc) if pr + rc else 0.0
        best = max(best, (f1, float(t)))
    model.threshold = round(best[1], 2)
    report = {"train_pieces": len(y), "train_positive": int(y.sum()), "train_docs": len(set(docs))}
    report["train_piece_f1"] = round(best[0], 3)
    for split in ("val", "test"):
        xv, yv, dv = dataset(folder, split)
        if len(yv):
            pv = model.prob(xv) >= model.threshold
            tp = float((pv & (yv > 0)).sum())
            pr, rc = tp / max(pv.sum(), 1), tp / max(yv.sum(), 1)
            report[f"{split}_piece_precision"] = round(pr, 3)
            report[f"{split}_piece_recall"] = round(rc, 3)
            report[f"{split}_docs"] = len(set(dv))
    data = {
        "mean": model.mean,
        "std": model.std,
        "coef": model.coef,
        "bias": model.bias,
        "threshold": model.threshold,
        "trained_on": str(folder),
        "command": f"python -m parsing.eqfinder train {folder}",
        "report": report,
    }
    out.write_text(json.dumps(data, indent=1) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="fit the weights on a --self-label folder")
    t.add_argument("folder", type=Path)
    t.add_argument("--out", type=Path, default=WEIGHTS)
    f = sub.add_parser("find", help="print the equation boxes found on each page of a PDF (from its pixels)")
    f.add_argument("pdf", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "train":
        print(json.dumps(train(args.folder, args.out), indent=1))
        return 0
    import pymupdf

    model = load()
    with pymupdf.open(args.pdf) as doc:
        for page in doc:
            for box, score in find_on_page(page, model):
                print(page.number, [round(v, 1) for v in box], round(score, 3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
