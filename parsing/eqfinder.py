"""Display equations found from pixels: the DocLayNet detector's formula boxes (``parsing.detectors``, run on the
page image alone) re-scored by a calibration fitted on self-labelled, degraded pages (``parsing.selflabel``)
(issue 39 item 2).

    python benchmarks/layout.py --self-label ../shared/samples --out /tmp/selflabel      # the training data
    python benchmarks/layout.py --self-label --synthetic 40 --seed 11 --out /tmp/sl-syn  # optional: synthetic pages
    python -m parsing.eqfinder train /tmp/selflabel /tmp/sl-syn                         # refit the calibration
    python -m parsing.eqfinder find page-scan.pdf                                        # print found boxes

At inference it sees only the page's pixels. The detector runs with a low floor (``CONF``: every formula box it
half-believes); each box is described by eight numbers (the detector's formula score and its logit, the box's
width, height and aspect, its centre's distance from the page's middle, and the best score of a text, list or
caption box that covers it: a formula box on a paragraph line is an inline formula or a misread line), and a
logistic regression (numpy, standardised features, classes balanced) turns them into a probability; boxes at or
above the fitted threshold are display equations. The calibration lives in ``eqfinder_weights.json`` beside this
file, with the command, the data and a leave-document-out report.

Why a calibration and not a new network: a first finder here, a logistic regression over text-line pieces cut
from the binarised page (24 features: indentation, centring, strata, fraction bars, "(n)" numbers), scored
equation F1 0.066 on the degraded dev set; the labelled data hold one math-heavy document (most of the positive
boxes come from the GeoTopo lecture notes), too little to learn what a display line looks like, but enough to
fit eight numbers on top of a detector that was trained on DocLayNet's 80k pages. See benchmarks/RESULTS.md (#39).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from parsing.geometry import BBox, containment, iou

if TYPE_CHECKING:
    import numpy as np

    from parsing.detectors import Rendered, YoloLayout

WEIGHTS = Path(__file__).with_name("eqfinder_weights.json")
CONF = 0.05
"""The detector's score floor for candidate boxes (the parser's own floor is 0.2)."""
COVER_KINDS = ("text", "list", "caption")
MATCH_IOU = 0.5
"""A candidate is a labelled equation's box when they overlap this much (the dev-set scorer's bar)."""
FEATURES = ("score", "logit", "width", "height", "log_aspect", "off_centre", "cover", "cover_x_score")


@dataclass
class Model:
    mean: list[float]
    std: list[float]
    coef: list[float]
    bias: float
    threshold: float = 0.5

    def prob(self, feats: np.ndarray) -> np.ndarray:
        import numpy as np

        z = (np.asarray(feats, dtype=float) - np.asarray(self.mean)) / np.asarray(self.std)
        return 1.0 / (1.0 + np.exp(-(z @ np.asarray(self.coef) + self.bias)))


def load(path: Path = WEIGHTS) -> Model:
    d = json.loads(path.read_text())
    return Model(d["mean"], d["std"], d["coef"], d["bias"], d["threshold"])


def candidates(dets: Sequence[tuple[str, BBox, float]], width: float, height: float) -> tuple[list[BBox], np.ndarray]:
    """The formula boxes of one page's detections (any units, the page ``width`` × ``height`` in them) and their
    features ``[N, len(FEATURES)]``."""
    import numpy as np

    boxes, rows = [], []
    covers = [(b, s) for k, b, s in dets if k in COVER_KINDS]
    for kind, b, s in dets:
        if kind != "equation":
            continue
        w, h = max(b[2] - b[0], 1e-6), max(b[3] - b[1], 1e-6)
        cover = max((cs for cb, cs in covers if containment(b, cb) >= 0.5), default=0.0)
        s = min(max(s, 1e-4), 1 - 1e-4)
        off = abs((b[0] + b[2]) / 2 - width / 2) / width
        rows.append([s, np.log(s / (1 - s)), w / width, h / height, np.log(w / h), off, cover, cover * s])
        boxes.append(b)
    return boxes, np.asarray(rows, dtype=float).reshape(-1, len(FEATURES))


def find(
    dets: Sequence[tuple[str, BBox, float]], width: float, height: float, model: Model
) -> list[tuple[BBox, float]]:
    """(box, probability) of the display equations among one page's detections."""
    boxes, x = candidates(dets, width, height)
    if not boxes:
        return []
    p = model.prob(x)
    return [(b, float(q)) for b, q in zip(boxes, p) if q >= model.threshold]


