"""``parsing.detectors``: letterbox, NMS and output decoding by hand; the real pinned YOLO weights on generated
pages: an image-only page with a table and a landscape vector table page each get their table box, through
the parse worker's default (fused) layout."""

from __future__ import annotations

import numpy as np
import pytest

from formats.records import Page
from parsing.detectors import PAD_VALUE, decode, letterbox, nms
from parsing.geometry import iou
from tests.parsing.fixtures import image_only_table_pdf, landscape_table_pdf


def test_letterbox_centres_the_scaled_image_on_grey():
    img = np.zeros((50, 100, 3), dtype=np.uint8)
    canvas, scale, dx, dy = letterbox(img, size=200)
    assert scale == 2.0 and (dx, dy) == (0, 50)
    assert canvas.shape == (200, 200, 3)
    assert (canvas[:50] == PAD_VALUE).all() and (canvas[150:] == PAD_VALUE).all() and (canvas[50:150] == 0).all()


def test_nms_drops_overlaps_of_a_stronger_box_only():
    boxes = np.array([[0, 0, 10, 10], [1, 0, 11, 10], [20, 20, 30, 30]], dtype=float)
    scores = np.array([0.8, 0.9, 0.7])
    assert nms(boxes, scores, 0.5) == [1, 2]  # IoU(0, 1) = 9/11 > 0.5
    assert nms(boxes, scores, 0.9) == [1, 0, 2]


def test_decode_reads_centre_size_rows_then_class_scores():
    raw = np.zeros((4 + 11, 3), dtype=np.float32)
    raw[:4, 0] = (50, 40, 20, 10)  # cx, cy, w, h
    raw[4 + 8, 0] = 0.9  # class 8 = Table
    raw[:4, 1] = (51, 40, 20, 10)
    raw[4 + 8, 1] = 0.6  # the same table again: suppressed
    raw[:4, 2] = (10, 10, 4, 4)
    raw[4 + 2, 2] = 0.1  # under the threshold
    (det,) = decode(raw, conf=0.2, iou_thr=0.45)
    assert det[0] == 8 and det[1] == pytest.approx((40, 35, 60, 45)) and det[2] == pytest.approx(0.9)


def test_the_pinned_weights_load():
    import hashlib

    from parsing.detectors import WEIGHTS_SHA256, weights_bytes

    assert hashlib.sha256(weights_bytes()).hexdigest() == WEIGHTS_SHA256


@pytest.mark.parametrize("make", [image_only_table_pdf, landscape_table_pdf], ids=["image-only", "landscape"])
def test_generated_table_pages_get_their_table_box(parser, make):
    from parsing import ParseConfig

    data, box = make()
    # the default config but a generous page timeout: the image-only page is OCR'd (60 cells), which on a
    # loaded 2-core machine can pass the default 60 s; timeouts are tested in test_timeout.py
    config = ParseConfig(page_timeout_s=600, doc_timeout_s=1200)
    pages = [r for r in parser.iter_parse(data, "t.pdf", config) if isinstance(r, Page)]
    assert len(pages) == 1
    tables = [b for b in pages[0].blocks if b.kind == "table"]
    best = max(tables, key=lambda b: iou(b.bbox, box))
    assert iou(best.bbox, box) >= 0.8
    assert "yolo" in (best.proposed_by or "")
    assert best.crop is not None
    # `scifolio parse` writes (and --view draws) which sources proposed each kept box
    from pipelines.jobs.parse_view import page_rows

    assert {r["proposed_by"] for r in page_rows(pages[0]) if r["kind"] == "table"} >= {best.proposed_by}


def test_propose_on_a_thread_gives_the_boxes_of_parse():
    """The fused layout runs the network on a thread beside MinerU (``YoloBackend.propose``); its proposals
    must be ``parse``'s figure/table/equation boxes, scores and order exactly, and a page whose render fails
    only loses its proposals."""
    import pymupdf

    from formats.records import CROPPED_KINDS
    from parsing.backends import YoloBackend

    data, _ = landscape_table_pdf()
    yolo = YoloBackend()
    yolo.load()
    with pymupdf.open(stream=data, filetype="pdf") as doc:
        parsed = yolo.parse("t.pdf", doc, [0])
        proposed = yolo.propose(doc, [0, 7])()  # page 7 does not exist: its render raises
    want = [(b.kind, b.bbox, b.score) for b in parsed[0].blocks if b.kind in CROPPED_KINDS]
    assert list(proposed) == [0]
    assert [(b.kind, b.bbox, b.score) for b in proposed[0]] == want and want
