from __future__ import annotations

import pytest

from parsing.backends import page_range_string
from parsing.geometry import (
    any_contained,
    any_containing,
    clamp,
    containment,
    from_normalized,
    from_pixels,
    iou,
    link_captions,
    pad,
    reading_order,
    union,
)


def test_normalized_and_pixel_boxes_map_to_points():
    assert from_normalized((0.1, 0.2, 0.5, 1.0), 600, 800) == pytest.approx((60, 160, 300, 800))
    # 200 DPI render: 200/72 px per point
    assert from_pixels((200, 400, 600, 800), 200 / 72) == pytest.approx((72, 144, 216, 288))


def test_clamp_orders_and_clips():
    assert clamp((700, -5, 100, 50), 612, 792) == (100, 0, 612, 50)
    assert pad((10, 10, 20, 20), 15, 612, 792) == (0, 0, 35, 35)


def test_overlap_measures():
    a, b = (0, 0, 10, 10), (5, 0, 15, 10)
    assert iou(a, b) == pytest.approx(50 / 150)
    assert containment((2, 2, 4, 4), a) == 1.0
    assert containment(b, a) == pytest.approx(0.5)
    assert union([a, b]) == (0, 0, 15, 10)


def test_caption_links_to_nearest_visual_above_or_below():
    kinds = ["figure", "caption", "text", "caption", "table"]
    boxes = [
        (100, 100, 500, 300),
        (100, 305, 500, 320),
        (72, 330, 540, 400),
        (100, 410, 500, 425),
        (100, 430, 500, 600),
    ]
    assert link_captions(kinds, boxes, 792) == [None, 0, None, 4, None]


def test_caption_without_horizontal_overlap_stays_unlinked():
    kinds = ["figure", "caption"]
    boxes = [(50, 100, 250, 300), (320, 305, 560, 320)]
    assert link_captions(kinds, boxes, 792) == [None, None]


def test_reading_order_two_columns_with_full_width_title():
    boxes = [
        (320, 120, 560, 300),  # right column, top
        (50, 60, 560, 90),  # full-width title
        (50, 320, 290, 500),  # left column, bottom
        (50, 120, 290, 300),  # left column, top
    ]
    assert reading_order(boxes, 612) == [1, 3, 2, 0]


def test_page_range_string_compresses_runs():
    assert page_range_string([0, 1, 2, 5, 7, 8]) == "1-3,6,8-9"
    assert page_range_string([4]) == "5"


def test_tighten_shrinks_to_content_ignoring_excluded_text():
    from parsing.geometry import tighten

    box = (50, 50, 550, 450)
    elements = [(100, 120, 300, 300), (310, 130, 500, 310), (60, 52, 200, 62)]  # two panels, one text line
    assert tighten(box, elements) == (60, 52, 500, 310)
    assert tighten(box, elements, exclude=[(40, 40, 560, 64)]) == (100, 120, 500, 310)
    assert tighten(box, [(60, 60, 61, 61)]) == box  # next to nothing drawn: keep the detector's box


def test_clusters_separate_by_empty_space():
    from parsing.geometry import clusters

    box = (0, 0, 600, 400)
    els = [(10, 10, 100, 100), (105, 10, 200, 100), (400, 10, 590, 390), (95, 95, 110, 120)]
    groups = clusters(box, els, gap=20)
    assert sorted(sorted(g) for g in groups) == [[0, 1, 3], [2]]


def test_group_adjacent_respects_text_between():
    from parsing.geometry import group_adjacent

    panels = [(50, 100, 250, 300), (260, 100, 460, 300), (50, 320, 250, 500)]
    assert group_adjacent(panels, 20, blockers=[]) == [[0, 1, 2]]
    # a paragraph between the top row and the third box keeps it apart
    assert group_adjacent(panels, 20, blockers=[(50, 302, 460, 318)]) == [[0, 1], [2]]