def detector() -> YoloLayout:
    from parsing.detectors import YoloLayout

    yolo = YoloLayout(conf=CONF)
    yolo.load()
    return yolo


def find_on_page(page, model: Model, yolo: YoloLayout) -> list[tuple[BBox, float]]:
    """Display equations of a PyMuPDF page, in PDF points, from its rendered pixels only."""
    from parsing.detectors import render

    (dets,) = yolo.infer([render(page)])
    return find(dets, page.rect.width, page.rect.height, model)


def rendered_image(path: Path) -> Rendered:
    """A page image file as the detector's input, boxes coming back in the image's pixels."""
    import numpy as np
    from PIL import Image

    from parsing.detectors import INPUT_SIZE, Rendered

    img = Image.open(path).convert("RGB")
    w, h = img.size
    zoom = INPUT_SIZE / max(w, h)
    small = img.resize((max(1, round(w * zoom)), max(1, round(h * zoom))), Image.BILINEAR)
    return Rendered(np.asarray(small), zoom, float(w), float(h))


# ---- training ------------------------------------------------------------------------------------------
def dataset(folders: Sequence[Path], yolo: YoloLayout) -> dict[str, list]:
    """Every page of the ``--self-label`` folders (all splits): per document, the candidates' features, labels (1:
    the box is a labelled equation's) and the count of labelled equations (recall's denominator)."""
    import numpy as np

    docs: dict[str, list] = defaultdict(lambda: [[], [], 0])
    for labels in sorted(p for folder in folders for p in folder.glob("*/labels.jsonl")):
        rows = [json.loads(line) for line in labels.read_text().splitlines()]
        for k in range(0, len(rows), yolo.pages_per_call):
            chunk = rows[k : k + yolo.pages_per_call]
            dets = yolo.infer([rendered_image(labels.parent / r["image"]) for r in chunk])
            for row, d in zip(chunk, dets):
                w, h = row["size_px"]
                boxes, x = candidates(d, w, h)
                eqs = [tuple(b["bbox_px"]) for b in row["boxes"] if b["kind"] == "equation"]
                y = [float(any(iou(b, e) >= MATCH_IOU for e in eqs)) for b in boxes]
                entry = docs[row["pdf"]]
                entry[0].append(x)
                entry[1].append(np.asarray(y))
                entry[2] += len(eqs)
    return {n: [np.concatenate(x), np.concatenate(y), m] for n, (x, y, m) in docs.items()}


def fit(x: np.ndarray, y: np.ndarray, l2: float = 1e-2, steps: int = 2000, lr: float = 0.5) -> Model:
    """Logistic regression by full-batch gradient descent, positives weighted to balance the classes."""
    import numpy as np

    mean, std = x.mean(0), x.std(0) + 1e-6
    z = (x - mean) / std
    wpos = (len(y) - y.sum()) / max(y.sum(), 1.0)
    sw = np.where(y > 0, wpos, 1.0)
    sw = sw / sw.mean()
    w, b = np.zeros(z.shape[1]), 0.0
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(z @ w + b)))
        g = sw * (p - y)
        w -= lr * (z.T @ g / len(y) + l2 * w)
        b -= lr * g.mean()
    return Model(mean.tolist(), std.tolist(), w.tolist(), float(b))


