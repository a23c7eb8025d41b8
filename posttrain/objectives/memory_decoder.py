"""Memory Decoder: a kNN-LM distilled into a small parametric memory, fused with a frozen base (SPEC §C9).

- Datastore: (key = hidden state of a prefix, value = the next token) over a domain SFT corpus.
- Eq 1: ``p_kNN(v) ∝ Σ_{j∈N} 1[v_j = v]·exp(−d_j/τ)`` over the retrieved neighbours N.
- Eq 2: the memory model learns ``β·KL(p_kNN ‖ p_mem) + (1−β)·CE(gold)`` so it can stand in for the
  datastore at inference (no retrieval at serving time).
- Eq 3: ``p = (1−λ)·p_base + λ·p_mem``.
- Eq 4: a router predicts λ_t = σ(router(h_base, h_mem, entropies, max-probs)) with base and memory
  frozen; loss ``−log p(gold) + α_s·s_t·λ_t`` with s_t = −1 on domain data (nudges λ up) and +1 on
  general data (nudges λ down), the signed prior that keeps the memory out of general text.

Run the tests: ``python -m pytest tests/posttrain/test_memory_decoder.py -q``
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class Datastore:
    """Exact in-memory datastore (a Milvus collection plays this role at corpus scale)."""

    keys: Tensor
    """``[N, H]`` prefix encodings."""
    values: Tensor
    """``[N]`` next-token ids."""

    def search(self, queries: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """k nearest keys by squared L2 distance: ``(distances [B, k], values [B, k])``, nearest first."""
        d = torch.cdist(queries.float(), self.keys.float()).pow(2)
        k = min(k, self.keys.shape[0])
        dist, idx = d.topk(k, dim=-1, largest=False)
        return dist, self.values[idx]


def knn_distribution(
    distances: Tensor, values: Tensor, vocab_size: int, tau: float = 1.0, mask: Tensor | None = None
) -> Tensor:
    """Eq 1 for a batch: distances, values ``[B, N]`` → ``[B, V]`` probabilities.

    softmax(−d/τ) equals exp(−d_j/τ) normalised but cannot underflow to 0/0 for far neighbours.
    """
    logits = -distances.to(torch.promote_types(distances.dtype, torch.float32)) / tau
    if mask is not None:
        logits = logits.masked_fill(~mask.bool(), float("-inf"))
    w = torch.softmax(logits, dim=-1)
    out = torch.zeros(distances.shape[0], vocab_size, dtype=w.dtype, device=w.device)
    return out.scatter_add_(1, values.to(torch.int64), w)


def memory_loss(p_knn: Tensor, memory_logits: Tensor, gold: Tensor, beta: float = 0.5) -> Tensor:
    """Eq 2: ``β·KL(p_kNN ‖ p_mem) + (1−β)·CE(p_mem, gold)``, batch mean. β is ours (no value given).
    A dense ``[B, V]`` p_kNN: :func:`sparse_memory_loss` with every token of the vocabulary listed."""
    every = torch.arange(p_knn.shape[-1], device=p_knn.device).expand(p_knn.shape)
    return sparse_memory_loss(every, p_knn, memory_logits, gold, beta)


def sparse_memory_loss(
    knn_tokens: Tensor, knn_probs: Tensor, memory_logits: Tensor, gold: Tensor, beta: float = 0.5
) -> Tensor:
    """Eq 2 with p_kNN given top-k sparse (``tokens, probs [B, K]``, zero-prob slots ignored): equal to
    :func:`memory_loss` on the dense distribution, without ever materialising ``[B, V]`` targets."""
    dt = torch.promote_types(memory_logits.dtype, torch.float32)
    log_mem = torch.log_softmax(memory_logits.to(dt), dim=-1)
    p = knn_probs.detach().to(dt)
    kl = (torch.special.xlogy(p, p) - p * log_mem.gather(-1, knn_tokens.to(torch.int64))).sum(dim=-1)
    ce = -log_mem.gather(-1, gold.unsqueeze(-1).to(torch.int64)).squeeze(-1)
    return (beta * kl + (1.0 - beta) * ce).mean()


def fuse(p_base: Tensor, p_mem: Tensor, lam: Tensor | float) -> Tensor:
    """Eq 3: ``(1−λ)·p_base + λ·p_mem``; λ scalar or one per row."""
    lam_t = torch.as_tensor(lam, dtype=p_base.dtype, device=p_base.device)
    if lam_t.dim() == 1:
        lam_t = lam_t.unsqueeze(-1)
    return (1.0 - lam_t) * p_base + lam_t * p_mem


def argmax_flip_lambda(p_base: Tensor, p_mem: Tensor) -> Tensor:
    """Smallest λ ∈ (0, 1] at which the fused argmax leaves the base's argmax; +inf if it never does.

    For token v against the base argmax a, ``fused_v − fused_a`` is linear in λ, so each crossing has
    the closed form ``λ_v = (b_a − b_v) / ((m_v − m_a) − (b_v − b_a))`` (valid when the denominator > 0).
    """
    a = p_base.argmax(dim=-1, keepdim=True)
    b_gap = p_base.gather(-1, a) - p_base  # b_a − b_v ≥ 0
    m_gain = p_mem - p_mem.gather(-1, a)  # m_v − m_a
    denom = m_gain + b_gap
    lam = torch.where(denom > 0, b_gap / torch.where(denom > 0, denom, torch.ones_like(denom)), torch.inf)
    lam = torch.where((lam > 0) & (lam <= 1), lam, torch.full_like(lam, torch.inf))
    return lam.amin(dim=-1)


def router_features(p_base: Tensor, p_mem: Tensor) -> Tensor:
    """``[B, 4]``: entropy and max-probability of both distributions (the router's scalar cues)."""

    def entropy(p: Tensor) -> Tensor:
        return -torch.special.xlogy(p, p).sum(dim=-1)

    return torch.stack([entropy(p_base), entropy(p_mem), p_base.amax(dim=-1), p_mem.amax(dim=-1)], dim=-1)


@dataclass(frozen=True)
class RouterConfig:
    """Size of the λ router."""

    base_hidden: int
    """Hidden size of the frozen base model's last layer."""
    memory_hidden: int
    """Hidden size of the frozen memory model's last layer."""
    width: int = 64
    """Width of the router's single hidden layer."""


class Router(nn.Module):
    """λ_t = σ(MLP([h_base, h_mem, H_base, H_mem, max p_base, max p_mem])) (Eq 4)."""

    def __init__(self, config: RouterConfig) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(config.base_hidden + config.memory_hidden + 4, config.width),
            nn.GELU(),
            nn.Linear(config.width, 1),
        )

    def forward(self, h_base: Tensor, h_mem: Tensor, p_base: Tensor, p_mem: Tensor) -> Tensor:
        # Base and memory are frozen: nothing upstream of the router may receive gradient.
        x = torch.cat([h_base.detach(), h_mem.detach(), router_features(p_base.detach(), p_mem.detach())], dim=-1)
        return torch.sigmoid(self.net(x.float())).squeeze(-1)


def router_loss(
    p_base: Tensor, p_mem: Tensor, lam: Tensor, gold: Tensor, is_domain: Tensor, alpha_s: float = 0.1
) -> Tensor:
    """Eq 4: batch mean of ``−log p_fused(gold) + α_s·s_t·λ_t``, s_t = −1 on domain rows, +1 on general.

    α_s is ours (the report gives none).
    """
    p = fuse(p_base.detach(), p_mem.detach(), lam)
    nll = -torch.log(p.gather(-1, gold.unsqueeze(-1).to(torch.int64)).squeeze(-1).clamp(min=1e-12))
    s = torch.where(is_domain.bool(), -1.0, 1.0).to(lam.dtype)
    return (nll + alpha_s * s * lam).mean()
