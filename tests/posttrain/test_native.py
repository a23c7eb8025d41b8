"""The C kernels (posttrain/native) equal the PyTorch path; building, loading and refusing work.

Run: python -m pytest tests/posttrain/test_native.py -q
"""

from __future__ import annotations

import logging
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.objectives import native
from posttrain.objectives.advantages import segment_sums
from posttrain.objectives.policy_loss import ClipConfig, packed_policy_loss_and_grad

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler: the native kernels cannot be built")


def _packed(seed: int, r: int, t: int, spread: float = 0.5, keep_p: float | None = 0.85):  # noqa: ANN202
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, t + 1, (r,), generator=gen)
    n = int(lengths.sum())
    beh = -2.0 * torch.rand(n, generator=gen)
    logp = beh + spread * torch.randn(n, generator=gen)
    keep = None if keep_p is None else torch.rand(n, generator=gen) < keep_p
    adv = torch.randn(r, generator=gen)
    return logp, beh, adv, lengths, keep


def _both(logp, beh, adv, lengths, keep, clip, **kw):  # noqa: ANN001, ANN202
    ref = packed_policy_loss_and_grad(logp, beh, adv, lengths, keep, clip, backend="torch", **kw)
    got = packed_policy_loss_and_grad(logp, beh, adv, lengths, keep, clip, backend="native", **kw)
    return ref, got


def _assert_same(ref, got, logp: torch.Tensor) -> None:  # noqa: ANN001
    (rl, rg, rs), (gl, gg, gs) = ref, got
    assert gg.shape == rg.shape
    if rg.numel():
        # Both compute exp in float32 (≤ 2 ulp apart); the weight is then scaled by the same coefficient.
        scale = max(rg.abs().max().item(), 1e-30)
        assert (gg.double() - rg.double()).abs().max().item() <= 4e-7 * scale
    # The loss sums the same mixed-sign terms in another order: compare against Σ|terms|.
    terms = (rg.double() * torch.where(rg != 0, logp.double(), 0.0)).abs().sum().item()
    assert abs(gl.item() - rl.item()) <= 1e-6 * max(terms, abs(rl.item())) + 1e-15
    assert gs.clip_fraction.item() == pytest.approx(rs.clip_fraction.item(), abs=1e-12)
    assert gs.kept_fraction.item() == rs.kept_fraction.item()
    assert int(gs.n_tokens) == int(rs.n_tokens)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 2**31 - 1),
    st.integers(1, 40),
    st.integers(0, 300),
    st.floats(0.0, 1.0),
    st.floats(0.0, 4.0) | st.just(math.inf),
    st.booleans(),
    st.floats(0.01, 3.0),
)
def test_native_equals_torch(seed, r, t, eps_low, eps_high, with_keep, spread) -> None:
    logp, beh, adv, lengths, keep = _packed(seed, r, t, spread, 0.85 if with_keep else None)
    clip = ClipConfig(eps_low, eps_high)
    ref, got = _both(logp, beh, adv, lengths, keep, clip, n_tokens=5000)
    _assert_same(ref, got, logp)


def test_native_multithreaded_split_equals_one_thread() -> None:
    """Large enough that the work is split over threads; every token's gradient is bit-identical."""
    logp, beh, adv, lengths, keep = _packed(3, 600, 1024)
    off = native.offsets_of(lengths)
    coef = adv / -float(logp.numel())
    l1, c1, g1 = native.packed_loss_grad(logp, beh, off, coef, keep, 0.8, 1.2, threads=1)
    l4, c4, g4 = native.packed_loss_grad(logp, beh, off, coef, keep, 0.8, 1.2, threads=4)
    assert len(native._ranges(off, 4)) == 4
    assert torch.equal(g1, g4) and c1 == c4
    assert l4 == pytest.approx(l1, rel=1e-6)
    s1 = native.segment_sums(beh, off, threads=1)
    s4 = native.segment_sums(beh, off, threads=4)
    assert torch.equal(s1, s4)
    ref = torch.segment_reduce(beh.double(), "sum", lengths=lengths)
    assert torch.allclose(s1, ref, rtol=1e-12, atol=1e-9)


def test_native_exp_accuracy_over_the_float_range() -> None:
    """With no clipping (lo = 0, hi = inf) the weight is exp(d) itself: within 2 ulp of torch.exp."""
    d = torch.linspace(-87.0, 88.0, 200_001)
    logp = d.clone()
    beh = torch.zeros_like(d)
    off = torch.tensor([0, d.numel()])
    _, clipped, g = native.packed_loss_grad(logp, beh, off, torch.ones(1), None, 0.0, math.inf)
    ref = torch.exp(d.double())
    assert clipped == 0
    assert ((g.double() - ref).abs() / ref).max().item() < 2.5e-7