def _prf(tp: float, found: float, labelled: float) -> tuple[float, float, float]:
    p, r = tp / max(found, 1), tp / max(labelled, 1)
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def _best_threshold(p: np.ndarray, y: np.ndarray, labelled: int) -> float:
    """The threshold with the best equation F1 (recall over all labelled equations, the detector's misses too)."""
    import numpy as np

    grid = np.arange(0.05, 0.96, 0.05)
    f1 = [_prf(float(((p >= t) & (y > 0)).sum()), float((p >= t).sum()), labelled)[2] for t in grid]
    return round(float(grid[int(np.argmax(f1))]), 2)


def train(folders: Sequence[Path], out: Path = WEIGHTS) -> dict:
    """Fit on every page of ``folders``; report leave-one-document-out box precision/recall (each document scored by
    a calibration and threshold fitted without it) beside the detector's own floor of 0.2 on the same boxes."""
    import numpy as np

    yolo = detector()
    data = dataset(folders, yolo)
    if not data:
        raise SystemExit(
            f"{' '.join(map(str, folders))}: no labels.jsonl (write one with benchmarks/layout.py --self-label)"
        )
    report: dict = {"documents": {}, "candidates": 0, "labelled": 0}
    tot = np.zeros(6)  # tp, found, labelled for the calibration; the same at the detector's 0.2 floor
    for name, (x, y, m) in data.items():
        rest = [d for n, d in data.items() if n != name]
        xr, yr = np.concatenate([d[0] for d in rest]), np.concatenate([d[1] for d in rest])
        row = {"candidates": len(y), "labelled": m}
        if yr.sum() > 0 and len(y):
            model = fit(xr, yr)
            model.threshold = _best_threshold(model.prob(xr), yr, sum(d[2] for d in rest))
            keep = model.prob(x) >= model.threshold
            bare = x[:, 0] >= 0.2
            hit = [float((keep & (y > 0)).sum()), float(keep.sum()), float((bare & (y > 0)).sum()), float(bare.sum())]
            c = [hit[0], hit[1], m, hit[2], hit[3], m]
            tot += c
            row |= {"tp_found": c[:2], "bare_tp_found": c[3:5]}
        report["documents"][name] = row
        report["candidates"] += len(y)
        report["labelled"] += m
    p, r, f = _prf(*tot[:3])
    bp, br, bf = _prf(*tot[3:])
    report["leave_one_document_out"] = {"precision": round(p, 3), "recall": round(r, 3), "f1": round(f, 3)}
    report["detector_at_0.2"] = {"precision": round(bp, 3), "recall": round(br, 3), "f1": round(bf, 3)}
    x, y = np.concatenate([d[0] for d in data.values()]), np.concatenate([d[1] for d in data.values()])
    model = fit(x, y)
    model.threshold = _best_threshold(model.prob(x), y, report["labelled"])
    saved = {
        "features": list(FEATURES),
        "mean": model.mean,
        "std": model.std,
        "coef": model.coef,
        "bias": model.bias,
        "threshold": model.threshold,
        "detector_floor": CONF,
        "trained_on": [str(f) for f in folders],
        "command": f"python -m parsing.eqfinder train {' '.join(map(str, folders))}",
        "report": report,
    }
    out.write_text(json.dumps(saved, indent=1) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="fit the calibration on --self-label folders")
    t.add_argument("folders", type=Path, nargs="+")
    t.add_argument("--out", type=Path, default=WEIGHTS)
    f = sub.add_parser("find", help="print the equation boxes found on each page of a PDF (from its pixels)")
    f.add_argument("pdf", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "train":
        print(json.dumps(train(args.folders, args.out), indent=1))
        return 0
    import pymupdf

    model, yolo = load(), detector()
    with pymupdf.open(args.pdf) as doc:
        for page in doc:
            for box, score in find_on_page(page, model, yolo):
                print(page.number, [round(v, 1) for v in box], round(score, 3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
