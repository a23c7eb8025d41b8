"""Tests for posttrain.objectives.speculative (SPEC §C4, Eq 21–24): exactness by chi-square, identities, draft loss.

Run: python -m pytest tests/posttrain/test_speculative.py -q
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.objectives.speculative import (
    AcceptanceTracker,
    acceptance_rate,
    expected_tokens_per_round,
    hybrid_draft_loss,
    position_outcomes,
    total_variation,
    verify,
)

F64 = torch.float64
P_WORKED = torch.tensor([0.6, 0.3, 0.1], dtype=F64)
Q_WORKED = torch.tensor([0.5, 0.2, 0.3], dtype=F64)


def test_overlap_worked() -> None:
    assert acceptance_rate(P_WORKED, Q_WORKED).item() == pytest.approx(0.80, abs=1e-12)
    assert total_variation(P_WORKED, Q_WORKED).item() == pytest.approx(0.20, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 50), st.integers(0, 2**31 - 1))
def test_acceptance_is_one_minus_tv(v, seed) -> None:
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(3 * torch.randn(4, v, generator=gen, dtype=F64), -1)
    q = torch.softmax(3 * torch.randn(4, v, generator=gen, dtype=F64), -1)
    assert torch.allclose(acceptance_rate(p, q), 1 - total_variation(p, q), atol=1e-12)


def test_expected_tokens_closed_form() -> None:
    a = 0.8
    assert expected_tokens_per_round(a, 4).item() == pytest.approx((1 - a**5) / (1 - a), abs=1e-12)
    assert expected_tokens_per_round(1.0, 4).item() == 5.0
    assert expected_tokens_per_round(0.0, 4).item() == 1.0


def _constant_round(p: torch.Tensor, q: torch.Tensor, b: int, k: int, gen: torch.Generator):
    drafts = torch.multinomial(q.float().expand(b * k, -1), 1, replacement=True, generator=gen).view(b, k)
    return verify(drafts, q.expand(b, k, -1), p.expand(b, k + 1, -1), gen)


def test_empirical_tokens_per_round_matches_closed_form() -> None:
    gen = torch.Generator().manual_seed(11)
    k, b = 4, 40_000
    out = _constant_round(P_WORKED, Q_WORKED, b, k, gen)
    mean = out.n_emitted.double().mean().item()
    assert mean == pytest.approx(expected_tokens_per_round(0.8, k).item(), abs=0.04)  # ≈ 4 standard errors
    reached, accepted = position_outcomes(out.n_accepted, k)
    per_pos = accepted.sum(0).double() / reached.sum(0).double()
    assert torch.allclose(per_pos, torch.full((k,), 0.8, dtype=F64), atol=0.02)
    # emitted tokens form a contiguous prefix and padding is −1
    pos = torch.arange(k + 1)
    assert ((out.tokens >= 0) == (pos < out.n_emitted.unsqueeze(-1))).all()


def _markov_generate(p_mat, q_mat, start, b, n, k, gen, verify_fn=verify):
    """Generate n tokens per row of a Markov chain with speculative rounds (draft q_mat, target p_mat)."""
    out = torch.full((b, n + k + 1), -1, dtype=torch.int64)
    filled = torch.zeros(b, dtype=torch.int64)
    last = torch.full((b,), start, dtype=torch.int64)
    rows = torch.arange(b).unsqueeze(-1).expand(b, k + 1)
    while bool((filled < n).any()):
        ctx, drafts, qs = last, [], []
        for _ in range(k):  # drafting is sequential by nature; K is small
            q = q_mat[ctx]
            ctx = torch.multinomial(q, 1, generator=gen).squeeze(-1)
            drafts.append(ctx)
            qs.append(q)
        d = torch.stack(drafts, 1)
        targets = p_mat[torch.cat([last.unsqueeze(-1), d], 1)]
        res = verify_fn(d, torch.stack(qs, 1), targets, gen)
        write = (torch.arange(k + 1) < res.n_emitted.unsqueeze(-1)) & (filled < n).unsqueeze(-1)
        pos = filled.unsqueeze(-1) + torch.arange(k + 1)
        out[rows[write], pos[write]] = res.tokens[write]
        active = filled < n
        last = torch.where(active, res.tokens.gather(1, (res.n_emitted - 1).unsqueeze(-1)).squeeze(-1), last)
        filled = filled + torch.where(active, res.n_emitted, 0)
    return out[:, :n]


def _chi_square_pvalue(seqs: torch.Tensor, p_mat: torch.Tensor, start: int) -> float:
    v, n = p_mat.shape[0], seqs.shape[1]
    observed, expected = [], []
    codes = (seqs * torch.tensor([v**i for i in reversed(range(n))])).sum(-1)
    counts = torch.bincount(codes, minlength=v**n).double()
    for cell, combo in enumerate(itertools.product(range(v), repeat=n)):
        prob, prev = 1.0, start
        for x in combo:
            prob *= p_mat[prev, x].item()
            prev = x
        observed.append(counts[cell].item())
        expected.append(prob * seqs.shape[0])
    obs, exp = torch.tensor(observed, dtype=F64), torch.tensor(expected, dtype=F64)
    stat = ((obs - exp) ** 2 / exp).sum()
    df = len(observed) - 1
    return torch.special.gammaincc(torch.tensor(df / 2, dtype=F64), stat / 2).item()  # chi-square survival


P_CHAIN = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [0.3, 0.5, 0.2]], dtype=F64)
Q_CHAIN = torch.tensor([[0.2, 0.2, 0.6], [0.7, 0.2, 0.1], [0.1, 0.1, 0.8]], dtype=F64)


def test_speculative_sampling_preserves_target_distribution() -> None:
    gen = torch.Generator().manual_seed(1234)
    seqs = _markov_generate(P_CHAIN, Q_CHAIN, start=0, b=30_000, n=3, k=2, gen=gen)
    assert (seqs >= 0).all()
    # Joint law of 3 tokens spanning round boundaries (K = 2) vs the target chain: 27 cells.
    assert _chi_square_pvalue(seqs, P_CHAIN, start=0) > 1e-3


def test_chi_square_has_power_against_unverified_drafts() -> None:
    """The same statistic rejects a sampler that skips the accept/reject step (emits drafts as-is)."""

    def accept_all(d, qs, targets, gen):  # noqa: ANN001, ANN202 - a deliberately wrong verifier
        b, k = d.shape
        extra = torch.multinomial(targets[:, k], 1, generator=gen)
        return type(verify(d[:1], qs[:1], targets[:1], gen))(
            tokens=torch.cat([d, extra], 1), n_emitted=torch.full((b,), k + 1), n_accepted=torch.full((b,), k)
        )

    gen = torch.Generator().manual_seed(1234)
    seqs = _markov_generate(P_CHAIN, Q_CHAIN, start=0, b=30_000, n=3, k=2, gen=gen, verify_fn=accept_all)
    assert _chi_square_pvalue(seqs, P_CHAIN, start=0) < 1e-12


def test_identical_draft_is_always_accepted() -> None:
    gen = torch.Generator().manual_seed(0)
    out = _constant_round(P_WORKED, P_WORKED, 1000, 4, gen)
    assert out.n_accepted.eq(4).all()


def test_hybrid_draft_loss_closed_form_and_stop_gradient() -> None:
    gen = torch.Generator().manual_seed(5)
    tgt = torch.randn(6, 3, 11, generator=gen, dtype=F64, requires_grad=True)
    drf = torch.randn(6, 3, 11, generator=gen, dtype=F64, requires_grad=True)
    abar = torch.tensor([0.0, 0.5, 0.9], dtype=F64)
    loss = hybrid_draft_loss(tgt, drf, abar, eta=3.0)
    p, q = torch.softmax(tgt.detach(), -1), torch.softmax(drf.detach(), -1)
    kl = (p * (p.log() - q.log())).sum(-1)
    tv = 0.5 * (p - q).abs().sum(-1)
    lam = torch.exp(-3.0 * abar)
    expected = (lam * kl + (1 - lam) * tv).mean(0).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-10)
    assert lam[0].item() == 1.0  # ᾱ = 0: pure KL
    loss.backward()
    assert tgt.grad is None  # the policy never receives the draft's gradient
    assert drf.grad.abs().sum() > 0


def test_hybrid_loss_mask_averages_per_position() -> None:
    gen = torch.Generator().manual_seed(6)
    tgt, drf = torch.randn(4, 2, 5, generator=gen), torch.randn(4, 2, 5, generator=gen)
    mask = torch.tensor([[True, True], [True, False], [True, False], [True, False]])
    full = hybrid_draft_loss(tgt, drf, torch.zeros(2), mask=mask)
    pos0 = hybrid_draft_loss(tgt[:, :1], drf[:, :1], torch.zeros(1))
    pos1 = hybrid_draft_loss(tgt[:1, 1:], drf[:1, 1:], torch.zeros(1))
    assert full.item() == pytest.approx(((pos0 + pos1) / 2).item(), rel=1e-6)


def test_acceptance_tracker() -> None:
    tr = AcceptanceTracker(k=3, decay=0.5)
    # rows accepted 0, 1, 3 drafts: position 0 reached 3× accepted 2×; position 1 reached 2× accepted 1×;
    # position 2 reached 1× accepted 1×.
    tr.update(torch.tensor([0, 1, 3]))
    assert tr.value.tolist() == pytest.approx([0.5 * 2 / 3, 0.5 * 1 / 2, 0.5 * 1.0])
    tr.update(torch.tensor([0, 0]))  # positions 1, 2 not reached: unchanged
    assert tr.value.tolist() == pytest.approx([0.5 * (0.5 * 2 / 3), 0.25, 0.5])
    assert tr.lambdas(3.0).tolist() == pytest.approx(torch.exp(-3.0 * tr.value).tolist())
