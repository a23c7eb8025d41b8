"""The pre-training objective as pure tensor functions (SPEC §B, Eq 7–9).

python -m pytest tests/pretrain/test_objective.py -q
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

IGNORE = -100


def text_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """L_text: mean next-token cross-entropy over positions whose label is not ``IGNORE``.

    ``labels[b, t]`` is already the token that follows position t (the loader shifts), so no shift here.
    A batch without any text target returns a zero that still belongs to the graph.
    """
    flat = labels.reshape(-1)
    if not bool((flat != IGNORE).any()):
        return logits.sum() * 0.0
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), flat, ignore_index=IGNORE)


def info_nce(
    pred: torch.Tensor, target: torch.Tensor, tau: float, gather: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """L_VP (Eq 7–8) and its top-1 accuracy.

    ``pred[t]`` is û_{t+1}, ``target[t]`` is u_{t+1}, both ``[M, D]``. s_tj = cos(pred_t, target_j) / τ over every
    target j of the batch; the positive of row t is column t (labels = arange(M)).

    With ``gather`` and an initialised process group, every rank's targets join the columns (more negatives);
    targets come from the frozen encoder, so gathering them needs no autograd. Ranks may hold different M.
    """
    if pred.shape != target.shape or pred.dim() != 2:
        raise ValueError(f"pred and target must both be [M, D], got {tuple(pred.shape)} and {tuple(target.shape)}")
    offset = 0
    columns = target
    if gather and torch.distributed.is_available() and torch.distributed.is_initialized():
        columns, offset = _gather_rows(target.detach())
    m = pred.shape[0]
    if m == 0:
        zero = pred.sum() * 0.0
        return zero, zero.detach()
    logits = F.normalize(pred.float(), dim=-1) @ F.normalize(columns.float(), dim=-1).T / tau
    labels = torch.arange(m, device=pred.device) + offset
    loss = F.cross_entropy(logits, labels)
    acc = (logits.argmax(dim=-1) == labels).float().mean()
    return loss, acc.detach()


def total_loss(l_text: torch.Tensor, l_vp: torch.Tensor, lambda_text: float, lambda_vis: float) -> torch.Tensor:
    """Eq 9: L = λ_text·L_text + λ_vis·L_VP."""
    return lambda_text * l_text + lambda_vis * l_vp


def warmup_cosine(step: int, warmup_steps: int, decay_steps: int, min_ratio: float) -> float:
    """LR multiplier at optimizer step ``step`` (0-based): linear warmup to 1, cosine down to ``min_ratio``."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, decay_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _gather_rows(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """All-gather ``[m_r, D]`` rows of different lengths; returns the concatenation and this rank's offset."""
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    sizes = [torch.zeros(1, dtype=torch.long, device=x.device) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([x.shape[0]], dtype=torch.long, device=x.device))
    counts = [int(s.item()) for s in sizes]
    biggest = max(counts)
    padded = torch.zeros(biggest, x.shape[1], dtype=x.dtype, device=x.device)
    padded[: x.shape[0]] = x
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    rows = torch.cat([p[:c] for p, c in zip(parts, counts)], dim=0)
    return rows, sum(counts[:rank])
