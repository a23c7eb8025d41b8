"""Closed-form checks of the pure objective (SPEC §B Eq 7–9)."""

from __future__ import annotations

import math

import pytest
import torch

from pretrain.objective import IGNORE, info_nce, text_loss, total_loss, warmup_cosine


def test_info_nce_matches_hand_computed_3x3() -> None:
    pred = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    target = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    # cos(pred_t, target_j):  row0 (1, 0, -1)   row1 (0, 1, 0)   row2 (1/√2, 1/√2, -1/√2); τ = 0.5 doubles them.
    r = math.sqrt(2)
    row0 = -math.log(math.exp(2) / (math.exp(2) + 1 + math.exp(-2)))
    row1 = -math.log(math.exp(2) / (math.exp(2) + 2))
    row2 = -math.log(math.exp(-r) / (2 * math.exp(r) + math.exp(-r)))
    loss, acc = info_nce(pred, target, tau=0.5)
    assert loss.item() == pytest.approx((row0 + row1 + row2) / 3, abs=1e-6)
    assert acc.item() == pytest.approx(2 / 3)  # row 2's positive is its least similar column


def test_info_nce_invariant_to_consistent_permutation() -> None:
    g = torch.Generator().manual_seed(0)
    pred, target = torch.randn(7, 5, generator=g), torch.randn(7, 5, generator=g)
    perm = torch.randperm(7, generator=g)
    a, acc_a = info_nce(pred, target, tau=0.1)
    b, acc_b = info_nce(pred[perm], target[perm], tau=0.1)
    assert a.item() == pytest.approx(b.item(), abs=1e-6)
    assert acc_a.item() == pytest.approx(acc_b.item())
    # ...but pairing each prediction with another row's target changes it
    c, _ = info_nce(pred, target[perm], tau=0.1)
    assert abs(c.item() - a.item()) > 1e-3


def test_info_nce_is_scale_free_and_rejects_bad_shapes() -> None:
    pred, target = torch.randn(4, 3), torch.randn(4, 3)
    assert info_nce(pred * 10, target * 0.1, 0.2)[0].item() == pytest.approx(
        info_nce(pred, target, 0.2)[0].item(), abs=1e-5
    )
    with pytest.raises(ValueError):
        info_nce(pred, target[:3], 0.2)


def test_text_loss_ignores_masked_positions() -> None:
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.8, 0.1], [1 / 3, 1 / 3, 1 / 3]]]))
    labels = torch.tensor([[0, 1, IGNORE]])
    assert text_loss(logits, labels).item() == pytest.approx((-math.log(0.5) - math.log(0.8)) / 2, abs=1e-6)
    zero = text_loss(logits.requires_grad_(), torch.full((1, 3), IGNORE))
    assert zero.item() == 0.0 and zero.requires_grad


def test_total_loss_weights() -> None:
    assert total_loss(torch.tensor(2.0), torch.tensor(3.0), 0.5, 2.0).item() == pytest.approx(7.0)


def test_warmup_cosine_schedule() -> None:
    assert warmup_cosine(0, 4, 10, 0.1) == pytest.approx(0.25)
    assert warmup_cosine(3, 4, 10, 0.1) == pytest.approx(1.0)
    assert warmup_cosine(4 + 5, 4, 10, 0.1) == pytest.approx(0.1 + 0.9 * 0.5)  # halfway down the cosine
    assert warmup_cosine(4 + 10, 4, 10, 0.1) == pytest.approx(0.1)
    assert warmup_cosine(1000, 4, 10, 0.1) == pytest.approx(0.1)


def _gather_worker(rank: int, store_path: str, pred: torch.Tensor, target: torch.Tensor, out: str) -> None:
    import os

    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # keep gloo's sockets on loopback
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    rows = slice(0, 2) if rank == 0 else slice(2, 5)  # ranks hold different M
    loss, _ = info_nce(pred[rows], target[rows], tau=0.3, gather=True)
    torch.save(loss, f"{out}.{rank}")
    dist.destroy_process_group()


def test_info_nce_gathers_negatives_across_ranks(tmp_path) -> None:
    import torch.multiprocessing as mp
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(1)
    pred, target = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
    mp.spawn(_gather_worker, args=(str(tmp_path / "store"), pred, target, str(tmp_path / "loss")), nprocs=2)
    logits = F.normalize(pred, dim=-1) @ F.normalize(target, dim=-1).T / 0.3
    per_row = F.cross_entropy(logits, torch.arange(5), reduction="none")
    assert torch.load(tmp_path / "loss.0").item() == pytest.approx(per_row[:2].mean().item(), abs=1e-5)
    assert torch.load(tmp_path / "loss.1").item() == pytest.approx(per_row[2:].mean().item(), abs=1e-5)
