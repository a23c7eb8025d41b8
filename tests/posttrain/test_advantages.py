"""Golden and property tests for posttrain.objectives.advantages (SPEC §C5).

Run: python -m pytest tests/posttrain/test_advantages.py -q
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.objectives.advantages import (
    GepoConfig,
    LengthConfig,
    ShapingConfig,
    broadcast_to_tokens,
    degenerate_groups,
    gepo,
    group_entropy,
    length_regularise,
    length_weights,
    loo_advantages,
    shape,
)

F64 = torch.float64


def test_loo_worked_g8() -> None:
    r = torch.tensor([[1, 1, 1, 0, 1, 0, 1, 1]], dtype=F64)
    a = loo_advantages(r)[0]
    # Closed form: correct 1 − 5/7, wrong 0 − 6/7 (six correct out of eight).
    assert torch.allclose(a[r[0] == 1], torch.tensor(1 - 5 / 7, dtype=F64))
    assert torch.allclose(a[r[0] == 0], torch.tensor(-6 / 7, dtype=F64))
    assert a[0].item() == pytest.approx(0.285714, abs=1e-6)
    assert a[3].item() == pytest.approx(-0.857143, abs=1e-6)
    assert a.sum().item() == pytest.approx(0.0, abs=1e-12)


def test_loo_worked_g6() -> None:
    a = loo_advantages(torch.tensor([[1, 0, 0, 1, 0, 0]], dtype=F64))[0]
    assert a.tolist() == pytest.approx([0.8, -0.4, -0.4, 0.8, -0.4, -0.4], abs=1e-12)


def test_loo_ragged_batch_matches_separate_groups() -> None:
    g8 = torch.tensor([1, 1, 1, 0, 1, 0, 1, 1], dtype=F64)
    g6 = torch.tensor([1, 0, 0, 1, 0, 0], dtype=F64)
    rewards = torch.stack([g8, torch.cat([g6, torch.tensor([7.0, -3.0], dtype=F64)])])  # padding holds junk
    mask = torch.stack([torch.ones(8, dtype=torch.bool), torch.arange(8) < 6])
    a = loo_advantages(rewards, mask)
    assert torch.allclose(a[0], loo_advantages(g8[None])[0])
    assert torch.allclose(a[1, :6], loo_advantages(g6[None])[0])
    assert a[1, 6:].eq(0).all()


def test_loo_rejects_singleton_group() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        loo_advantages(torch.tensor([[1.0, 0.0]]), torch.tensor([[True, False]]))


@st.composite
def groups(draw):  # noqa: ANN201 - hypothesis strategy
    b = draw(st.integers(1, 5))
    g = draw(st.integers(2, 10))
    rewards = draw(st.lists(st.floats(-5, 5, allow_nan=False), min_size=b * g, max_size=b * g))
    counts = draw(st.lists(st.integers(2, g), min_size=b, max_size=b))
    r = torch.tensor(rewards, dtype=F64).view(b, g)
    mask = torch.arange(g).unsqueeze(0) < torch.tensor(counts).unsqueeze(1)
    return r, mask


@settings(max_examples=60, deadline=None)
@given(groups())
def test_loo_sums_to_zero_and_matches_reference(data) -> None:
    r, mask = data
    a = loo_advantages(r, mask)
    assert torch.allclose(a.sum(dim=-1), torch.zeros(r.shape[0], dtype=F64), atol=1e-9)
    for bi in range(r.shape[0]):  # straightforward per-group reference
        vals = r[bi][mask[bi]].tolist()
        g = len(vals)
        ref = [x - (sum(vals) - x) / (g - 1) for x in vals]
        assert a[bi][mask[bi]].tolist() == pytest.approx(ref, abs=1e-9)
        assert a[bi][~mask[bi]].eq(0).all()


def test_degenerate_groups_flags_identical_rewards_only() -> None:
    r = torch.tensor([[1.0, 1, 1, 9], [0, 0, 0, 0], [1, 0, 1, 1]])
    mask = torch.tensor([[True, True, True, False], [True] * 4, [True] * 4])
    assert degenerate_groups(r, mask).tolist() == [True, True, False]


def test_group_entropy_worked() -> None:
    token_mask = torch.zeros(2, 3, 7, dtype=torch.bool)
    token_mask[..., :5] = True
    lp = torch.empty(2, 3, 7, dtype=F64)
    lp[0], lp[1] = -0.05, -1.20
    lp[..., 5:] = float("-inf")  # padding must not leak in
    h = group_entropy(lp, token_mask)
    assert h.tolist() == pytest.approx([0.25, 6.0], abs=1e-12)
    assert (h[1] / h[0]).item() == pytest.approx(24.0)


def test_group_entropy_averages_over_real_responses() -> None:
    lp = torch.tensor([[[-1.0, -1.0], [-3.0, 0.0], [-100.0, -100.0]]])
    tm = torch.ones_like(lp, dtype=torch.bool)
    gm = torch.tensor([[True, True, False]])
    assert group_entropy(lp, tm, gm).item() == pytest.approx((2.0 + 3.0) / 2)


def test_gepo_gates_by_entropy() -> None:
    cfg = GepoConfig(h_low=1.0, h_high=5.0, c_low=0.5, c_high=0.25)
    adv = torch.tensor([[0.8, -0.4], [0.8, -0.4], [0.8, -0.4]])
    ent = torch.tensor([0.25, 3.0, 6.0])  # low (worked 0.25), middle, high (worked 6.0)
    out = gepo(adv, ent, cfg)
    assert torch.allclose(out, torch.tensor([[0.4, -0.4], [0.8, -0.4], [0.8, -0.1]]))
    with pytest.raises(ValueError):
        GepoConfig(h_low=2.0, h_high=1.0, c_low=1.0, c_high=1.0)


LENGTHS = (900.0, 1200.0, 1500.0, 2400.0, 3000.0, 5000.0)


def test_length_weights_and_normaliser_worked() -> None:
    adv = torch.full((1, 6), 0.285714, dtype=F64)
    lengths = torch.tensor([LENGTHS], dtype=F64)
    w = length_weights(lengths, adv > 0)[0]
    # Closed form: r_i = (L_i − 900)/4100, w = 0.2 + 0.8(1 − r).
    expected = [0.2 + 0.8 * (1 - (x - 900) / 4100) for x in LENGTHS]
    assert w.tolist() == pytest.approx(expected, abs=1e-12)
    assert w.tolist() == pytest.approx([1, 0.94146, 0.88293, 0.70732, 0.59024, 0.2], abs=5e-6)
    norm = (length_regularise(adv, lengths)[0] / (w * adv[0]))[0].item()  # Eq 17's factor, the same for every i
    assert norm == pytest.approx(6 / sum(expected), abs=1e-12)
    # Exact value 1.3882619 (= 6/4.3219512); SPEC prints 1.388263, a rounding slip of ~1e-6.
    assert norm == pytest.approx(1.388263, abs=2e-6)


def test_length_regularisation_in_the_worked_g8_group() -> None:
    r = torch.tensor([[1, 1, 1, 0, 1, 0, 1, 1]], dtype=F64)
    lengths = torch.tensor([[900, 1200, 1500, 700, 2400, 8000, 3000, 5000]], dtype=F64)
    loo = loo_advantages(r)
    out = length_regularise(loo, lengths)
    pos = r[0] == 1
    assert out[0, ~pos].tolist() == loo[0, ~pos].tolist()  # negatives untouched
    assert out[0, pos].sum().item() == pytest.approx(loo[0, pos].sum().item(), abs=1e-12)
    w = torch.tensor([1, 0.94146, 0.88293, 0.70732, 0.59024, 0.2], dtype=F64)
    assert out[0, pos].tolist() == pytest.approx((1.388263 * w * (1 - 5 / 7)).tolist(), abs=5e-6)


def test_length_regularisation_inactive_below_tau() -> None:
    loo = loo_advantages(torch.tensor([[1, 0, 0, 1, 0, 0]], dtype=F64))  # 2 of 6 positive < 0.5·6
    lengths = torch.tensor([[100, 200, 300, 900, 500, 600]], dtype=F64)
    assert torch.equal(length_regularise(loo, lengths), loo)


@settings(max_examples=60, deadline=None)
@given(groups(), st.integers(0, 2**31 - 1), st.floats(0.01, 1.0), st.floats(0.5, 3.0))
def test_length_regularisation_preserves_positive_mass(data, seed, alpha, gamma) -> None:
    r, mask = data
    lengths = torch.randint(1, 4000, r.shape, generator=torch.Generator().manual_seed(seed)).to(F64)
    adv = loo_advantages(r, mask)
    out = length_regularise(adv, lengths, mask, LengthConfig(alpha=alpha, gamma=gamma))
    pos = mask & (adv > 0)
    mass_in = torch.where(pos, adv, 0).sum(-1)
    mass_out = torch.where(pos, out, 0).sum(-1)
    assert torch.allclose(mass_in, mass_out, rtol=1e-9, atol=1e-9)
    assert torch.equal(torch.where(pos, 0, out), torch.where(pos, 0, adv))  # others unchanged
    assert (out[pos] > 0).all()  # no sign flips (α > 0 keeps every weight positive)


def test_shape_composes_in_eq28_order() -> None:
    gen = torch.Generator().manual_seed(0)
    rewards = torch.tensor([[1, 1, 1, 0, 1, 0, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 0, 1, 1]], dtype=F64)
    t = 12
    lengths = torch.randint(2, t + 1, (3, 8), generator=gen)
    token_mask = torch.arange(t) < lengths.unsqueeze(-1)
    logprobs = -torch.rand(3, 8, t, generator=gen, dtype=F64)
    logprobs[0] *= 0.01  # a confident group: GEPO's low gate fires
    cfg = ShapingConfig(gepo=GepoConfig(h_low=0.5, h_high=100.0, c_low=0.5, c_high=2.0))
    out = shape(rewards, logprobs, token_mask, config=cfg)
    manual = length_regularise(
        gepo(loo_advantages(rewards), group_entropy(logprobs, token_mask), cfg.gepo), lengths.to(F64)
    )
    assert torch.allclose(out.advantages, manual)
    assert out.resample.tolist() == [False, True, False]
    assert out.entropy[0] < 0.5 < out.entropy[2]
    assert out.advantages[1].eq(0).all()


def test_broadcast_to_tokens() -> None:
    adv = torch.tensor([[0.5, -1.0]])
    tm = torch.tensor([[[True, True, False], [True, False, False]]])
    assert broadcast_to_tokens(adv, tm).tolist() == [[[0.5, 0.5, 0.0], [-1.0, 0.0, 0.0]]]
