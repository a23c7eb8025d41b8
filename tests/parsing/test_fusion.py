"""``parsing.fusion``: the per-kind weighted vote, by hand-computed confidences."""

from __future__ import annotations

import pytest

from formats.records import Block
from parsing.fusion import DEFAULT, FusionParams, KindParams, Proposal, fuse, fuse_blocks

EQ = KindParams(weights={"rules": 1.0, "yolo": 1.0}, keep=0.4, box="best")


def test_agreeing_sources_vote_together_and_the_stronger_box_is_kept():
    props = [
        Proposal("yolo", "equation", (10, 10, 110, 30), 0.9),
        Proposal("rules", "equation", (12, 11, 100, 29), 1.0),
    ]
    (f,) = fuse(props, FusionParams({"equation": EQ}), ["rules", "yolo"])
    assert f.confidence == pytest.approx((1.0 + 0.9) / 2)
    assert f.bbox == (12, 11, 100, 29) and f.sources == ("rules", "yolo")


def test_a_lone_box_needs_enough_of_the_vote():
    props = [Proposal("yolo", "equation", (0, 0, 50, 20), 0.7), Proposal("yolo", "equation", (0, 40, 50, 60), 0.9)]
    kept = fuse(props, FusionParams({"equation": EQ}), ["rules", "yolo"])
    # 0.7 / 2 = 0.35 < 0.4 is dropped; 0.9 / 2 = 0.45 is kept
    assert [f.bbox for f in kept] == [(0, 40, 50, 60)]
    # a source that did not run on the page does not vote against
    assert len(fuse(props, FusionParams({"equation": EQ}), ["yolo"])) == 2


def test_mean_box_is_the_score_weighted_average():
    kp = KindParams(weights={"rules": 1.0, "yolo": 3.0}, keep=0.1, box="mean")
    props = [Proposal("rules", "table", (0, 0, 100, 100), 1.0), Proposal("yolo", "table", (4, 0, 100, 104), 0.5)]
    (f,) = fuse(props, FusionParams({"table": kp}), ["rules", "yolo"])
    # weights × scores: 1.0 and 1.5
    assert f.bbox == pytest.approx((1.5 * 4 / 2.5, 0, 100, 1.5 * 104 / 2.5 + 100 / 2.5))
    assert f.confidence == pytest.approx((1.0 + 1.5) / 4.0)


def test_kinds_are_fused_apart_and_disjoint_boxes_stay_apart():
    props = [Proposal("rules", "figure", (0, 0, 100, 100)), Proposal("yolo", "table", (0, 0, 100, 100), 0.95)]
    kept = fuse(props, DEFAULT, ["rules", "yolo"])
    assert sorted(f.kind for f in kept) == ["figure", "table"]


def test_fuse_blocks_keeps_rules_blocks_adds_detector_boxes_and_drops_the_text_they_cover():
    blocks = [
        Block("text", (50, 50, 550, 90), "intro", reading_order=0),
        Block("equation", (200, 100, 400, 120), "E = mc2", reading_order=1),
        Block("text", (100, 210, 300, 230), "cell text", reading_order=2),
        Block("figure", (50, 400, 150, 500), reading_order=3),  # nobody else sees it, kept on its own vote
    ]
    proposals = [
        ("yolo", Block("table", (90, 200, 500, 380), score=0.95)),
        ("yolo", Block("equation", (198, 99, 430, 121), score=0.8)),
        ("yolo", Block("figure", (300, 600, 400, 700), score=0.5)),  # 0.25 of the vote: dropped
    ]
    out = fuse_blocks(blocks, proposals, DEFAULT, ["rules", "yolo"], lambda box: "read from the text layer")
    kinds = [(b.kind, b.proposed_by) for b in out]
    assert kinds == [("text", None), ("equation", "rules+yolo"), ("table", "yolo"), ("figure", "rules")]
    eq, table = out[1], out[2]
    assert eq.bbox == (200, 100, 400, 120) and eq.text == "E = mc2"
    assert table.text == "read from the text layer" and table.score == pytest.approx(0.475)


def test_on_an_ocr_page_a_detected_equation_takes_the_ocr_text_it_covers():
    """A scan has no text layer to read a fused box from: the OCR lines it covers are its text (marked ``ocr``),
    not lost with the text blocks it replaces."""
    import pymupdf

    from parsing.backends import OCR_TEXT
    from parsing.core import fused_blocks

    page = pymupdf.open().new_page(width=612, height=792)  # no text layer, as on a scan
    blocks = [
        Block("text", (72, 100, 540, 140), "prose above", reading_order=0),
        Block("text", (180, 455, 330, 475), "g(y) = 2 y", reading_order=1),  # an OCR line the layout called text
        Block("text", (72, 500, 540, 540), "prose below", reading_order=2),
    ]
    detected = [("yolo", Block("equation", (175, 450, 335, 480), score=0.99))]
    out = fused_blocks(page, blocks, detected, ("yolo",), "rapidocr")
    assert [(b.kind, b.text, b.text_from) for b in out] == [
        ("text", "prose above", None),
        ("equation", "g(y) = 2 y", OCR_TEXT),
        ("text", "prose below", None),
    ]


def test_scans_fuse_equations_with_their_own_fitted_parameters():
    """Equations on a page the OCR backend parsed use ``FITTED_SCAN`` (fitted on degraded copies: every box either
    source proposes), digital pages ``FITTED``: a detector formula box at score 0.3 is kept on a scan and dropped on
    a digital page, where the prior wants 0.8 from one voter."""
    import pymupdf

    from parsing.core import fused_blocks
    from parsing.fusion import FITTED, FITTED_SCAN

    assert FITTED_SCAN.kinds["equation"] != FITTED.kinds["equation"]
    assert FITTED_SCAN.kinds["figure"] == FITTED.kinds["figure"] and FITTED_SCAN.kinds["table"] == FITTED.kinds["table"]
    page = pymupdf.open().new_page(width=612, height=792)
    weak = [("yolo", Block("equation", (200, 300, 400, 330), score=0.3))]
    on_scan = fused_blocks(page, [], weak, ("yolo",), "rapidocr")
    assert [(b.kind, b.bbox, b.proposed_by) for b in on_scan] == [("equation", (200, 300, 400, 330), "yolo")]
    assert fused_blocks(page, [], weak, ("yolo",), "mineru") == []
