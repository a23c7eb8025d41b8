"""The pixel-level equation finder (``parsing.eqfinder``): the detector's formula boxes described by the features
the calibration reads, the fit on self-labelled degraded pages through the module's own command, and the shipped
calibration's file format."""

from __future__ import annotations

import json

import numpy as np

from parsing import eqfinder as E
from parsing.selflabel import write_dataset
from tests.parsing.test_selflabel import labelled_page


def test_candidates_describe_formula_boxes_and_what_covers_them():
    dets = [
        ("equation", (250.0, 300.0, 362.0, 316.0), 0.9),  # a centred display
        ("equation", (140.0, 152.0, 180.0, 164.0), 0.3),  # inside a paragraph's text box
        ("text", (72.0, 150.0, 540.0, 200.0), 0.8),
        ("figure", (150.0, 400.0, 450.0, 580.0), 0.7),  # not a candidate, covers nothing it is asked about
    ]
    boxes, x = E.candidates(dets, 612, 792)
    assert boxes == [dets[0][1], dets[1][1]] and x.shape == (2, len(E.FEATURES))
    f = dict(zip(E.FEATURES, x.T))
    assert f["score"].tolist() == [0.9, 0.3]
    assert np.allclose(f["logit"], np.log([9.0, 0.3 / 0.7]))
    assert f["cover"].tolist() == [0.0, 0.8]  # the display is on no text box; the inline formula is
    assert f["off_centre"][0] < 0.01 < f["off_centre"][1]
    assert np.isclose(f["width"][0], 112 / 612) and np.isclose(f["height"][0], 16 / 792)
    model = E.Model([0.0] * 8, [1.0] * 8, [0, 0, 0, 0, 0, 0, -5.0, 0], 1.0, threshold=0.5)
    assert [b for b, _ in E.find(dets, 612, 792, model)] == [dets[0][1]]  # the covered one falls below it


def test_train_on_self_labelled_pages_writes_a_calibration_that_finds(tmp_path):
    pdfs = tmp_path / "pdfs"
    pdfs.mkdir()
    for k in range(3):
        doc, _ = labelled_page()
        doc.save(pdfs / f"doc{k}.pdf")
    write_dataset(sorted(pdfs.glob("*.pdf")), tmp_path / "sl", seed=0)
    report = E.train([tmp_path / "sl"], out=tmp_path / "w.json")
    assert report["labelled"] == 6 and report["candidates"] > 0 and set(report["documents"]) == {
        "doc0.pdf", "doc1.pdf", "doc2.pdf"}  # fmt: skip
    saved = json.loads((tmp_path / "w.json").read_text())
    assert saved["command"].startswith("python -m parsing.eqfinder train") and saved["features"] == list(E.FEATURES)
    model = E.load(tmp_path / "w.json")
    assert 0 < model.threshold < 1
    # the calibrated boxes on a clean render of the page, in PDF points: each lies on a display; in-sample, so a
    # check of the plumbing (images -> detector -> labels -> fit -> boxes in points), not of generalisation
    displays = [(240, 294, 350, 316), (210, 176, 335, 212)]
    _, page = labelled_page()
    found = [b for b, _ in E.find_on_page(page, model, E.detector())]
    assert found and all(max(E.iou(b, d) for d in displays) > 0.3 for b in found), found


def test_shipped_calibration_loads():
    model = E.load()
    saved = json.loads(E.WEIGHTS.read_text())
    assert len(model.coef) == len(model.mean) == len(model.std) == len(E.FEATURES) == len(saved["features"])
    assert 0 < model.threshold < 1 and "leave_one_document_out" in saved["report"]