def test_mineru_middle_json_mapping():
    """A hand-written MinerU middle-JSON page (schema docvortex.middle 2.0, bboxes 0-1) maps to our kinds."""
    from parsing.backends import mineru_page_blocks

    text = lambda t: [{"type": "text", "content": t}]  # noqa: E731
    page = {
        "page_idx": 0,
        "blocks": [
            {"type": "doc_title", "index": 0, "bbox": [0.1, 0.05, 0.9, 0.1], "content": text("Title"), "level": 1},
            {
                "type": "text",
                "index": 1,
                "bbox": [0.1, 0.1, 0.9, 0.2],
                "content": [
                    {"type": "text", "content": "Energy "},
                    {"type": "equation_inline", "content": "E=mc^2"},
                    {"type": "hyperlink", "url": "https://x.org", "content": text(" link")},
                ],
            },
            {
                "type": "image",
                "index": 2,
                "bbox": [0.2, 0.3, 0.8, 0.6],
                "content": [
                    {"type": "image_body", "index": 2, "bbox": [0.2, 0.3, 0.8, 0.6], "content": ""},
                    {
                        "type": "image_caption",
                        "index": 3,
                        "bbox": [0.2, 0.61, 0.8, 0.65],
                        "content": text("Figure 1: x"),
                    },
                ],
            },
            {
                "type": "table",
                "index": 4,
                "bbox": [0.2, 0.7, 0.8, 0.8],
                "content": [
                    {
                        "type": "table_caption",
                        "index": 4,
                        "bbox": [0.2, 0.66, 0.8, 0.69],
                        "content": text("Table 1: y"),
                    },
                    {
                        "type": "table_body",
                        "index": 5,
                        "bbox": [0.2, 0.7, 0.8, 0.8],
                        "content": "<table><tr><td>1</td></tr></table>",
                    },
                ],
            },
            {"type": "equation", "index": 6, "bbox": [0.3, 0.82, 0.7, 0.86], "content": "a^2+b^2=c^2"},
            {
                "type": "list",
                "index": 7,
                "bbox": [0.1, 0.87, 0.9, 0.93],
                "content": [{"type": "text", "content": text("first")}, {"type": "text", "content": text("second")}],
            },
            {"type": "page_number", "index": 8, "bbox": [0.48, 0.95, 0.52, 0.97], "content": text("3")},
        ],
    }
    blocks = mineru_page_blocks(page, 600.0, 800.0)
    kinds = [b.kind for b in blocks]
    assert kinds == ["title", "text", "figure", "caption", "caption", "table", "equation", "list", "page_number"]
    assert blocks[1].text == "Energy $E=mc^2$ link"
    assert blocks[2].bbox == pytest.approx((120, 240, 480, 480))
    assert blocks[3].caption_of == 2 and blocks[4].caption_of == 5
    assert blocks[5].html.startswith("<table>")
    assert blocks[6].latex == "a^2+b^2=c^2"
    assert blocks[7].text == "first\nsecond"


def _random_boxes(rng, n):
    """Boxes on a 0..100 grid (exact halves, so touching and identical edges occur), some degenerate."""
    out = []
    for _ in range(n):
        x0, y0 = rng.integers(0, 200, 2) / 2
        w, h = rng.integers(-2, 60, 2) / 2  # a few empty or inverted boxes
        out.append((float(x0), float(y0), float(x0 + w), float(y0 + h)))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vectorised_containment_equals_the_scalar_loops(seed):
    import numpy as np

    rng = np.random.default_rng(seed)
    inner, outer = _random_boxes(rng, 300), _random_boxes(rng, 40)
    for thr in (0.0, 0.5, 0.8, 0.9):
        assert any_contained(inner, outer, thr) == [any(containment(i, o) > thr for o in outer) for i in inner]
        assert any_contained(inner, outer, thr, strict=False) == [
            any(containment(i, o) >= thr for o in outer) for i in inner
        ]
        assert any_containing(inner, outer, thr) == [any(containment(i, o) > thr for i in inner) for o in outer]
    assert any_contained([], outer, 0.5) == [] and any_contained(inner[:3], [], 0.5) == [False] * 3
    assert any_containing(inner[:3], [], 0.5) == [] and any_containing([], outer[:2], 0.5) == [False] * 2


def test_cluster_dilation_equals_a_summed_area_reference():
    """``clusters`` dilates occupancy with a max filter; the result equals the (2k+1)² box-sum formulation."""
    import numpy as np
    from scipy import ndimage

    rng = np.random.default_rng(3)
    for shape, k in [((80, 60), 3), ((7, 5), 4), ((1, 1), 2), ((120, 90), 1)]:
        occ = rng.random(shape) < 0.03
        s = np.pad(occ.astype(np.int32), ((k + 1, k), (k + 1, k))).cumsum(0).cumsum(1)
        ref = (s[2 * k + 1 :, 2 * k + 1 :] - s[: -2 * k - 1, 2 * k + 1 :] - s[2 * k + 1 :, : -2 * k - 1]
               + s[: -2 * k - 1, : -2 * k - 1]) > 0  # fmt: skip
        got = ndimage.maximum_filter(occ, size=2 * k + 1, mode="constant", cval=False)
        assert (got == ref).all()
