"""SPEC C10 encoder claims: the worked patch numbers, the token budget, channel mixing vs mean pooling, channel
permutation, NaN handling and cost linear in T.

    .venv/bin/python -m pytest tests/pretrain/timeseries/test_encoder.py -q
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from pretrain.timeseries.config import EncoderConfig
from pretrain.timeseries.encoder import SeriesEncoder, n_patches, normalise, patch_length, token_count

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_spec_worked_patch_lengths():
    assert patch_length(300_000, 1024, 4) == 1172
    assert patch_length(4096, 1024, 4) == 16
    assert n_patches(300_000, 1024, 4) == 256 and token_count(300_000, 1024, 4) == 1024


@pytest.mark.parametrize("budget,q", [(1024, 4), (64, 4), (96, 8), (30, 3)])
def test_token_count_never_exceeds_budget(budget, q):
    rng = np.random.default_rng(0)
    for t in [1, 2, 3, 7, budget - 1, budget, budget + 1, *rng.integers(1, 2_000_000, 2000).tolist()]:
        assert token_count(int(t), budget, q) <= budget, t


def test_encoder_output_respects_budget_and_masks():
    enc = SeriesEncoder(EncoderConfig(budget=64, queries=4)).eval()
    x = torch.randn(3, 2, 500)
    x[1, :, :300] = float("nan")  # a shorter series (left-padded)
    x[2, 1] = float("nan")  # a missing channel
    with torch.no_grad():
        out = enc(x)
    assert out.tokens.shape == (3, 64, 32) and out.patch_len == 32
    assert torch.isfinite(out.tokens).all() and torch.isfinite(out.channel_tokens).all()
    assert out.channel_mask.tolist() == [[True, True], [True, True], [True, False]]
    assert not out.token_mask[1, : 4 * 9].any() and out.token_mask[1, -4:].all()  # 300/32 → 9 empty patches


def test_normalise_keeps_mu_sigma_and_ignores_nan():
    x = torch.tensor([[[1.0, float("nan"), 3.0, 5.0]]])
    z, mu, sigma = normalise(x, torch.isfinite(x))
    assert mu.item() == pytest.approx(3.0) and sigma.item() == pytest.approx(np.std([1, 3, 5]))
    assert z[0, 0, 1].item() == 0.0 and z[0, 0, 3].item() == pytest.approx(2 / np.std([1, 3, 5]))


def _three_series(t: int = 256) -> torch.Tensor:
    """Three 2-channel series whose per-step channel mean is the same sine but whose channels relate differently."""
    s = np.arange(t)
    m = np.sin(s / 7.0)
    devs = [np.sin(s / 3.0), 0.5 * np.cos(s / 11.0) + 0.2, np.sign(np.sin(s / 5.0))]
    return torch.tensor(np.stack([np.stack([m + d, m - d]) for d in devs]), dtype=torch.float64)


def test_mean_pooling_cannot_tell_them_apart_channel_transformer_can():
    x = _three_series()
    assert torch.allclose(x.mean(1)[0], x.mean(1)[1]) and torch.allclose(x.mean(1)[0], x.mean(1)[2])
    torch.manual_seed(0)
    mean_enc = SeriesEncoder(EncoderConfig(channel_mixing="mean")).eval()
    torch.manual_seed(0)
    tf_enc = SeriesEncoder(EncoderConfig(channel_mixing="transformer")).eval()
    with torch.no_grad():
        pooled, mixed = mean_enc(x).tokens, tf_enc(x).tokens
    for i in range(3):
        for j in range(i + 1, 3):
            assert torch.allclose(pooled[i], pooled[j], atol=1e-5)
            assert (mixed[i] - mixed[j]).abs().max() > 1e-2, (i, j)


def test_channel_permutation_permutes_channel_tokens():
    from pretrain.timeseries.datasets import available, daphnet

    if not available():
        pytest.skip("aeon wheel not downloaded (make install)")
    rec = daphnet(max_rows=2048)
    x = torch.tensor(np.asarray(rec.values), dtype=torch.float64)[None]  # [1, 9, 2048] real accelerometers
    perm = torch.tensor([4, 0, 8, 2, 6, 1, 3, 7, 5])
    enc = SeriesEncoder(EncoderConfig(budget=64)).eval()
    with torch.no_grad():
        a, b = enc(x), enc(x[:, perm])
    torch.testing.assert_close(b.channel_tokens, a.channel_tokens[:, perm], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(b.tokens, a.tokens, atol=1e-4, rtol=1e-4)  # the pooled tokens do not care
    torch.testing.assert_close(b.mu, a.mu[:, perm])


def test_300k_steps_8_channels_encode_within_budget_on_cpu():
    enc = SeriesEncoder(EncoderConfig(budget=1024, queries=4)).eval()
    x = torch.randn(1, 8, 300_000)
    x[0, 3, 1000:5000] = float("nan")
    with torch.no_grad():
        out = enc(x)
    assert out.patch_len == 1172 and out.tokens.shape[1] == 1024 and torch.isfinite(out.tokens).all()


@pytest.mark.slow
def test_encoder_cost_is_linear_in_t():
    enc = SeriesEncoder(EncoderConfig(budget=1024, queries=4)).eval()

    def cost(t: int) -> float:
        x = torch.randn(1, 4, t)
        best = float("inf")
        for _ in range(2):
            t0 = time.perf_counter()
            with torch.no_grad():
                enc(x)
            best = min(best, time.perf_counter() - t0)
        return best

    small, big = cost(100_000), cost(300_000)
    assert big / small < 4.5, (small, big)  # linear: 3×; quadratic would be 9×
