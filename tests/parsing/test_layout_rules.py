"""The layout rules of ``parsing.layout_rules`` on PDFs generated here with PyMuPDF: the boxes a careful reader
would draw, from detector boxes shaped like the mistakes seen on real papers (over-split panels, a ruled table
called a picture, a display equation in one box per line, prose called an equation, a header band, a heading
bar, a missed picture). The end-to-end test runs MinerU flash on the generated pages."""

from __future__ import annotations

import pymupdf
import pytest

from formats.records import Block
from parsing import layout_rules as R
from parsing.geometry import containment, iou
from parsing.postprocess import page_elements, refine_blocks
from tests.parsing.fixtures import LOREM, _plot_png


def _info(page):
    graphics, _, paths = page_elements(page)
    return R.page_info(page, graphics, paths)


def _kinds(blocks, kind):
    return [b for b in blocks if b.kind == kind]


# --------------------------------------------------------------------------- generated pages
def multi_panel_page():
    """Four raster panels in a 2×2 grid, each with a "(a)".."(d)" label under it, then a "Figure 1" caption."""
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    png = _plot_png(200, 120)
    panels = [(100, 100, 295, 217), (317, 100, 512, 217), (100, 240, 295, 357), (317, 240, 512, 357)]
    for r, label in zip(panels, "abcd"):
        page.insert_image(pymupdf.Rect(r), stream=png, keep_proportion=False)
        page.insert_text(((r[0] + r[2]) / 2 - 20, r[3] + 12), f"({label}) panel", fontsize=9)
    page.insert_text((100, 385), "Figure 1: Four panels of one experiment.", fontsize=9)
    page.insert_textbox(pymupdf.Rect(72, 410, 540, 600), LOREM, fontsize=10)
    return doc, page, panels


def ruled_table_page():
    """ "Table 1" caption above a ruled 5×7 grid of text cells."""
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    page.insert_text((110, 100), "Table 1: Results per class.", fontsize=9)
    x0, y0, cw, rh = 110, 110, 80, 20
    for r in range(7):
        for c in range(5):
            page.insert_text((x0 + c * cw + 6, y0 + r * rh + 14), f"r{r}c{c}" if r else f"Col {c}", fontsize=9)
    for r in range(8):
        page.draw_line((x0, y0 + r * rh), (x0 + 5 * cw, y0 + r * rh), width=0.5)
    for c in range(6):
        page.draw_line((x0 + c * cw, y0), (x0 + c * cw, y0 + 7 * rh), width=0.5)
    page.insert_textbox(pymupdf.Rect(72, 300, 540, 500), LOREM, fontsize=10)
    return doc, page, (x0, y0, x0 + 5 * cw, y0 + 7 * rh)


def equation_page():
    """A paragraph, a two-line display equation (Greek letters in the Symbol font, centred) numbered "(1)"
    at the right margin, and another paragraph."""
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    page.insert_textbox(pymupdf.Rect(72, 72, 540, 190), LOREM, fontsize=10)
    page.insert_text((220, 220), "f(x) = ", fontsize=12, fontname="tiro")
    page.insert_text((258, 220), "a b + g", fontsize=12, fontname="symb")  # α β + γ
    page.insert_text((240, 238), "+ ", fontsize=12, fontname="tiro")
    page.insert_text((252, 238), "S d l", fontsize=12, fontname="symb")  # Σ δ λ
    page.insert_text((520, 229), "(1)", fontsize=10, fontname="tiro")
    page.insert_textbox(pymupdf.Rect(72, 260, 540, 380), LOREM, fontsize=10)
    return doc, page


# --------------------------------------------------------------------------- the three rules of the issue
def test_multi_panel_figure_is_one_box_with_its_caption():
    doc, page, panels = multi_panel_page()
    blocks = [Block("figure", r, reading_order=i) for i, r in enumerate(panels)]  # the detector boxed each panel
    blocks += [
        Block("caption", (100, 376, 400, 388), text="Figure 1: Four panels of one experiment.", reading_order=4),
        Block("text", (72, 410, 540, 600), text=LOREM, reading_order=5),
    ]
    out = refine_blocks(page, blocks)
    (fig,) = _kinds(out, "figure")
    # every panel is inside the one box; the caption and the paragraph are not (the "(x)" label lines under
    # the lower panels may stay out: the rule that grew figures over them was dropped in issue 26)
    for r in panels:
        assert containment(r, fig.bbox) > 0.98
    (cap,) = _kinds(out, "caption")
    assert cap.caption_of == fig.reading_order
    assert fig.bbox[3] < 376


