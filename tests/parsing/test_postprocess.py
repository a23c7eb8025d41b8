"""Box clean-up on synthetic pages: two figures in one box are split, panels of one figure are merged,
a figure box that swallowed a paragraph's last line or a running header is trimmed back."""

from __future__ import annotations

import pymupdf
import pytest

from formats.records import Block
from parsing.geometry import iou
from parsing.postprocess import continues_block, drop_equation_numbers, refine_blocks, split_figure
from tests.parsing.fixtures import _plot_png


def _page_with_images(rects, lines=()):
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    png = _plot_png(200, 120)
    for r in rects:
        page.insert_image(pymupdf.Rect(r), stream=png, keep_proportion=False)
    for pos, text in lines:
        page.insert_text(pos, text, fontsize=10)
    return doc, page


def test_figure_box_spanning_two_columns_is_split():
    doc, page = _page_with_images([(60, 80, 280, 210), (330, 80, 550, 300)])
    text = Block("text", (60, 230, 290, 400), text="column text", reading_order=2)
    blocks = [
        Block("figure", (55, 75, 555, 305), reading_order=0),  # the detector joined both figures
        Block("caption", (60, 212, 280, 225), text="Figure 1: left", reading_order=1, caption_of=0),
        text,
        Block("caption", (330, 305, 550, 318), text="Figure 2: right", reading_order=3, caption_of=0),
    ]
    out = refine_blocks(page, blocks)
    figs = [b for b in out if b.kind == "figure"]
    assert len(figs) == 2
    assert iou(figs[0].bbox, (60, 80, 280, 210)) > 0.9 and iou(figs[1].bbox, (330, 80, 550, 300)) > 0.9
    caps = {b.text: b.caption_of for b in out if b.kind == "caption"}
    assert out[caps["Figure 1: left"]].bbox == figs[0].bbox
    assert out[caps["Figure 2: right"]].bbox == figs[1].bbox
    assert [b.reading_order for b in out] == list(range(len(out)))


def test_panels_of_one_figure_are_merged_with_subcaptions():
    doc, page = _page_with_images(
        [(100, 100, 290, 220), (300, 100, 490, 220)], lines=[((150, 232), "(a) left"), ((350, 232), "(b) right")]
    )
    blocks = [
        Block("figure", (100, 100, 290, 220), reading_order=0),
        Block("figure", (300, 100, 490, 220), reading_order=1),
        Block("caption", (150, 224, 400, 236), text="(a) left (b) right", reading_order=2),
        Block("caption", (100, 250, 490, 262), text="Figure 3: Two panels.", reading_order=3, caption_of=1),
    ]
    out = refine_blocks(page, blocks)
    figs = [b for b in out if b.kind == "figure"]
    assert len(figs) == 1
    assert figs[0].bbox[1] <= 101 and figs[0].bbox[3] >= 232 and figs[0].bbox[0] <= 101 and figs[0].bbox[2] >= 489
    (cap,) = [b for b in out if b.kind == "caption"]
    assert cap.caption_of == figs[0].reading_order


def test_swallowed_paragraph_line_and_header_are_trimmed():
    doc, page = _page_with_images(
        [(150, 200, 450, 380)], lines=[((72, 40), "Journal header 2024"), ((72, 170), "last line of paragraph.")]
    )
    blocks = [
        Block("text", (72, 100, 540, 160), text="paragraph", reading_order=0),
        Block("figure", (60, 30, 550, 390), reading_order=1),  # reaches up over the header and the last line
    ]
    (fig,) = [b for b in refine_blocks(page, blocks) if b.kind == "figure"]
    assert iou(fig.bbox, (150, 200, 450, 380)) > 0.95, fig.bbox


@pytest.mark.parametrize(
    ("line", "expected"), [((72, 162, 200, 172), True), ((150, 162, 300, 172), False), ((72, 200, 200, 210), False)]
)
def test_continues_block(line, expected):
    assert continues_block(line, (72, 100, 540, 160), 10.0) is expected


def test_text_only_clusters_are_not_figure_pieces():
    pieces = split_figure((0, 0, 600, 400), [(100, 100, 400, 300), (10, 5, 200, 15)], [True, False], gap=16)
    assert pieces == [(100, 100, 400, 300)]


