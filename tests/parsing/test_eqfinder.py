"""The pixel-level equation finder (``parsing.eqfinder``): line pieces cut from a rendered page, features that
set a display apart, the fit on self-labelled pages, and the shipped weights' file format."""

from __future__ import annotations

import json

import numpy as np
import pymupdf

from parsing import eqfinder as E
from parsing.geometry import containment
from parsing.selflabel import write_dataset
from tests.parsing.test_selflabel import labelled_page


def _render(page, dpi=150):
    pix = page.get_pixmap(dpi=dpi, colorspace=pymupdf.csGRAY)
    return np.frombuffer(pix.samples, dtype=np.uint8).reshape(pix.height, pix.width), dpi / 72


def test_pieces_cut_lines_and_set_the_display_apart():
    doc, page = labelled_page()
    gray, zoom = _render(page)
    ps, mh = E.pieces(gray)
    assert 5 < mh < 20
    # the centred display (y 298..312 pt) is one piece, indented from the column on both sides
    display = [p for p in ps if containment(p.box, (250 * zoom, 296 * zoom, 360 * zoom, 316 * zoom)) > 0.8]
    assert len(display) == 1
    f = display[0].features
    assert f[3] > 10 and f[4] > 10  # indentation left and right, in character heights
    # a paragraph line spans its column: no indentation on either side
    para = [p for p in ps if p.box[1] > 222 * zoom and p.box[3] < 290 * zoom and p.features[2] > 0.9]
    assert para and all(p.features[3] < 2 and p.features[4] < 3 for p in para)
    # the "(1)" alone at the right of its row
    assert any(p.features[12] == 1.0 and p.box[0] > 500 * zoom for p in ps)


def test_fit_on_self_labelled_pages_finds_the_displays(tmp_path):
    pdfs = tmp_path / "pdfs"
    pdfs.mkdir()
    for k in range(3):
        doc, _ = labelled_page()
        doc.save(pdfs / f"doc{k}.pdf")
    write_dataset(sorted(pdfs.glob("*.pdf")), tmp_path / "sl", seed=0)
    report = E.train(tmp_path / "sl", out=tmp_path / "w.json")
    assert report["train_positive"] > 0
    model = E.load(tmp_path / "w.json")
    saved = json.loads((tmp_path / "w.json").read_text())
    assert saved["command"].startswith("python -m parsing.eqfinder train")
    doc, page = labelled_page()
    found = [b for b, _ in E.find_on_page(page, model)]
    # a box on each display (at least one of its lines) and none elsewhere; in-sample: a check of the
    # plumbing (labels -> pieces -> fit -> boxes in points), not of generalisation (benchmarks/RESULTS.md #39)
    displays = [(250, 294, 345, 316), (210, 176, 335, 210)]
    assert all(any(containment(b, d) > 0.8 for b in found) for d in displays)
    assert all(any(containment(b, d) > 0.8 for d in displays) for b in found)


def test_shipped_weights_load():
    model = E.load()
    assert len(model.coef) == len(model.mean) == len(model.std)
    assert 0 < model.threshold < 1
