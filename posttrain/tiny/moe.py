"""A tiny random Mixture-of-Experts causal LM (Qwen2-MoE: 4 experts, top-2) for R3 tests and smoke runs.

Built from a config, nothing downloaded. ``norm_topk_prob=True`` (the gate weights of the k chosen experts are
renormalised to sum to 1, as Mixtral and Qwen3-MoE do), a larger ``initializer_range`` than the library default
so that the experts (and so the routing) visibly change the logits of a 2-layer toy model, fp32, eager attention.

    python -c "from posttrain.tiny.moe import build_tiny_moe_lm; print(build_tiny_moe_lm())"
"""

from __future__ import annotations


def tiny_moe_config(
    vocab_size: int = 128,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_experts: int = 4,
    top_k: int = 2,
    initializer_range: float = 0.2,
):
    from transformers import Qwen2MoeConfig

    return Qwen2MoeConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        moe_intermediate_size=hidden_size,
        shared_expert_intermediate_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=num_experts,
        num_experts_per_tok=top_k,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        max_position_embeddings=512,
        initializer_range=initializer_range,
        tie_word_embeddings=True,
        attn_implementation="eager",
    )


def build_tiny_moe_lm(seed: int = 0, **config_kwargs):
    """A fresh ``Qwen2MoeForCausalLM`` in fp32, eval mode, weights drawn from ``seed``."""
    import torch
    from transformers import Qwen2MoeForCausalLM

    torch.manual_seed(seed)
    return Qwen2MoeForCausalLM(tiny_moe_config(**config_kwargs)).float().eval()