def test_undetected_vector_drawing_becomes_a_figure_and_its_caption_is_promoted():
    """MinerU flash misses thin-line sketches; the vector-path detector adds them, and a text block starting
    with a caption label right under the new figure becomes its caption."""
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    page.draw_line((200, 150), (400, 150))  # axes (hairlines) ...
    page.draw_line((220, 60), (220, 170))
    page.draw_circle((300, 100), 30)  # ... and curves/dots make it a drawing, not a ruled table
    page.draw_line((230, 160), (390, 70))
    page.insert_text((330, 95), "P", fontsize=9)
    page.insert_text((72, 200), "Abbildung 2: Ein Kreis.", fontsize=10)
    page.insert_text((72, 260), "Running text below the figure that continues for a while.", fontsize=10)
    blocks = [
        Block("text", (72, 190, 300, 204), text="Abbildung 2: Ein Kreis.", reading_order=0),
        Block("text", (72, 250, 540, 264), text="Running text below the figure.", reading_order=1),
    ]
    out = refine_blocks(page, blocks)
    figs = [b for b in out if b.kind == "figure"]
    assert len(figs) == 1
    assert iou(figs[0].bbox, (200, 60, 400, 170)) > 0.85, figs[0].bbox
    (cap,) = [b for b in out if b.kind == "caption"]
    assert cap.caption_of == figs[0].reading_order and figs[0].reading_order < cap.reading_order


def test_ruled_table_lines_alone_are_not_a_figure():
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    for y in (100, 120, 140, 160):
        page.draw_line((100, y), (500, y))
    for x in (100, 300, 500):
        page.draw_line((x, 100), (x, 160))
    assert [b.kind for b in refine_blocks(page, [])] == []


def test_framed_algorithm_with_figure_caption_becomes_a_figure():
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    for a, b in [((113, 72), (499, 72)), ((113, 72), (113, 235)), ((499, 72), (499, 235)), ((113, 235), (499, 235))]:
        page.draw_line(a, b)  # a frame drawn as four separate lines, as LaTeX does
    for i in range(8):
        page.insert_text((120, 90 + 18 * i), f"for each item {i}: do something", fontsize=9)
    blocks = [
        Block("text", (118, 80, 436, 225), text="for each item ...", reading_order=0),
        Block("caption", (199, 240, 412, 252), text="Figure 6: Computing similarity", reading_order=1),
    ]
    out = refine_blocks(page, blocks)
    (fig,) = [b for b in out if b.kind == "figure"]
    assert iou(fig.bbox, (113, 72, 499, 235)) > 0.95
    (cap,) = [b for b in out if b.kind == "caption"]
    assert cap.caption_of == fig.reading_order
    assert not [b for b in out if b.kind == "text"]  # the algorithm's lines live in the crop now


def test_vectorised_paragraph_continuation_equals_the_scalar_check():
    import numpy as np

    from parsing.postprocess import _continues_any

    rng = np.random.default_rng(0)
    blocks = [(float(x), float(y), float(x + 200), float(y + 40)) for x, y in rng.integers(0, 400, (30, 2))]
    lines = [(float(x), float(y), float(x + w), float(y + 10)) for x, y, w in rng.integers(0, 440, (500, 3))]
    lines += [(b[0] + 1, b[3] + 2, b[2] - 5, b[3] + 12) for b in blocks[:10]]  # real continuations
    got = _continues_any(lines, blocks, 10.0)
    assert got == [any(continues_block(ln, b, 10.0) for b in blocks) for ln in lines]
    assert sum(got) >= 10
    assert _continues_any(lines[:2], [], 10.0) == [False, False] and _continues_any([], blocks, 10.0) == []


def test_equation_boxes_drop_their_number_and_twins_become_one():
    """The references box an equation without its "(n)": a box reaching the number is cut at the ink before the
    gap (digital: the number is a text-layer word; scanned: the box's OCR text ends with it), the twin it then
    duplicates is merged into one, and a wide gap with no number in evidence cuts nothing."""
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    page.insert_text((200, 100), "E = mc^2 + a + b", fontsize=11, fontname="Times-Italic")
    page.insert_text((530, 100), "(1)", fontsize=11)
    page.insert_text((200, 200), "x = 1,", fontsize=11, fontname="Times-Italic")
    page.insert_text((400, 200), "y = 2 + z + w + v + u", fontsize=11, fontname="Times-Italic")
    math_end = max(w[2] for w in page.get_text("words") if w[1] < 110 and w[4] != "(1)")
    blocks = [
        Block("equation", (195, 88, 550, 104), reading_order=0),  # the detector's, with the number
        Block("equation", (198, 89, math_end + 1, 103), text="E = mc^2 + a + b", reading_order=1),  # the rules'
        Block("equation", (195, 188, 540, 204), reading_order=2),  # no number: kept whole
    ]
    out = drop_equation_numbers(page, blocks)
    assert len(out) == 2
    assert out[0].text == "E = mc^2 + a + b" and abs(out[0].bbox[2] - math_end) < 3 and out[0].bbox[0] == 195
    assert out[1].bbox == (195, 188, 540, 204)
    # a scan: no text layer, the number only in the box's OCR text
    pix = page.get_pixmap(dpi=150)
    scan = pymupdf.open()
    spage = scan.new_page(width=612, height=792)
    spage.insert_image(spage.rect, pixmap=pix)
    (cut,) = drop_equation_numbers(spage, [Block("equation", (195, 88, 550, 104), text="E = mc^2 + a + b (1)")])
    assert cut.text == "E = mc^2 + a + b" and abs(cut.bbox[2] - math_end) < 3
