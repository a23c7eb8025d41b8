"""The tiny random causal LM the RL, agentic and distillation debug recipes build from a config (no download).

python -c "from posttrain.tiny.lm import build_tiny_causal_lm; print(build_tiny_causal_lm(64))"
"""

from __future__ import annotations

from typing import Any


def causal_lm(vocab_size: int = 1024, hidden_size: int = 64, layers: int = 2, **config: Any) -> Any:
    """A Qwen2 causal LM with random weights (2 layers, 4 heads, tied embeddings; ``config`` overrides or adds
    ``Qwen2Config`` fields, e.g. ``max_position_embeddings``, ``pad_token_id``), fp32, eval mode."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    fields = {
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "tie_word_embeddings": True,
        **config,
    }
    cfg = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        **fields,
    )
    return Qwen2ForCausalLM(cfg).float().eval()


def build_tiny_causal_lm(vocab_size: int = 1024, hidden_size: int = 64, seed: int = 0) -> Any:
    """The same 2-layer Qwen2 causal LM in memory, seeded here (fp32, eval mode)."""
    import torch

    torch.manual_seed(seed)
    return causal_lm(vocab_size, hidden_size)
