"""A speculative draft that reads the policy's own features (EAGLE-style; SPEC §C4 trains it, Eq 22–24).

Draft position j takes token x_j's embedding (the policy's, shared, not trained) and the policy's feature at j−1
(its last hidden state after the final norm: what the policy's head reads), mixes them with one linear layer, runs
ONE decoder block of the policy's class (initialised from the policy's first block) and a copy of the final norm,
and predicts x_{j+1} from that feature f̂_j with a head over a token subset (``SubsetHead``). In a verification round
the first draft token reads the policy's true feature; later ones read the draft's own f̂ (the policy has not seen
those tokens yet). ``SpeculativeEngine`` hands the true features of every verified position to the draft (a forward
hook on the policy's final norm), so the draft's cache holds true-feature positions only.

Training (``DraftTrainer`` with a draft whose ``reads_features`` is set) runs two passes: pass 1 on the policy's
features (draft position 0 of a round), pass 2 on the draft's own pass-1 features with pass 1's keys as context
(positions ≥ 1), plus a 0.1-weighted smooth-L1 pull of f̂ towards the policy's features.

    from posttrain.rollout.engines.feature_draft import FeatureDraft
    draft = FeatureDraft(policy, vocab_ids); SpeculativeEngine(policy, draft, k=2)

Measured on SmolLM2-135M-Instruct against the 2-block early exit: ``benchmarks/specdec.py --model DIR --draft
features`` (benchmarks/RESULTS.md). Tests: ``python -m pytest tests/posttrain/rollout/test_speculative_engine.py -q``
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

KV = list[tuple[Tensor, Tensor]]


class SubsetHead(torch.nn.Module):
    """A draft's output head over a token subset S of the policy's vocabulary: logits ``h·W_S^T`` for S and a
    constant −1e4 elsewhere (q = 0 there in float64; finite, so the KL term of the draft loss stays defined). The
    draft then never proposes a token outside S; the policy's residual ``max(0, p − q)`` emits those, so sampling
    stays lossless. Costs ``|S|·d`` MACs a token instead of ``V·d`` (SmolLM2: 49,152 × 576 = 28M). The printed draft
    loss then carries a constant ≈ λ·(policy mass outside S)·1e4 (large numbers); its gradient is the full-vocabulary
    one."""

    def __init__(self, weight: Tensor, ids: Tensor, vocab: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight.detach().clone())
        self.register_buffer("ids", ids.clone())
        self.vocab = vocab

    def forward(self, h: Tensor) -> Tensor:
        z = h @ self.weight.t()
        out = z.new_full((*h.shape[:-1], self.vocab), -1e4)
        return out.index_copy(-1, self.ids, z)


class FeatureDraft(torch.nn.Module):
    """Token embedding + the policy's previous feature → one block → the next token (float32, trainable but the
    embedding). ``vocab_ids``: the head's token subset (None: the whole vocabulary)."""

    reads_features = True

    def __init__(self, policy: torch.nn.Module, vocab_ids: Tensor | None = None) -> None:
        super().__init__()
        base, cfg = policy.base_model, policy.config
        d, vocab = cfg.hidden_size, cfg.vocab_size
        self.config = cfg
        self.fc = torch.nn.Linear(2 * d, d, bias=False)
        with torch.no_grad():  # starts as "the token's embedding", the feature's part small
            self.fc.weight.zero_()
            self.fc.weight[:, :d].copy_(torch.eye(d))
            self.fc.weight[:, d:].normal_(0.0, 0.02)
        self.block = type(base.layers[0])(cfg, 0)
        self.block.load_state_dict(base.layers[0].state_dict())
        self.norm = copy.deepcopy(base.norm)
        self.rope = type(base.rotary_emb)(config=cfg)
        ids = torch.arange(vocab) if vocab_ids is None else vocab_ids
        self.head = SubsetHead(policy.get_output_embeddings().weight[ids], ids, vocab)
        self.float()
        # the policy's own tensor, in its dtype (a weight sync to the policy updates it too); not the draft's state
        self.register_buffer("embed", policy.get_input_embeddings().weight.detach(), persistent=False)

    def _attend(self, x: Tensor, pos: Tensor, past: tuple[Tensor, Tensor] | None, allowed: Tensor) -> tuple:
        """The block on inputs ``x`` ``[B, T, d]`` at positions ``pos`` over the cached keys ``past`` (pre-repeat,
        ``[B, H_kv, L, D]``) and its own; ``allowed`` ``[B, 1, T, L + T]``: (f̂ ``[B, T, d]``, the keys and values of
        all L + T positions)."""
        a, (b, t, _) = self.block.self_attn, x.shape
        h = self.block.input_layernorm(x)
        q, k, v = (p(h).view(b, t, -1, a.head_dim).transpose(1, 2) for p in (a.q_proj, a.k_proj, a.v_proj))
        q, k = apply_rotary_pos_emb(q, k, *self.rope(v, pos))
        keys, vals = (k, v) if past is None else (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2))
        n = a.num_key_value_groups
        o = F.scaled_dot_product_attention(q, repeat_kv(keys, n), repeat_kv(vals, n), attn_mask=allowed)
        x = x + a.o_proj(o.transpose(1, 2).reshape(b, t, -1))
        m = self.block.mlp(self.block.post_attention_layernorm(x))
        x = x + (m[0] if isinstance(m, tuple) else m)  # an MoE block also returns its router logits
        return self.norm(x), (keys, vals)

    def _mix(self, ids: Tensor, feats: Tensor) -> Tensor:
        return self.fc(torch.cat([self.embed[ids].float(), feats.float()], -1))

    def step(
        self, ids: Tensor, feats: Tensor, kv: KV | None, mask: Tensor | None = None, pos: Tensor | None = None
    ) -> tuple[Tensor, Tensor, KV]:
        """Decode: tokens ``ids`` ``[B, T]`` with the features of the positions before them ``feats`` ``[B, T, d]``
        after the cache ``kv`` (``[(keys, values)]``; None or ``[]``: empty) under the engine's left-pad ``mask``
        ``[B, L + T]`` (None: no padding) at ``pos`` (None: ``L …``): (logits ``[B, T, V]``, f̂ ``[B, T, d]``, cache)."""
        b, t = ids.shape
        past = kv[0] if kv else None
        n_past = 0 if past is None else past[0].shape[2]
        if pos is None:
            pos = torch.arange(n_past, n_past + t).expand(b, t)
        allowed = torch.ones(t, n_past + t, dtype=torch.bool).tril(n_past)[None, None]
        if mask is not None:
            allowed = allowed & mask.bool()[:, None, None, :]
        f, kv_all = self._attend(self._mix(ids, feats), pos, past, allowed)
        return self.head(f), f, [kv_all]

    def train_forward(self, ids: Tensor, feats: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Training on right-padded rows: (pass-1 logits, pass-2 logits, the feature pull). Pass 1 reads the policy's
        features ``feats`` of the previous positions (a round's first draft token); pass 2 reads pass 1's own f̂ there,
        attending to pass 1's keys before it and to itself (a round's later draft tokens, exactly for the second)."""
        b, t = ids.shape
        pos = torch.arange(t).expand(b, t)
        pad = mask.bool()[:, None, None, :]
        shift = lambda f: torch.cat([torch.zeros_like(f[:, :1]), f[:, :-1]], 1)  # noqa: E731
        causal = torch.ones(t, t, dtype=torch.bool)
        f1, (k1, v1) = self._attend(self._mix(ids, shift(feats)), pos, None, causal.tril()[None, None] & pad)
        x2 = self._mix(ids, shift(f1))
        allowed = torch.cat([causal.tril(-1)[None, None] & pad, torch.eye(t, dtype=torch.bool).expand(b, 1, t, t)], -1)
        f2, _ = self._attend(x2, pos, (k1, v1), allowed)
        m = mask.bool()
        pull = F.smooth_l1_loss(f1[m], feats[m].float())
        return self.head(f1), self.head(f2), pull
