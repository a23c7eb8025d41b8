"""``benchmarks/layout.py`` scores with the development set's rule: IoU >= 0.5, greedy best-IoU-first, per kind."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import layout as bench  # noqa: E402

DEVSET_SCORE = ROOT.parent / "shared" / "devset" / "score.py"


def test_counts_on_a_hand_made_page():
    refs = [
        {
            "pdf": "a.pdf",
            "pages": {
                "0": [
                    {"kind": "figure", "bbox": [0, 0, 100, 100]},
                    {"kind": "figure", "bbox": [200, 0, 300, 100]},
                    {"kind": "table", "bbox": [0, 200, 100, 300]},
                ]
            },
        }
    ]
    preds = {
        "a.pdf": {
            "0": [
                ("figure", [0, 0, 100, 80]),  # IoU 0.8: a match
                ("figure", [200, 0, 240, 100]),  # IoU 0.4: no match
                ("table", [0, 200, 100, 300]),
                ("equation", [0, 400, 50, 420]),  # no reference: a false positive
            ]
        }
    }
    s = bench.score(refs, preds)
    assert s["figure"] == (1, 2, 2) and s["table"] == (1, 1, 1) and s["equation"] == (0, 0, 1)
    assert s["micro"] == (2, 3, 4)
    p, r, f1 = bench.prf(*s["micro"])
    assert (p, r) == (0.5, 2 / 3) and f1 == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))


@pytest.mark.skipif(not DEVSET_SCORE.is_file(), reason="the development set is not part of the repository")
def test_same_matching_as_the_devset_score_py():
    spec = importlib.util.spec_from_file_location("devset_score", DEVSET_SCORE)
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    rng = random.Random(0)

    def box():
        x, y = rng.uniform(0, 500), rng.uniform(0, 700)
        return [x, y, x + rng.uniform(5, 120), y + rng.uniform(5, 120)]

    for _ in range(300):
        truth = [box() for _ in range(rng.randint(0, 6))]
        pred = [box() for _ in range(rng.randint(0, 6))] + [[v + rng.uniform(-8, 8) for v in t] for t in truth]
        assert bench.matches(truth, pred) == ref.matches(truth, pred)
        if truth and pred:
            assert bench.iou(truth[0], pred[-1]) == ref.iou(truth[0], pred[-1])


def test_self_labelled_truth_scores_and_fits_only_what_it_labels(tmp_path):
    """``--labelled``: the self-labeller writes the truth, the scorer reads it. Only display equations of pages
    with a text layer are judged (the labeller marks some figures and no table, and nothing on a scan), so a
    figure box or a box on an image-only page is neither a hit nor a false positive, and ``--fit`` fits equations
    alone."""
    import pymupdf

    from tests.parsing.fixtures import _plot_png
    from tests.parsing.test_selflabel import labelled_page

    doc, _ = labelled_page()
    scan = doc.new_page(width=612, height=792)
    scan.insert_image(pymupdf.Rect(0, 0, 612, 792), stream=_plot_png(300, 400), keep_proportion=False)
    (tmp_path / "a.pdf").write_bytes(doc.tobytes())
    refs = bench.load_refs(bench.write_labelled(tmp_path))
    assert [(r["pdf"], r["kinds"], r["scored"]) for r in refs] == [("a.pdf", ["equation"], ["0"])]
    eqs = [b["bbox"] for b in refs[0]["pages"]["0"]]
    assert len(eqs) == 2 and all(b["kind"] == "equation" for b in refs[0]["pages"]["0"])
    preds = {
        "a.pdf": {
            "0": [("equation", eqs[0], 1.0), ("figure", [150, 400, 450, 580], 1.0)],
            "1": [("equation", [100, 100, 300, 130], 0.9)],  # on the scan: not judged
        }
    }
    s = bench.score(refs, bench.restrict(refs, preds))
    assert s["equation"] == (1, 2, 1) and s["figure"] == (0, 0, 0) and s["micro"] == (1, 2, 1)
    dumps = {"rules": preds, "yolo": {"a.pdf": {"0": [("equation", eqs[1], 0.6)]}}}
    params = bench.fit(refs, dumps, ("rules", "yolo"))
    assert list(params.kinds) == ["equation"]
    fused = bench.fuse_preds(dumps, ("rules", "yolo"), params, ["a.pdf"])
    assert bench.score(refs, bench.restrict(refs, fused))["equation"] == (2, 2, 2)
