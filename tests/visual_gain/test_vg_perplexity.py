"""SPEC §A2 worked numbers and the aggregation rules of the pure visual-gain math."""

from __future__ import annotations

import math

import pytest

from visual_gain.perplexity import VisualGain, delta_h_nats, nats_to_bits, page_bits, ppl_from_nll


def test_worked_example_informative_page() -> None:
    g = VisualGain.from_ppl(12.4, 9.1, n_text_tokens=700, n_images=2)
    assert g.delta_h_nats == pytest.approx(0.3094, abs=5e-5)
    assert g.delta_h_bits == pytest.approx(0.4464, abs=5e-5)
    assert round(g.page_bits) == 312


def test_worked_example_decorative_page() -> None:
    dh = delta_h_nats(11.0, 10.9)
    assert dh == pytest.approx(0.0091, abs=5e-5)
    # SPEC writes 0.0131; the exact value is 0.013175 (SPEC truncates), so compare to 1e-4
    assert nats_to_bits(dh) == pytest.approx(0.0131, abs=1e-4)
    assert page_bits(nats_to_bits(dh), 700) == pytest.approx(9, abs=0.5)


def test_from_nlls_is_exp_of_mean_nll() -> None:
    text = [math.log(12.4)] * 3 + [math.log(12.4) + 0.5, math.log(12.4) - 0.5]
    inter = [math.log(9.1)] * 5
    g = VisualGain.from_nlls(text, inter, n_images=1)
    assert g.ppl_text == pytest.approx(12.4)
    assert g.ppl_inter == pytest.approx(9.1)
    assert g.delta_h_nats == pytest.approx(math.log(12.4 / 9.1))
    assert g.n_text_tokens == 5


def test_windows_aggregate_over_tokens_not_windows() -> None:
    # window A: 10 tokens at NLL 1.0; window B: 2 tokens at NLL 4.0 → mean is 1.5, not (1 + 4) / 2
    g = VisualGain.from_sums(10 * 1.0 + 2 * 4.0, 12 * 1.0, n_text_tokens=12, n_images=1)
    assert g.ppl_text == pytest.approx(math.exp(1.5))
    assert g.delta_h_nats == pytest.approx(0.5)


def test_pass_length_mismatch_and_empty_raise() -> None:
    with pytest.raises(ValueError, match="different token counts"):
        VisualGain.from_nlls([1.0, 2.0], [1.0], n_images=1)
    with pytest.raises(ValueError):
        ppl_from_nll(0.0, 0)


def test_negative_gain_when_visuals_hurt() -> None:
    g = VisualGain.from_ppl(9.0, 10.0, n_text_tokens=10, n_images=1)
    assert g.delta_h_nats < 0 and g.page_bits < 0