def test_ruled_table_called_a_picture_is_a_table():
    doc, page, grid = ruled_table_page()
    blocks = [
        Block("caption", (110, 91, 300, 103), text="Table 1: Results per class.", reading_order=0, caption_of=1),
        Block("figure", grid, reading_order=1),  # the detector saw a picture
        Block("text", (72, 300, 540, 500), text=LOREM, reading_order=2),
    ]
    out = refine_blocks(page, blocks)
    assert not _kinds(out, "figure")
    (table,) = _kinds(out, "table")
    assert iou(table.bbox, grid) > 0.9
    assert "r3c2" in table.text  # the table's text comes from the page
    (cap,) = _kinds(out, "caption")
    assert cap.caption_of == table.reading_order


def test_visual_captioned_figure_is_not_a_table():
    doc, page = multi_panel_page()[:2]
    blocks = [
        Block("table", (100, 100, 295, 217), reading_order=0),
        Block("caption", (100, 376, 400, 388), text="Figure 1: Four panels.", reading_order=1, caption_of=0),
    ]
    assert [b.kind for b in R.fix_visual_kinds(blocks, _info(page))] == ["figure", "caption"]


def test_display_equation_split_per_line_is_one_box():
    doc, page = equation_page()
    blocks = [
        Block("text", (72, 72, 540, 190), text=LOREM, reading_order=0),
        Block("equation", (218, 208, 330, 224), reading_order=1),  # one box per line, number missed
        Block("equation", (238, 226, 320, 242), reading_order=2),
        Block("text", (72, 260, 540, 380), text=LOREM, reading_order=3),
    ]
    out = refine_blocks(page, blocks)
    (eq,) = _kinds(out, "equation")
    assert eq.bbox[1] <= 210 and eq.bbox[3] >= 238  # both lines
    assert len(_kinds(out, "text")) == 2


def test_numbered_display_equation_missed_by_the_detector_is_found():
    doc, page = equation_page()
    blocks = [
        Block("text", (72, 72, 540, 190), text=LOREM, reading_order=0),
        Block("text", (72, 260, 540, 380), text=LOREM, reading_order=1),
    ]
    out = refine_blocks(page, blocks)
    (eq,) = _kinds(out, "equation")
    assert eq.bbox[0] < 225 and eq.bbox[2] > 525  # from the formula to its number "(1)"
    assert eq.bbox[1] < 212 and eq.bbox[3] > 236  # one box for both lines
    assert [b.kind for b in out] == ["text", "equation", "text"]  # in reading order between the paragraphs


def test_inline_number_in_running_text_is_no_equation():
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    page.insert_text((72, 100), "as shown by Smith et al. for a and b in Eq.", fontsize=10, fontname="tiro")
    page.insert_text((290, 100), "(1)", fontsize=10, fontname="tiro")
    blocks = [Block("text", (70, 90, 310, 104), text="as shown ...", reading_order=0)]
    assert not _kinds(refine_blocks(page, blocks), "equation")


# --------------------------------------------------------------------------- the other rules
def test_prose_boxed_as_equation_is_text_but_math_stays():
    doc, page = equation_page()
    page.insert_text((150, 40), "Optimized Table Tokenization for Structure Recognition 9", fontsize=9)
    info = _info(page)
    assert R.is_prose((140, 30, 500, 44), info)  # a running header
    assert not R.is_prose((215, 205, 335, 243), info)  # the formula (Symbol font)
    blocks = [Block("equation", (140, 30, 500, 44), reading_order=0)]
    assert [b.kind for b in R.demote_prose_equations(blocks, info)] == ["text"]


