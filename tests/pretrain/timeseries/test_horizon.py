"""The horizon predictor: worked examples and ≥ 99 % exact on a generated held-out set.

.venv/bin/python -m pytest tests/pretrain/timeseries/test_horizon.py -q
"""

from __future__ import annotations

import pytest

from pretrain.timeseries.horizon import generate_instructions, number_words, predict_horizon, words_to_number


@pytest.mark.parametrize(
    "text,kwargs,h",
    [
        ("forecast the next 96 steps", {}, 96),
        ("predict the next two seconds", {"sampling_rate_hz": 100}, 200),
        ("predict the next two seconds", {"sampling_period_s": 0.25}, 8),
        ("Forecast the next ninety-six points.", {}, 96),
        ("what about the coming 3 hours?", {"sampling_period_s": 900}, 12),
        ("the next 1,200 samples", {}, 1200),
        ("half a minute ahead", {"sampling_rate_hz": 2}, 60),
        ("forecast the next 3 years", {"freq_unit": "year"}, 3),
        ("Given 500 past values, forecast the next 24 steps", {}, 24),
        ("two hundred and five observations", {}, 205),
        ("a dozen steps ahead", {}, 12),
    ],
)
def test_worked_instructions(text, kwargs, h):
    assert predict_horizon(text, **kwargs) == h


def test_no_horizon_is_none():
    assert predict_horizon("forecast this series") is None
    assert predict_horizon("predict the next two seconds") is None  # a duration needs a sampling rate


def test_number_words_round_trip():
    for n in [1, 7, 13, 20, 42, 99, 100, 101, 250, 999, 1000, 1001, 4321, 20000]:
        assert words_to_number(number_words(n).replace("-", " ").split()) == n


def test_at_least_99_percent_exact_on_held_out_set():
    data = generate_instructions(3000, seed=2026)  # the parser was developed on other seeds
    kinds = {"steps": 0, "durations": 0}
    correct = 0
    for text, kwargs, h in data:
        kinds["durations" if kwargs else "steps"] += 1
        correct += predict_horizon(text, **kwargs) == h
    assert min(kinds.values()) > 1000
    assert correct / len(data) >= 0.99, correct / len(data)
