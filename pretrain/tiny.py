"""Tiny random models for offline pre-training runs, described here and written by the project's one
tiny-model writer (``pipelines/tiny.py``).

    scifolio models tiny tiny/          # writes tiny/tokenizer, then tiny/pretrain-lm with that tokenizer

Saved with ``save_pretrained`` so training loads them through the same ``from_pretrained(path)`` code a real
hub checkpoint goes through. The LM's vocabulary is the corpus tokenizer (``kit.tokenizer``, saved beside the
LM), so shards tokenised with that tokenizer train on it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pretrain.model import CLIP_MEAN, CLIP_STD


def lm(tok: Any) -> list[Any]:
    """Llama, 2 layers, d=64, over ``tok``'s vocabulary; saved with the tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    lm_cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    return [LlamaForCausalLM(lm_cfg), tok]


class _PreprocessorConfig:
    """What the data side needs to normalise pixels for the tower (the file a CLIPImageProcessor saves)."""

    def save_pretrained(self, path: str | Path) -> None:
        (Path(path) / "preprocessor_config.json").write_text(
            json.dumps(
                {
                    "image_processor_type": "CLIPImageProcessor",
                    "image_mean": list(CLIP_MEAN),
                    "image_std": list(CLIP_STD),
                    "size": {"shortest_edge": 64},
                    "crop_size": {"height": 64, "width": 64},
                },
                indent=2,
            )
        )


def vision() -> list[Any]:
    """A CLIP vision tower, patch 8, 64 px."""
    from transformers import CLIPVisionConfig, CLIPVisionModel

    vis_cfg = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=64,
        patch_size=8,
        projection_dim=32,
    )
    return [CLIPVisionModel(vis_cfg), _PreprocessorConfig()]


def tiny_models(kit: Any) -> dict[str, tuple[str, Callable[[], list[Any]]]]:
    """``pretrain-lm`` (with the corpus tokenizer) and ``pretrain-vision``: what ``--config debug`` loads."""
    return {"pretrain-lm": ("pretrain-lm", lambda: lm(kit.tokenizer)), "pretrain-vision": ("pretrain-vision", vision)}