def test_header_band_is_furniture_small_logo_is_not():
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    page.draw_rect(pymupdf.Rect(0, 0, 612, 30), color=None, fill=(0.8, 0.8, 0.9))  # a header band
    page.insert_image(pymupdf.Rect(500, 740, 560, 785), stream=_plot_png(60, 45))  # a small logo in the footer
    page.insert_textbox(pymupdf.Rect(72, 100, 540, 300), LOREM, fontsize=10)
    blocks = [
        Block("figure", (0, 0, 612, 30), reading_order=0),
        Block("text", (72, 100, 540, 300), text=LOREM, reading_order=1),
        Block("figure", (500, 740, 560, 785), reading_order=2),
    ]
    out = refine_blocks(page, blocks)
    (fig,) = _kinds(out, "figure")
    assert fig.bbox[1] > 700


def test_heading_bar_is_text_not_a_figure():
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    page.draw_rect(pymupdf.Rect(72, 100, 300, 128), color=None, fill=(0.85, 0.85, 0.85))
    page.insert_text((90, 119), "2  Related work", fontsize=13, fontname="hebo")
    page.insert_textbox(pymupdf.Rect(72, 140, 540, 300), LOREM, fontsize=10)
    blocks = [
        Block("figure", (72, 100, 300, 128), reading_order=0),
        Block("text", (72, 140, 540, 300), text=LOREM, reading_order=1),
    ]
    out = refine_blocks(page, blocks)
    assert not _kinds(out, "figure")
    assert "Related work" in out[0].text


def test_page_boxed_as_one_figure_becomes_text_and_its_picture():
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    page.insert_image(pymupdf.Rect(72, 60, 160, 130), stream=_plot_png(88, 70))  # a picture beside the title
    page.insert_text((180, 100), "A Report", fontsize=20)
    page.insert_textbox(pymupdf.Rect(72, 150, 540, 700), (LOREM + " ") * 4, fontsize=10)
    blocks = [Block("figure", (60, 50, 550, 710), reading_order=0)]  # the detector called the page a picture
    out = refine_blocks(page, blocks)
    (fig,) = _kinds(out, "figure")
    assert iou(fig.bbox, (72, 60, 160, 130)) > 0.8
    assert any(b.kind == "text" and "Layout analysis" in b.text for b in out)


def test_missed_raster_picture_becomes_a_figure():
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    page.insert_textbox(pymupdf.Rect(72, 72, 540, 200), LOREM, fontsize=10)
    page.insert_image(pymupdf.Rect(200, 220, 400, 340), stream=_plot_png(200, 120))
    page.insert_image(pymupdf.Rect(300, 380, 310, 390), stream=_plot_png(20, 20))  # an icon: too small
    blocks = [Block("text", (72, 72, 540, 200), text=LOREM, reading_order=0)]
    out = refine_blocks(page, blocks)
    (fig,) = _kinds(out, "figure")
    assert iou(fig.bbox, (200, 220, 400, 340)) > 0.9


# --------------------------------------------------------------------------- end to end, MinerU flash
@pytest.fixture(scope="module")
def generated_pdf() -> bytes:
    """The three pages above in one document."""
    out = pymupdf.open()
    for make in (multi_panel_page, ruled_table_page, equation_page):
        doc = make()[0]
        out.insert_pdf(doc)
    return out.tobytes()


@pytest.mark.slow
def test_parser_on_generated_pages(parser, generated_pdf):
    """MinerU flash + the rules on the generated pages: one figure for the four panels, the ruled table a
    table, the numbered two-line display one equation box."""
    from formats.records import Page
    from parsing import ParseConfig

    pages = [r for r in parser.iter_parse(generated_pdf, "generated.pdf", ParseConfig()) if isinstance(r, Page)]
    assert len(pages) == 3
    figs = _kinds(pages[0].blocks, "figure")
    assert len(figs) == 1 and containment((100, 100, 512, 357), figs[0].bbox) > 0.95
    tables = _kinds(pages[1].blocks, "table")
    assert len(tables) == 1 and iou(tables[0].bbox, (110, 110, 510, 250)) > 0.8
    assert not _kinds(pages[1].blocks, "figure")
    eqs = _kinds(pages[2].blocks, "equation")
    assert len(eqs) == 1 and eqs[0].bbox[1] < 212 and eqs[0].bbox[3] > 236


