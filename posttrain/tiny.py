"""Tiny random causal LMs for offline smoke runs of distillation, described here and written by the
project's one tiny-model writer (``scifolio models tiny DIR``; ``pipelines.tiny.write_area(DIR, "posttrain")``).

A student and two domain teachers (reasoning, agentic), built from a config with random weights over a
tokenizer with a tool-rendering chat template (saved beside each model): nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

NAMES = ("student", "teacher-reasoning", "teacher-agentic")


def causal_lm(vocab_size: int = 1024, hidden_size: int = 64) -> Any:
    """A 2-layer Qwen2 causal LM with random weights."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config).float().eval()


def build_tiny_causal_lm(vocab_size: int = 1024, hidden_size: int = 64, seed: int = 0) -> Any:
    """The same 2-layer Qwen2 causal LM in memory, seeded here (fp32, eval mode)."""
    import torch

    torch.manual_seed(seed)
    return causal_lm(vocab_size, hidden_size)


def tiny_models(kit: Any) -> dict[str, tuple[str, Callable[[], list[Any]]]]:
    """Student and teachers under ``DIR/posttrain-<name>``."""

    def build() -> list[Any]:
        # the agentic tokenizer: byte-level BPE + a chat template that renders tool calls, so the student can be
        # served by `scifolio posttrain gateway`; teachers share the student's vocabulary (distillation needs it)
        from posttrain.agentic.tiny import build_tokenizer

        tok = build_tokenizer(1024)
        return [causal_lm(vocab_size=len(tok)), tok]

    return {name: (f"posttrain-{name}", build) for name in NAMES}
