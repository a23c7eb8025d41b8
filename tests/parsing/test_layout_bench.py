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