def test_theorem_frame_called_a_table_is_text_ruled_table_is_not():
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    page.draw_rect(pymupdf.Rect(72, 100, 540, 180), color=(0, 0, 0), width=0.6)
    page.insert_textbox(pymupdf.Rect(80, 108, 532, 175), "Theorem 2. " + LOREM[:220], fontsize=10)
    blocks = [Block("table", (72, 100, 540, 180), reading_order=0)]
    assert [b.kind for b in R.fix_visual_kinds(blocks, _info(page))] == ["text"]
    doc, page, grid = ruled_table_page()
    blocks = [Block("table", grid, reading_order=0)]
    assert [b.kind for b in R.fix_visual_kinds(blocks, _info(page))] == ["table"]


def test_centred_unnumbered_display_read_as_text_is_an_equation():
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    page.insert_textbox(pymupdf.Rect(72, 72, 540, 160), LOREM, fontsize=10)
    page.insert_text((250, 190), "a + b = g d + e", fontsize=12, fontname="symb")  # α + β = γ δ + ε, centred
    page.insert_textbox(pymupdf.Rect(72, 210, 540, 300), LOREM, fontsize=10)
    page.insert_text((72, 330), "a b g d e", fontsize=10, fontname="symb")  # Greek at the margin: not display
    blocks = [
        Block("text", (72, 72, 540, 160), text=LOREM, reading_order=0),
        Block("text", (248, 178, 340, 194), text="α + β = γ δ + ε", reading_order=1),
        Block("text", (72, 210, 540, 300), text=LOREM, reading_order=2),
        Block("text", (72, 320, 140, 334), text="α β γ δ ε", reading_order=3),
    ]
    assert [b.kind for b in R.promote_display_math(blocks, _info(page))] == ["text", "equation", "text", "text"]


def test_scan_equation_region_is_cut_at_its_prose_lines():
    """The layout model's equation region spans two displays and the sentence between them (OCR lines)."""
    lines = [
        ((72, 100, 540, 112), "We now define the bilinear form used in the proof below."),
        ((72, 114, 540, 126), "It is bounded and coercive on the space considered here."),
        ((200, 140, 420, 160), "B[u,v] = J aijuxvx dx"),
        ((72, 170, 480, 182), "By Exercise 5.17, then for all v in the space,"),
        ((180, 190, 440, 210), "B[o(u),v] = Jaiio(u)xx dx"),
        ((200, 212, 400, 230), "< 0 - J o(u)v|Du| dx"),
        ((72, 240, 540, 252), "which proves the claim after integrating over the domain."),
    ]
    regions = [("text", (72, 100, 540, 126), 0.9), ("equation", (72, 138, 540, 232), 0.7)]
    out = R.split_scan_equations(regions, lines, 612)
    assert [(k, tuple(round(x) for x in b)) for k, b, _ in out] == [
        ("text", (72, 100, 540, 126)),
        ("equation", (200, 140, 420, 160)),
        ("text", (72, 170, 480, 182)),
        ("equation", (180, 190, 440, 230)),
    ]


def test_drawing_called_a_table_is_a_figure():
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    for i in range(4):  # filled squares and circles with two letters: a diagram, not a table
        page.draw_rect(pymupdf.Rect(100 + 60 * i, 100, 140 + 60 * i, 140), color=(1, 0, 0), fill=(1, 0.8, 0.8))
        page.draw_circle((120 + 60 * i, 180), 15, color=(0, 0, 1))
    page.insert_text((110, 220), "a", fontsize=9)
    page.insert_text((290, 220), "b", fontsize=9)
    blocks = [Block("table", (95, 95, 345, 225), reading_order=0)]
    assert [b.kind for b in R.fix_visual_kinds(blocks, _info(page))] == ["figure"]


