"""Tests for posttrain.objectives.credit (SPEC §C7, Eq 30).

Run: python -m pytest tests/posttrain/test_credit.py -q
"""

from __future__ import annotations

import pytest
import torch

from posttrain.objectives.credit import Step, annotate, segment_advantages

TOOLS = {"search", "run_tests"}


def test_annotator_rules() -> None:
    steps = [
        Step(tool="search", arguments='{"q": "x"}', call_failed=True),  # first failure: no penalty yet
        Step(well_formed=False),  # malformed → 0
        Step(tool="search", arguments='{"q": "x"}', call_failed=True),  # repeat of a failed call → −0.5
        Step(tool="run_tests"),  # fine → 1
    ]
    assert annotate(steps, TOOLS) == [1.0, 0.0, -0.5, 1.0]


def test_annotator_precedence_and_limits() -> None:
    steps = [
        Step(tool="rm_rf"),  # unknown tool → 0
        Step(tool="search", arguments="a", call_failed=True),
        Step(tool="search", arguments="b"),  # different arguments: not a repeat
        Step(well_formed=False, hit_limit=True),  # malformed wins over limit
        Step(tool="search", arguments="a", hit_limit=True),  # repeat wins over limit
        Step(hit_limit=True),  # context/turn limit → −0.5
    ]
    assert annotate(steps, TOOLS) == [0.0, 1.0, 1.0, 0.0, -0.5, -0.5]


def test_session_credit_worked_example() -> None:
    weights = torch.tensor([[1.0, 0.0, -0.5, 1.0], [1.0, 0.0, -0.5, 1.0]])
    # Tokens: system/user (−1), then segments 0..3 with tool output (−1) between some of them.
    seg = torch.tensor([[-1, -1, 0, 0, -1, 1, 2, 2, -1, 3]] * 2)
    a = torch.tensor([0.6, -0.6])
    out = segment_advantages(a, weights, seg)
    assert out[0].tolist() == pytest.approx([0, 0, 0.6, 0.6, 0, 0.0, -0.3, -0.3, 0, 0.6])
    assert out[1].tolist() == pytest.approx([0, 0, -0.6, -0.6, 0, -0.6, -0.6, -0.6, 0, -0.6])  # weights ignored


def test_annotator_feeds_credit() -> None:
    steps = [
        Step(tool="search", arguments="q", call_failed=True),
        Step(well_formed=False),
        Step(tool="search", arguments="q"),
        Step(),
    ]
    w = torch.tensor([annotate(steps, TOOLS)])
    out = segment_advantages(torch.tensor([0.6]), w, torch.tensor([[0, 1, 2, 3]]))
    assert out[0].tolist() == pytest.approx([0.6, 0.0, -0.3, 0.6])


def test_weights_out_of_range_rejected() -> None:
    with pytest.raises(ValueError):
        segment_advantages(torch.tensor([1.0]), torch.tensor([[1.5]]), torch.tensor([[0]]))