def test_native_clipped_token_takes_the_bound_exactly() -> None:
    logp = torch.log(torch.tensor([0.8, 0.5, 0.01]))
    beh = torch.log(torch.tensor([0.1, 0.5, 0.5]))  # ρ = 8 → 1.2, ρ = 1, ρ = 0.02 → 0.8
    loss, grad, stats = packed_policy_loss_and_grad(logp, beh, torch.tensor([0.5]), torch.tensor([3]), backend="native")
    coef = torch.tensor(0.5) / -3.0
    assert grad[0].item() == (torch.tensor(1.2) * coef).item()
    assert grad[2].item() == (torch.tensor(0.8) * coef).item()
    assert grad[1].item() == pytest.approx(coef.item(), rel=1e-7)
    assert stats.clip_fraction.item() == pytest.approx(2 / 3)
    assert loss.item() == pytest.approx((grad.double() * logp.double()).sum().item(), rel=1e-6)


def test_native_nan_propagates_and_masked_tokens_do_not_poison() -> None:
    logp = torch.tensor([-1.0, float("nan"), -0.5, float("-inf")])
    beh = torch.tensor([-1.0, -1.0, -0.5, -0.5])
    lengths = torch.tensor([2, 2])
    adv = torch.tensor([1.0, -1.0])
    keep = torch.tensor([True, True, True, False])
    loss, grad, _ = packed_policy_loss_and_grad(logp, beh, adv, lengths, keep, backend="native")
    assert math.isnan(grad[1].item()) and math.isnan(loss.item())  # a NaN log-prob is not hidden
    keep[1] = False
    loss, grad, stats = packed_policy_loss_and_grad(logp, beh, adv, lengths, keep, backend="native")
    assert grad[1].item() == 0.0 and grad[3].item() == 0.0 and math.isfinite(loss.item())
    assert stats.kept_fraction.item() == 0.5
    ref = packed_policy_loss_and_grad(logp, beh, adv, lengths, keep, backend="torch")
    assert loss.item() == pytest.approx(ref[0].item(), rel=1e-6)


def test_native_grad_out_and_segment_sums_api() -> None:
    logp, beh, adv, lengths, _ = _packed(5, 8, 50, keep_p=None)
    out = torch.empty_like(logp)
    _, grad, _ = packed_policy_loss_and_grad(logp, beh, adv, lengths, grad_out=out, backend="native")
    assert grad.data_ptr() == out.data_ptr()
    lens2d = lengths.view(2, 4)
    got = segment_sums(beh, lens2d, backend="native")
    assert got.shape == (2, 4) and got.dtype == torch.float32
    assert torch.allclose(got, segment_sums(beh, lens2d, backend="torch"), rtol=1e-6, atol=1e-4)


def test_native_refuses_what_it_cannot_take() -> None:
    logp, beh, adv, lengths, _ = _packed(1, 4, 20, keep_p=None)
    with pytest.raises(ValueError, match="float32 CPU"):
        packed_policy_loss_and_grad(logp.double(), beh.double(), adv, lengths, backend="native")
    with pytest.raises(ValueError, match="per-response"):  # per-token advantages: the torch path only
        packed_policy_loss_and_grad(logp, beh, torch.ones_like(logp), lengths, backend="native")
    with pytest.raises(ValueError, match="backend"):
        packed_policy_loss_and_grad(logp, beh, adv, lengths, backend="cuda")
    with pytest.raises(ValueError, match=">= 0"):
        segment_sums(torch.zeros(2), torch.tensor([3, -1]))
    with pytest.raises(ValueError, match="offsets"):
        native.segment_sums(torch.zeros(4), torch.tensor([0, 2, 3]))
    with pytest.raises(ValueError, match="grad_out"):
        native.packed_loss_grad(logp, beh, native.offsets_of(lengths), adv, None, 0.8, 1.2, torch.empty(3))
    # float64 under "auto" takes the PyTorch path instead of failing.
    loss, _, _ = packed_policy_loss_and_grad(logp.double(), beh.double(), adv.double(), lengths)
    assert loss.dtype == torch.float64


def test_build_is_cached_and_a_broken_compiler_is_reported(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("SCIFOLIO_NATIVE_CACHE", str(tmp_path / "cache"))
    native._loaded.cache_clear()
    native._warn_unavailable.cache_clear()
    try:
        lib = native.library()
        built = list((tmp_path / "cache").glob("*/libfused_rl.so"))
        assert len(built) == 1 and lib._name == str(built[0])
        native._loaded.cache_clear()
        native.library()  # second load: no rebuild, same file
        assert list((tmp_path / "cache").glob("*/libfused_rl.so")) == built

        monkeypatch.setenv("CC", "false")  # a "compiler" that fails
        monkeypatch.setenv("SCIFOLIO_NATIVE_CACHE", str(tmp_path / "other"))
        native._loaded.cache_clear()
        assert not native.available()
        with pytest.raises(native.NativeUnavailable):
            native.use_native("native", torch.zeros(1))
        with caplog.at_level(logging.WARNING, logger="posttrain.objectives.native"):
            assert native.use_native("auto", torch.zeros(1)) is False
        assert "unavailable" in caplog.text
        monkeypatch.delenv("CC")  # the failure is remembered: no new build attempt on every call
        assert not native.available()
    finally:
        native._loaded.cache_clear()
        native._warn_unavailable.cache_clear()