def test_axis_titles_set_apart_stay_in_the_figure():
    """A plot whose y-axis title is rotated 18 pt left of the tick labels and whose x-axis title sits under
    them: the figure box keeps both (a tightened box that drops them loses the plot's meaning)."""
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    page.draw_line((150, 100), (150, 250), width=0.8)  # axes
    page.draw_line((150, 250), (400, 250), width=0.8)
    page.draw_polyline([(150, 240), (200, 200), (260, 220), (330, 130), (400, 110)], color=(0, 0, 1), width=1.2)
    for i, y in enumerate((250, 200, 150, 100)):
        page.insert_text((138, y + 3), str(i), fontsize=8)
    for i, x in enumerate((150, 250, 350)):
        page.insert_text((x - 3, 262), f"{i}.{i}", fontsize=8)
    page.insert_text((118, 190), "MSE", fontsize=9, rotate=90)
    page.insert_text((270, 282), "λ", fontsize=9)
    page.insert_text((100, 320), "Figure 1: Error against the feedback weight.", fontsize=9)
    blocks = [
        Block("figure", (100, 90, 420, 290), reading_order=0),
        Block("caption", (100, 311, 400, 323), text="Figure 1: Error against the feedback weight.", reading_order=1),
    ]
    (fig,) = _kinds(refine_blocks(page, blocks), "figure")
    assert fig.bbox[0] < 120 and fig.bbox[3] > 280


# --------------------------------------------------------------------------- issue 39: text that is no visual
RED = (0.85, 0.0, 0.0)


def contents_page():
    """A lecture-notes table of contents: chapter lines in red bold without leaders, section lines in red with
    dot leaders, every page number right-aligned at x = 540."""
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    page.insert_text((90, 130), "Contents", fontsize=20, fontname="hebo")
    y = 170.0
    for c, (chapter, sections) in enumerate(
        (
            ("Topological spaces", ("Open sets", "Metric spaces", "Continuity", "Compactness")),
            ("Manifolds", ("Charts and atlases", "Smooth maps", "Simplicial complexes")),
            ("Fundamental group", ("Homotopy of paths", "Coverings")),
        ),
        1,
    ):
        page.insert_text((90, y), f"{c}", fontsize=11, fontname="hebo", color=RED)
        page.insert_text((106, y), chapter, fontsize=11, fontname="hebo", color=RED)
        page.insert_text((528, y), f"{10 * c}", fontsize=11, fontname="hebo")
        y += 15
        for s, title in enumerate(sections, 1):
            page.insert_text((106, y), f"{c}.{s}", fontsize=11, color=RED)
            page.insert_text((131, y), title, fontsize=11, color=RED)
            x0 = 131 + pymupdf.get_text_length(title, fontsize=11) + 6
            page.insert_text((x0, y), " ." * int((519 - x0) / 5.5), fontsize=11)
            page.insert_text((528, y), f"{10 * c + 2 * s}", fontsize=11)
            y += 14
        y += 10
    return doc, page, (86, 158, 543, y - 14)


def theorem_page():
    """A coloured section heading over a paragraph, then a framed theorem: prose lines around a centred 2×2
    matrix whose entries sit apart like table cells, and a numbered display equation after it."""
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    page.insert_text((90, 100), "2.3", fontsize=14, fontname="hebo", color=RED)
    page.insert_text((120, 100), "Compactness", fontsize=14, fontname="hebo", color=RED)
    page.insert_textbox(pymupdf.Rect(90, 115, 540, 190), LOREM, fontsize=10)
    page.draw_rect(pymupdf.Rect(86, 200, 544, 380), color=(0, 0, 0), width=0.6)
    page.insert_text((96, 218), "Theorem 2.4", fontsize=11, fontname="tibo")
    sentences = (
        "a) The group of invertible matrices acts on the upper half plane by the transformation",
        "b) The action is transitive and the stabiliser of every point is a compact subgroup of it.",
        "c) The quotient by the centre acts faithfully and is generated by the three matrices",
    )
    for k, line in enumerate(sentences[:2]):
        page.insert_text((110, 236 + 14 * k), line, fontsize=10)
    for r, row in enumerate((("a", "b"), ("c", "d"))):  # the matrix: entries apart like cells
        for c, entry in enumerate(row):
            page.insert_text((290 + 30 * c, 284 + 14 * r), entry, fontsize=10, fontname="tiit")
    page.insert_text((110, 330), sentences[2], fontsize=10)
    for r, row in enumerate((("1", "t"), ("0", "1"))):
        for c, entry in enumerate(row):
            page.insert_text((290 + 30 * c, 348 + 14 * r), entry, fontsize=10, fontname="tiit")
    page.insert_text((250, 420), "s(z) = ", fontsize=12, fontname="tiro")
    page.insert_text((288, 420), "a z + b", fontsize=12, fontname="symb")
    page.insert_text((520, 420), "(3)", fontsize=10, fontname="tiro")
    return doc, page, {"heading": (90, 88, 200, 104), "theorem": (86, 200, 544, 380), "equation": (248, 408, 340, 424)}


