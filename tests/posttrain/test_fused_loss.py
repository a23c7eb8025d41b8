"""The fused closed-form loss + gradient (padded and packed) equals the autograd path.

Run: python -m pytest tests/posttrain/test_fused_loss.py -q
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.objectives.advantages import GepoConfig, ShapingConfig, segment_sums, shape, shape_packed
from posttrain.objectives.policy_loss import (
    ClipConfig,
    PolicyLossFn,
    fused_policy_loss,
    packed_policy_loss_and_grad,
    policy_loss,
    policy_loss_and_grad,
)

RTOL = 1e-6


def _case(seed: int, b: int, g: int, t: int, dtype=torch.float32, with_keep: bool = True):  # noqa: ANN001, ANN202
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, t + 1, (b, g), generator=gen)
    resp = torch.arange(t) < lengths.unsqueeze(-1)
    beh = -2.0 * torch.rand(b, g, t, generator=gen, dtype=dtype)
    logp = beh + 0.5 * torch.randn(b, g, t, generator=gen, dtype=dtype)
    logp = torch.where(resp, logp, torch.full_like(logp, float("-inf")))  # padding must not leak
    keep = (torch.rand(b, g, t, generator=gen) < 0.85) if with_keep else None
    adv = torch.randn(b, g, generator=gen, dtype=dtype)
    return logp, beh, adv, resp, keep, lengths


def _autograd(logp, beh, adv, resp, keep, clip, n_tokens=None):  # noqa: ANN001, ANN202
    x = logp.clone().requires_grad_(True)
    loss, stats = policy_loss(x, beh, adv, resp, keep, clip, n_tokens=n_tokens)
    loss.backward()
    return loss.detach(), torch.nan_to_num(x.grad, nan=0.0), stats


def _loss_close(loss: torch.Tensor, ref: torch.Tensor, grad: torch.Tensor, logp: torch.Tensor) -> None:
    """|Δloss| ≤ 1e-6·|loss|; in fp32 the scale is Σ|terms| instead, since the two paths sum the
    same mixed-sign terms in a different order (the loss itself can be a small difference)."""
    scale = abs(ref.item())
    if loss.dtype == torch.float32:
        terms = (grad.double() * torch.where(grad != 0, logp.double(), 0.0)).abs().sum().item()
        scale = max(scale, terms)
    assert abs(loss.item() - ref.item()) <= RTOL * scale + 1e-15


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape
    if b.numel() == 0:
        return
    scale = max(b.abs().max().item(), 1e-30)
    assert (a.double() - b.double()).abs().max().item() <= RTOL * scale


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 2**31 - 1),
    st.integers(1, 4),
    st.integers(2, 6),
    st.integers(1, 40),
    st.floats(0.01, 0.6),
    st.floats(0.01, 3.0),
    st.booleans(),
    st.sampled_from([torch.float32, torch.float64]),
)
def test_fused_padded_equals_autograd(seed, b, g, t, eps_low, eps_high, with_keep, dtype) -> None:
    logp, beh, adv, resp, keep, _ = _case(seed, b, g, t, dtype, with_keep)
    clip = ClipConfig(eps_low, eps_high)
    ref_loss, ref_grad, ref_stats = _autograd(logp, beh, adv, resp, keep, clip)
    loss, grad, stats = policy_loss_and_grad(logp, beh, adv, resp, keep, clip)
    _loss_close(loss, ref_loss, grad, logp)
    _close(grad, ref_grad)
    assert stats.clip_fraction.item() == pytest.approx(ref_stats.clip_fraction.item(), abs=1e-12)
    assert stats.kept_fraction.item() == pytest.approx(ref_stats.kept_fraction.item(), abs=1e-12)
    assert int(stats.n_tokens) == int(ref_stats.n_tokens)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 2**31 - 1),
    st.integers(1, 4),
    st.integers(2, 6),
    st.integers(1, 40),
    st.floats(0.01, 0.6),
    st.floats(0.01, 3.0),
    st.booleans(),
    st.sampled_from([torch.float32, torch.float64]),
    st.sampled_from(["torch", "auto"]),  # "auto" runs the C kernel on float32 (tests/posttrain/test_native.py)
)
def test_fused_packed_equals_autograd(seed, b, g, t, eps_low, eps_high, with_keep, dtype, backend) -> None:
    logp, beh, adv, resp, keep, lengths = _case(seed, b, g, t, dtype, with_keep)
    clip = ClipConfig(eps_low, eps_high)
    n = 1000  # a global normaliser, as when a big batch is evaluated in chunks
    ref_loss, ref_grad, ref_stats = _autograd(logp, beh, adv, resp, keep, clip, n_tokens=n)
    pk = None if keep is None else keep[resp]
    loss, grad, stats = packed_policy_loss_and_grad(
        logp[resp], beh[resp], adv, lengths, pk, clip, n_tokens=n, backend=backend
    )
    _loss_close(loss, ref_loss, grad, logp[resp])
    _close(grad, ref_grad[resp])
    assert stats.clip_fraction.item() == pytest.approx(ref_stats.clip_fraction.item(), abs=1e-12)
    assert stats.kept_fraction.item() == pytest.approx(ref_stats.kept_fraction.item(), abs=1e-12)
    # Per-token advantages give the same result.
    loss2, grad2, _ = packed_policy_loss_and_grad(
        logp[resp], beh[resp], adv.unsqueeze(-1).expand_as(logp)[resp], lengths, pk, clip, n_tokens=n
    )
    _loss_close(loss2, loss, grad, logp[resp])
    _close(grad2, grad)


@pytest.mark.parametrize("packed", [False, True])
def test_policy_loss_fn_backpropagates_through_a_model(packed: bool) -> None:
    """loss.backward() through PolicyLossFn reaches model parameters exactly as autograd does."""
    logp0, beh, adv, resp, keep, lengths = _case(7, 3, 4, 16, torch.float64)
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16, dtype=torch.float64)
    feats = torch.randn(3, 4, 16, dtype=torch.float64)
    clip = ClipConfig(0.2, 0.28)

    def logprobs() -> torch.Tensor:
        return torch.nn.functional.logsigmoid(model(feats))  # a differentiable stand-in for log π

    model.zero_grad()
    ref, ref_stats = policy_loss(logprobs(), beh, adv, resp, keep, clip)
    (2.5 * ref).backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    lp = logprobs()
    if packed:
        loss, stats = fused_policy_loss(lp[resp], beh[resp], adv, lengths, keep[resp], clip, packed=True)
    else:
        loss, stats = fused_policy_loss(lp, beh, adv, resp, keep, clip)
    assert isinstance(loss.grad_fn, PolicyLossFn._backward_cls)
    (2.5 * loss).backward()  # a non-unit upstream gradient is honoured
    assert loss.item() == pytest.approx(ref.item(), rel=RTOL)
    assert stats.clip_fraction.item() == pytest.approx(ref_stats.clip_fraction.item())
    for p, r in zip(model.parameters(), ref_grads):
        _close(p.grad, r)
    # Without grad the wrapper just evaluates.
    with torch.no_grad():
        l2, _ = fused_policy_loss(lp.detach(), beh, adv, resp, keep, clip)
    assert l2.item() == pytest.approx(ref.item(), rel=RTOL)


def test_fused_clipped_token_contributes_bound_and_grad_out_is_used() -> None:
    logp = torch.log(torch.tensor([[0.8, 0.5]], dtype=torch.float64))
    beh = torch.log(torch.tensor([[0.1, 0.5]], dtype=torch.float64))  # ρ = 8 (clips to 1.2), 1
    out = torch.empty_like(logp)
    loss, grad, stats = policy_loss_and_grad(
        logp, beh, torch.tensor([0.5], dtype=torch.float64), torch.ones(1, 2, dtype=torch.bool), grad_out=out
    )
    assert grad.data_ptr() == out.data_ptr()
    assert grad[0].tolist() == pytest.approx([-1.2 * 0.5 / 2, -1.0 * 0.5 / 2], abs=1e-12)
    assert stats.clip_fraction.item() == 0.5


def test_packed_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError):
        packed_policy_loss_and_grad(torch.zeros(5), torch.zeros(5), torch.zeros(2), torch.tensor([2, 2]))
    with pytest.raises(ValueError):
        packed_policy_loss_and_grad(torch.zeros(5), torch.zeros(5), torch.zeros(5), torch.tensor([2, 2]))


def test_segment_sums_and_shape_packed_match_padded() -> None:
    logp, beh, adv, resp, _, lengths = _case(11, 5, 8, 30, torch.float64, False)
    assert torch.allclose(segment_sums(beh[resp], lengths), torch.where(resp, beh, 0.0).sum(-1))
    gen = torch.Generator().manual_seed(1)
    rewards = (torch.rand(5, 8, generator=gen) < 0.5).to(torch.float64)
    gm = torch.ones(5, 8, dtype=torch.bool)
    gm[0, 6:] = False
    lengths = torch.where(gm, lengths, 0)
    resp = resp & gm.unsqueeze(-1)
    cfg = ShapingConfig(gepo=GepoConfig(h_low=5.0, h_high=20.0, c_low=0.5, c_high=2.0))
    ref = shape(rewards, beh, resp, gm, cfg)
    got = shape_packed(rewards, beh[resp], lengths, gm, cfg)
    assert torch.allclose(got.advantages, ref.advantages, rtol=1e-12, atol=1e-12)
    assert torch.allclose(got.entropy, ref.entropy, rtol=1e-12, atol=1e-12)
    assert torch.equal(got.resample, ref.resample)
    with pytest.raises(ValueError):
        segment_sums(torch.zeros(3), torch.tensor([1, 1]))
