"""Self-labelled layout data (``parsing.selflabel``) on pages generated here: display equations found from the
text layer (numbered, centred, multi-line), not inline math, headings or figure labels; skewed boxes follow
the ink; documents stay in one split."""

from __future__ import annotations

import json

import numpy as np
import pymupdf
import pytest

from parsing.geometry import containment, iou
from parsing.selflabel import Degrade, degraded_image, page_labels, rotate_box, split_of, write_dataset
from tests.parsing.fixtures import LOREM, _plot_png


def labelled_page():
    """A heading, a paragraph with inline math, a numbered two-line display (Symbol font), a paragraph, a
    centred unnumbered display, a raster figure with "Figure 1" under it and math-font labels inside it."""
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    page.insert_text((72, 70), "2.1 Estimates", fontsize=14, fontname="hebo", color=(0.8, 0, 0))
    page.insert_textbox(pymupdf.Rect(72, 80, 540, 150), LOREM, fontsize=10)
    page.insert_text((72, 160), "where the sum ", fontsize=10)
    page.insert_text((140, 160), "S a = b", fontsize=10, fontname="symb")  # inline: the sentence goes on
    page.insert_text((180, 160), " holds for every sample of the measure.", fontsize=10)
    page.insert_text((220, 190), "f(x) = ", fontsize=12, fontname="tiro")
    page.insert_text((258, 190), "a b + g", fontsize=12, fontname="symb")
    page.insert_text((240, 206), "+ ", fontsize=12, fontname="tiro")
    page.insert_text((252, 206), "S d l", fontsize=12, fontname="symb")
    page.insert_text((520, 199), "(1)", fontsize=10, fontname="tiro")
    page.insert_textbox(pymupdf.Rect(72, 220, 540, 290), LOREM, fontsize=10)
    page.insert_text((260, 310), "a + b = g d", fontsize=12, fontname="symb")  # centred, no number
    page.insert_textbox(pymupdf.Rect(72, 322, 540, 380), LOREM, fontsize=10)
    page.insert_image(pymupdf.Rect(150, 400, 450, 580), stream=_plot_png(300, 180), keep_proportion=False)
    page.insert_text((160, 430), "a b", fontsize=9, fontname="symb")  # a label drawn over the picture
    page.insert_text((150, 596), "Figure 1: The estimate over the sample.", fontsize=9)
    return doc, page


def test_display_equations_and_a_captioned_figure_are_labelled():
    doc, page = labelled_page()
    labels = page_labels(page)
    eqs = [lb.bbox for lb in labels if lb.kind == "equation"]
    figs = [lb.bbox for lb in labels if lb.kind == "figure"]
    assert len(eqs) == 2, eqs
    numbered = max(eqs, key=lambda b: b[3] - b[1])  # the two-line display, without its "(1)"
    assert numbered[1] < 182 and numbered[3] > 204 and numbered[0] > 210 and numbered[2] < 400
    assert any(b[1] < 304 < b[3] and b[0] > 250 for b in eqs)  # the centred one
    assert not any(b[1] < 160 < b[3] for b in eqs)  # inline math, not a display
    assert not any(b[1] < 70 < b[3] for b in eqs)  # the heading
    assert len(figs) == 1 and iou(figs[0], (150, 400, 450, 580)) > 0.95


def test_a_page_without_a_text_layer_is_not_labelled():
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    page.insert_image(pymupdf.Rect(0, 0, 612, 792), stream=_plot_png(300, 400), keep_proportion=False)
    assert page_labels(page) is None


@pytest.mark.parametrize("deg", [-1.4, 0.9])
def test_skewed_box_still_holds_its_ink(deg):
    doc = pymupdf.open()
    page = doc.new_page(width=400, height=300)
    box = (120, 100, 260, 160)
    page.draw_rect(pymupdf.Rect(box), color=(0, 0, 0), fill=(0, 0, 0))
    img, zoom = degraded_image(page, Degrade(dpi=100, skew_deg=deg, blur=0.0, noise=0.0, jpeg=90), seed=0)
    arr = np.asarray(img)
    ys, xs = np.nonzero(arr < 128)
    ink = (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)
    moved = rotate_box(tuple(v * zoom for v in box), deg, img.width / 2, img.height / 2)
    assert containment(ink, moved) > 0.97 and iou(ink, moved) > 0.9


def test_dataset_is_split_by_document(tmp_path):
    pdfs = tmp_path / "pdfs"
    pdfs.mkdir()
    for name in ("paper_a.pdf", "paper_b.pdf"):
        doc, _ = labelled_page()
        doc.insert_pdf(labelled_page()[0])  # two pages per document
        doc.save(pdfs / name)
    counts = write_dataset(sorted(pdfs.glob("*.pdf")), tmp_path / "out", seed=1)
    assert counts["pages"] == 4 and counts["equation"] == 8 and counts["figure"] == 4
    rows = [json.loads(x) for f in (tmp_path / "out").glob("*/labels.jsonl") for x in f.read_text().splitlines()]
    assert len(rows) == 4
    for r in rows:
        split = split_of(r["pdf"])
        assert (tmp_path / "out" / split / r["image"]).exists()
        assert r["size_px"][0] == pytest.approx(612 * r["px_per_pt"], abs=1)
        assert all(len(b["bbox_px"]) == 4 for b in r["boxes"])
    assert split_of("paper_a.pdf") == split_of("paper_a.pdf")
