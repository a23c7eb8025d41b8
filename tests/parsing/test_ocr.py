"""A page without a text layer goes to the offline OCR path (rapid-layout + rapidocr) and yields text."""

from __future__ import annotations

import pymupdf

from parsing import Document, Page, ParseConfig
from parsing.backends import OCR_TEXT
from parsing.core import is_scanned
from tests.parsing.fixtures import paper_pdf, scanned_equation_pdf, scanned_pdf


def test_scan_detection():
    assert is_scanned(pymupdf.open(stream=scanned_pdf())[0])
    assert not is_scanned(pymupdf.open(stream=paper_pdf())[0])


def test_scanned_page_is_ocred(parser):
    recs = list(parser.iter_parse(scanned_pdf(), "scan.pdf", ParseConfig(backend="mineru")))
    assert isinstance(recs[0], Document)
    (page,) = [r for r in recs if isinstance(r, Page)]
    assert page.parser == "rapidocr"
    text = " ".join(b.text for b in page.blocks).lower()
    assert "detector" in text and "scanned" in text, text
    assert any(b.kind == "title" for b in page.blocks)


def test_a_scanned_display_equation_keeps_its_crop_and_its_text_marked_as_ocr(parser):
    recs = list(parser.iter_parse(scanned_equation_pdf(), "scan-eq.pdf", ParseConfig()))  # the default parser
    (page,) = [r for r in recs if isinstance(r, Page)]
    assert page.parser == "rapidocr"
    (eq,) = [b for b in page.blocks if b.kind == "equation"]
    assert eq.crop is not None and eq.crop.width > 100  # the picture of the equation ...
    assert eq.text_from == OCR_TEXT and "f(x)" in eq.text.replace(" ", "")  # ... and what OCR read, marked as such
    assert all(b.text_from is None for b in page.blocks if b.kind != "equation")
