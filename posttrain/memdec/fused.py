"""Fused decoding (Eq 3): ``p = (1−λ_t)·p_base + λ_t·p_mem`` with λ_t from the router, in a generate loop that
keeps both models' KV caches; plus base-only decoding and kNN-LM decoding (a live datastore lookup per token, the
cost Memory Decoder exists to avoid) for the benchmark. Batch size 1 per sequence in these loops (the reference
path on CPU). ``FusedLM`` packs base + memory + router as one causal LM, which is how the RL engine decodes with
Eq 3 (``HFEngine(FusedLM(...))``, option ``memdec`` of ``scifolio posttrain rl``).

    python benchmarks/memdec.py --keys 1000000
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from formats import fs
from posttrain.objectives.memory_decoder import Router, RouterConfig, fuse


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


class FusedLM(torch.nn.Module):
    """Base + memory + router as ONE causal LM, so any engine that drives a Hugging Face model with a KV cache
    decodes with Eq 3 (``HFEngine(FusedLM(base, memory, router))``: ``scifolio posttrain rl --set memdec.memory=M
    --set memdec.router=R``). Its "logits" are ``log p_fused`` (so ``log_softmax`` of them at temperature 1 is
    ``log p_fused`` itself, and the engine's behaviour logprobs are the fused model's); the cache it takes and
    returns is the base's layers followed by the memory's, so the engine pads, crops and splits it per layer as
    it does any model's. Weight updates (``load_state_dict``) go to the base: the memory and the router stay
    frozen, as in Eq 3, while RL trains the base policy (the learner re-scores with the base alone, and the
    importance ratio of Eq 29 accounts for the difference).
    """

    def __init__(self, base, memory, router: Router) -> None:
        super().__init__()
        if base.config.vocab_size != memory.config.vocab_size:
            raise ValueError(
                f"base and memory vocabularies differ ({base.config.vocab_size} vs {memory.config.vocab_size})"
            )
        self.base, self.memory, self.router = base.eval(), memory.eval(), router.eval()
        self.n_base_layers = base.config.num_hidden_layers
        # The engine builds its cache from ``self.config``: one layer entry per base layer, then per memory layer.
        self.config = copy.deepcopy(base.config)
        self.config.num_hidden_layers = base.config.num_hidden_layers + memory.config.num_hidden_layers
        if getattr(base.config, "layer_types", None) is not None:
            self.config.layer_types = [*base.config.layer_types, *memory.config.layer_types]
        self.lam_sum, self.lam_count = 0.0, 0
        """λ_t summed over the real (unpadded) positions computed since ``take_lambda_mean``."""

    def take_lambda_mean(self) -> float:
        """Mean λ_t over the positions computed since the last call (nan if none); resets the tally."""
        mean = self.lam_sum / self.lam_count if self.lam_count else float("nan")
        self.lam_sum, self.lam_count = 0.0, 0
        return mean

    def load_state_dict(self, state, strict: bool = True, assign: bool = False):  # noqa: ANN001, ANN201
        """The policy's weights (the base's parameter names) into the base."""
        return self.base.load_state_dict(state, strict=strict, assign=assign)

    def forward(self, input_ids: Tensor, attention_mask=None, position_ids=None, cache=None, use_cache=True, **_):  # noqa: ANN001, ANN201
        from types import SimpleNamespace

        from posttrain.rollout.engines.hf import cache_of

        kv = [] if cache is None or cache.get_seq_length() == 0 else [(la.keys, la.values) for la in cache.layers]
        kw = {"attention_mask": attention_mask, "position_ids": position_ids, "use_cache": True}
        ob, om = (
            model(input_ids=input_ids, cache=cache_of(model.config, part), output_hidden_states=True, **kw)
            for model, part in ((self.base, kv[: self.n_base_layers]), (self.memory, kv[self.n_base_layers :]))
        )
        shape = ob.logits.shape
        p_base = torch.softmax(ob.logits.float(), -1).reshape(-1, shape[-1])
        p_mem = torch.softmax(om.logits.float(), -1).reshape(-1, shape[-1])
        hb = ob.hidden_states[-1].float().reshape(p_base.shape[0], -1)
        hm = om.hidden_states[-1].float().reshape(p_base.shape[0], -1)
        lam = self.router(hb, hm, p_base, p_mem)
        p = fuse(p_base, p_mem, lam).reshape(shape)
        real = lam.reshape(shape[:-1]).detach()
        if attention_mask is not None:  # left padding: only the positions of real tokens count
            real = real[attention_mask[:, -shape[1] :].bool()]
        self.lam_sum += float(real.sum())
        self.lam_count += real.numel()
        layers = [*ob.cache.layers, *om.cache.layers]
        return SimpleNamespace(logits=torch.log(p.clamp(min=1e-30)), cache=SimpleNamespace(layers=layers), lam=lam)


def save_router(router: Router, path: Path, config: RouterConfig) -> None:
    cfg = {"base_hidden": config.base_hidden, "memory_hidden": config.memory_hidden, "width": config.width}
    with fs.open_output(path) as f:
        torch.save({"state": router.state_dict(), "config": cfg}, f)


def load_router(path: Path) -> Router:
    blob = torch.load(path, weights_only=False)
    router = Router(RouterConfig(**blob["config"]))
    router.load_state_dict(blob["state"])
    return router.eval()
