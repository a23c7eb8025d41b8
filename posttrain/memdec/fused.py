"""Fused decoding (Eq 3): ``p = (1−λ_t)·p_base + λ_t·p_mem`` with λ_t from the router, in a generate loop that
keeps both models' KV caches; plus base-only decoding and kNN-LM decoding (a live datastore lookup per token, the
cost Memory Decoder exists to avoid) for the benchmark. Batch size 1 per sequence here: the loops are the
reference path on CPU; an RL engine option (vLLM) is not part of this module.

    python benchmarks/memdec.py --keys 1000000
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from posttrain.memory_decoder import Router, fuse


@dataclass(frozen=True)
class Generation:
    """Generated tokens and, per step, the probability of the chosen token and λ (fused only)."""

    tokens: list[int]
    """New token ids (EOS included when it was produced)."""
    probs: list[float]
    """Probability the decoding distribution gave each chosen token."""
    lambdas: list[float]
    """λ_t per step (empty for base-only; the fixed λ for kNN-LM)."""


def _step(model, ids: Tensor, past):
    # transformers ≥ 5.2x names the KV cache ``cache`` (``past_key_values`` is deprecated, gone in 5.40).
    if "cache" in inspect.signature(model.forward).parameters:
        out = model(input_ids=ids, cache=past, use_cache=True, output_hidden_states=True)
        nxt = out.cache
    else:
        out = model(input_ids=ids, past_key_values=past, use_cache=True, output_hidden_states=True)
        nxt = out.past_key_values
    return out.logits[:, -1].float(), out.hidden_states[-1][:, -1].float(), nxt


def fused_step(base_logits: Tensor, mem_logits: Tensor, h_base: Tensor, h_mem: Tensor, router: Router):
    """One Eq 3 step: ``(p_fused [B, V], λ [B])`` from both models' last-position logits and hidden states."""
    p_base, p_mem = torch.softmax(base_logits, -1), torch.softmax(mem_logits, -1)
    lam = router(h_base, h_mem, p_base, p_mem)
    return fuse(p_base, p_mem, lam), lam


def _pick(p: Tensor, greedy: bool, gen: torch.Generator | None) -> int:
    return int(p.argmax(-1)) if greedy else int(torch.multinomial(p[0], 1, generator=gen))


@torch.no_grad()
def generate_fused(
    base,
    memory,
    router: Router,
    prompt: list[int],
    max_new_tokens: int,
    eos_id: int | None = None,
    greedy: bool = True,
    seed: int = 0,
) -> Generation:
    """Decode with Eq 3: both models advance one token per step on their own KV cache."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.tensor([prompt])
    lb, hb, past_b = _step(base, ids, None)
    lm, hm, past_m = _step(memory, ids, None)
    out = Generation([], [], [])
    for _ in range(max_new_tokens):
        p, lam = fused_step(lb, lm, hb, hm, router)
        tok = _pick(p, greedy, gen)
        out.tokens.append(tok)
        out.probs.append(float(p[0, tok]))
        out.lambdas.append(float(lam[0]))
        if tok == eos_id:
            break
        nxt = torch.tensor([[tok]])
        lb, hb, past_b = _step(base, nxt, past_b)
        lm, hm, past_m = _step(memory, nxt, past_m)
    return out


@torch.no_grad()
def generate_base(base, prompt: list[int], max_new_tokens: int, eos_id: int | None = None) -> Generation:
    """Greedy decoding with the base alone (the cost Memory Decoder is measured against)."""
    lb, _, past = _step(base, torch.tensor([prompt]), None)
    out = Generation([], [], [])
    for _ in range(max_new_tokens):
        p = torch.softmax(lb, -1)
        tok = int(p.argmax(-1))
        out.tokens.append(tok)
        out.probs.append(float(p[0, tok]))
        if tok == eos_id:
            break
        lb, _, past = _step(base, torch.tensor([[tok]]), past)
    return out


@torch.no_grad()
def generate_knn_lm(
    base, store, prompt: list[int], max_new_tokens: int, k: int, tau: float, lam: float, eos_id: int | None = None
) -> Generation:
    """kNN-LM: every step searches the datastore with the base's hidden state and interpolates Eq 1 with p_base at
    a fixed λ. ``store`` is a ``KeyValueStore`` (posttrain.memdec.datastore)."""
    from posttrain.memdec.datastore import knn_from_neighbours

    lb, hb, past = _step(base, torch.tensor([prompt]), None)
    vocab = lb.shape[-1]
    out = Generation([], [], [])
    for _ in range(max_new_tokens):
        nb = store.search(hb.numpy().astype(np.float32), k)
        p_knn = knn_from_neighbours(nb, vocab, tau).float()
        p = fuse(torch.softmax(lb, -1), p_knn, lam)
        tok = int(p.argmax(-1))
        out.tokens.append(tok)
        out.probs.append(float(p[0, tok]))
        out.lambdas.append(lam)
        if tok == eos_id:
            break
        lb, hb, past = _step(base, torch.tensor([[tok]]), past)
    return out
