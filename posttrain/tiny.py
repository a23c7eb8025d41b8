"""Tiny random causal LMs for offline smoke runs of distillation (``scifolio models tiny DIR``).

Writes a student and two domain teachers (reasoning, agentic) as Hugging Face ``save_pretrained``
directories built from a config with random weights: nothing is downloaded. No tokenizer is written;
pass ``vocab_size`` equal to the project's tiny tokenizer (pipelines/tiny.py, 1024 by default).

    python -c "from pathlib import Path; from posttrain.tiny import write_tiny_posttrain; \
print(write_tiny_posttrain(Path('/tmp/tiny')))"
"""

from __future__ import annotations

from pathlib import Path

NAMES = ("student", "teacher-reasoning", "teacher-agentic")


def write_tiny_causal_lm(out_dir: Path, vocab_size: int = 1024, hidden_size: int = 64, seed: int = 0) -> Path:
    """A 2-layer Qwen2 causal LM with random weights (distinct per seed)."""
    out_dir = Path(out_dir)
    build_tiny_causal_lm(vocab_size, hidden_size, seed).save_pretrained(out_dir)
    return out_dir


def build_tiny_causal_lm(vocab_size: int = 1024, hidden_size: int = 64, seed: int = 0):
    """The same 2-layer Qwen2 causal LM in memory (fp32, eval mode)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
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


def write_tiny_posttrain(out_dir: Path, vocab_size: int = 1024) -> dict[str, str]:
    """Student and teachers under ``out_dir/posttrain-<name>``; returns name → path."""
    return {
        name: str(write_tiny_causal_lm(Path(out_dir) / f"posttrain-{name}", vocab_size=vocab_size, seed=i))
        for i, name in enumerate(NAMES)
    }