def test_heading_and_contents_lines_are_no_equations():
    """A section heading is one line of text-font glyphs (coloured or not), a contents line is words and a
    page number: neither is an equation; the display formula stays one."""
    toc_doc, toc, _ = contents_page()
    doc, page, boxes = theorem_page()
    info, toc_info = _info(page), _info(toc)
    assert R.is_prose(boxes["heading"], info)
    assert R.is_prose((88, 160, 542, 172), toc_info)  # "1 Topological spaces 10"
    assert R.is_prose((88, 174, 542, 186), toc_info)  # "1.1 Open sets . . . 12"
    assert not R.is_prose(boxes["equation"], info)
    one_word = [Block("equation", (88, 240, 542, 254), reading_order=0)]  # "2 Manifolds 20"
    assert R.is_prose(one_word[0].bbox, toc_info) and R.demote_prose_equations(one_word, toc_info)[0].kind == "text"


def test_contents_and_theorem_box_are_no_tables_but_a_grid_is():
    toc_doc, toc, toc_box = contents_page()
    doc, page, boxes = theorem_page()
    assert R.is_contents(toc_box, _info(toc)) and not R.holds_prose(toc_box, _info(toc))
    info = _info(page)
    assert R.cell_rows(boxes["theorem"], info) >= 3  # the matrices read as cells: not enough on their own
    assert R.holds_prose(boxes["theorem"], info)
    tables = [Block("table", toc_box, reading_order=0)]
    assert [b.kind for b in R.fix_visual_kinds(tables, _info(toc))] == ["text"]
    tables = [Block("table", boxes["theorem"], reading_order=0)]
    assert [b.kind for b in R.fix_visual_kinds(tables, info)] == ["text"]
    grid_doc, grid_page, grid = ruled_table_page()
    grid_info = _info(grid_page)
    assert not R.is_contents(grid, grid_info) and not R.holds_prose(grid, grid_info)
    assert [b.kind for b in R.fix_visual_kinds([Block("table", grid, reading_order=0)], grid_info)] == ["table"]


def test_detector_proposals_are_read_against_the_text_layer():
    """The fused parser's other voter (the DocLayNet detector) boxes the heading as a formula and the contents
    and the theorem as tables, confidently: after ``vet_proposals`` none of them is kept; its formula over
    the display equation and its table over a real grid are."""
    from parsing.core import fused_blocks
    from parsing.postprocess import vet_proposals

    toc_doc, toc, toc_box = contents_page()
    doc, page, boxes = theorem_page()
    props = [
        ("yolo", Block("equation", boxes["heading"], reading_order=0, score=0.95)),
        ("yolo", Block("table", boxes["theorem"], reading_order=0, score=0.95)),
        ("yolo", Block("equation", boxes["equation"], reading_order=0, score=0.95)),
    ]
    vetted = vet_proposals(page, props)
    assert [b.kind for _, b in vetted] == ["text", "text", "equation"]
    out = fused_blocks(page, [], props, ["yolo"])
    assert [(b.kind, b.bbox) for b in out if b.kind in ("equation", "table")] == [("equation", boxes["equation"])]
    out = fused_blocks(toc, [], [("yolo", Block("table", toc_box, reading_order=0, score=0.95))], ["yolo"])
    assert not [b for b in out if b.kind in ("equation", "table")]
    grid_doc, grid_page, grid = ruled_table_page()
    out = fused_blocks(grid_page, [], [("yolo", Block("table", grid, reading_order=0, score=0.95))], ["yolo"])
    assert [b.kind for b in out] == ["table"]
