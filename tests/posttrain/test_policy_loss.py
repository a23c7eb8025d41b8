"""Golden, autograd and property tests for posttrain.objectives.policy_loss (SPEC §C1–C3, Eq 10–13, 29).

Run: python -m pytest tests/posttrain/test_policy_loss.py -q
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.objectives.policy_loss import (
    BklConfig,
    ClipConfig,
    binary_kl,
    bkl_mask,
    bkl_mask_from_logprobs,
    clipped_weight,
    policy_loss,
)

F64 = torch.float64


def test_ratio_eight_contributes_exactly_bound() -> None:
    beh = torch.tensor([[math.log(0.1)]], dtype=F64)
    logp = torch.tensor([[math.log(0.8)]], dtype=F64, requires_grad=True)  # ρ = 8
    assert clipped_weight(logp, beh, ClipConfig(eps_low=0.2, eps_high=0.2)).item() == pytest.approx(1.2, abs=1e-12)
    adv = torch.tensor([0.5], dtype=F64)
    loss, stats = policy_loss(logp, beh, adv, torch.ones(1, 1, dtype=torch.bool))
    loss.backward()
    # d loss / d log π = −1.2 · A / N: a clipped token still contributes, with weight exactly 1.2.
    assert logp.grad.item() == pytest.approx(-1.2 * 0.5, abs=1e-12)
    assert loss.item() == pytest.approx(-1.2 * 0.5 * math.log(0.8), abs=1e-12)
    assert stats.clip_fraction.item() == 1.0


def test_hand_computed_loss_with_masks() -> None:
    # Two responses of lengths 3 and 2 (Σ|y| = 5); token (0, 1) masked by m; padding holds -inf.
    logp = torch.tensor([[-0.5, -1.0, -2.0], [-0.1, -0.3, float("-inf")]], dtype=F64, requires_grad=True)
    beh = torch.tensor([[-0.5, -0.2, -2.5], [-0.2, -0.3, 0.0]], dtype=F64)
    resp = torch.tensor([[True, True, True], [True, True, False]])
    keep = torch.tensor([[True, False, True], [True, True, True]])
    adv = torch.tensor([1.0, -2.0], dtype=F64)
    loss, stats = policy_loss(logp, beh, adv, resp, keep, ClipConfig(0.2, 0.2))
    # weights: ρ(0,0)=1; ρ(0,2)=e^0.5→1.2; ρ(1,0)=e^0.1=1.10517; ρ(1,1)=1
    w10 = math.exp(0.1)
    expected = -(1 * 1 * -0.5 + 1.2 * 1 * -2.0 + w10 * -2 * -0.1 + 1 * -2 * -0.3) / 5
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert stats.n_tokens.item() == 5
    assert stats.kept_fraction.item() == pytest.approx(4 / 5)
    loss.backward()
    grad = torch.tensor([[-1 / 5, 0.0, -1.2 / 5], [2 * w10 / 5, 2 / 5, 0.0]], dtype=F64)
    assert torch.allclose(logp.grad, grad)
    assert torch.isfinite(logp.grad).all()


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 4), st.integers(1, 9), st.integers(0, 2**31 - 1), st.floats(0.01, 0.5), st.floats(0.01, 3.0))
def test_gradient_flows_through_log_pi_only(b, t, seed, eps_low, eps_high) -> None:
    gen = torch.Generator().manual_seed(seed)
    logp = (-3 * torch.rand(b, t, generator=gen, dtype=F64)).requires_grad_(True)
    beh = (-3 * torch.rand(b, t, generator=gen, dtype=F64)).requires_grad_(True)
    adv = torch.randn(b, generator=gen, dtype=F64).requires_grad_(True)
    resp = torch.rand(b, t, generator=gen) < 0.8
    keep = torch.rand(b, t, generator=gen) < 0.8
    clip = ClipConfig(eps_low, eps_high)
    loss, _ = policy_loss(logp, beh, adv, resp, keep, clip)
    g_logp, g_beh, g_adv = torch.autograd.grad(loss, (logp, beh, adv), allow_unused=True, materialize_grads=True)
    # Closed form with the ratio treated as a constant: −m·clip(ρ)·A/N.
    rho = torch.exp(logp.detach() - beh.detach()).clamp(1 - eps_low, 1 + eps_high)
    m = (resp & keep).to(F64)
    expected = -m * rho * adv.detach().unsqueeze(-1) / max(int(resp.sum()), 1)
    assert torch.allclose(g_logp, expected, atol=1e-12)
    assert g_beh.abs().max().item() == 0.0
    assert g_adv.abs().max().item() == 0.0


def test_per_response_and_per_token_advantages_agree() -> None:
    gen = torch.Generator().manual_seed(3)
    logp, beh = -torch.rand(3, 5, generator=gen), -torch.rand(3, 5, generator=gen)
    resp = torch.rand(3, 5, generator=gen) < 0.7
    adv = torch.randn(3, generator=gen)
    a, _ = policy_loss(logp, beh, adv, resp)
    b, _ = policy_loss(logp, beh, adv.unsqueeze(-1).expand(3, 5), resp)
    c, _ = policy_loss(logp, beh, adv, resp, n_tokens=resp.sum())
    assert a.item() == pytest.approx(b.item()) == pytest.approx(c.item())


def test_bkl_worked_values() -> None:
    a, b = torch.tensor(0.90, dtype=F64), torch.tensor(0.80, dtype=F64)
    d_ab, d_ba = binary_kl(a, b).item(), binary_kl(b, a).item()
    assert d_ab == pytest.approx(0.9 * math.log(0.9 / 0.8) + 0.1 * math.log(0.1 / 0.2), abs=1e-12)
    assert d_ab == pytest.approx(0.0367, abs=5e-5)
    assert d_ba == pytest.approx(0.0444, abs=5e-5)
    o_ab = binary_kl(torch.tensor(0.05, dtype=F64), torch.tensor(0.60, dtype=F64)).item()
    o_ba = binary_kl(torch.tensor(0.60, dtype=F64), torch.tensor(0.05, dtype=F64)).item()
    # "both 19–31× larger": 0.6975/0.0367 ≈ 19.0 and 1.1449/0.0367 ≈ 31.2.
    assert o_ab / d_ab == pytest.approx(19.0, abs=0.05)
    assert o_ba / d_ab == pytest.approx(31.2, abs=0.05)
    keep = bkl_mask(torch.tensor([0.90, 0.05]), torch.tensor([0.80, 0.60]), BklConfig())
    assert keep.tolist() == [True, False]
    lp = bkl_mask_from_logprobs(torch.log(torch.tensor([0.90, 0.05])), torch.log(torch.tensor([0.80, 0.60])))
    assert lp.tolist() == [True, False]


def test_bkl_mask_requires_both_directions() -> None:
    # Pick φ between the two directions of one pair: one-sided passing is not enough.
    a, b = torch.tensor([0.9]), torch.tensor([0.8])
    assert not bkl_mask(a, b, BklConfig(phi=0.04)).item()
    assert bkl_mask(a, b, BklConfig(phi=0.045)).item()
    assert torch.isfinite(binary_kl(torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5]))).all()
