"""Tiny random models for offline pre-training runs (``scifolio models tiny DIR`` calls this).

    scifolio models tiny tiny/          # writes tiny/tokenizer, then tiny/pretrain-lm with that tokenizer

Saved with ``save_pretrained`` so training loads them through the same ``from_pretrained(path)`` code a real
hub checkpoint goes through. The LM's vocabulary is the tokenizer it is given (saved beside the LM: the corpus
job's tokenizer), so shards tokenised with that tokenizer train on it.
"""

from __future__ import annotations

import json
from pathlib import Path

from pretrain.model import CLIP_MEAN, CLIP_STD


def write_tiny_pretrain(out_dir: Path, tokenizer: str | Path, seed: int = 0) -> dict[str, str]:
    """Write ``pretrain-lm`` (Llama, 2 layers, d=64, + ``tokenizer``, a Hugging Face tokenizer path or name) and
    ``pretrain-vision`` (CLIP tower, patch 8)."""
    import torch
    from transformers import AutoTokenizer, CLIPVisionConfig, CLIPVisionModel, LlamaConfig, LlamaForCausalLM

    out_dir = Path(out_dir)
    lm_dir, vis_dir = out_dir / "pretrain-lm", out_dir / "pretrain-vision"
    tok = AutoTokenizer.from_pretrained(tokenizer)
    tok.save_pretrained(lm_dir)
    torch.manual_seed(seed)
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
    LlamaForCausalLM(lm_cfg).save_pretrained(lm_dir)
    torch.manual_seed(seed + 1)
    vis_cfg = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=64,
        patch_size=8,
        projection_dim=32,
    )
    CLIPVisionModel(vis_cfg).save_pretrained(vis_dir)
    # What the data side needs to normalise pixels for this tower (the format a CLIPImageProcessor saves).
    (vis_dir / "preprocessor_config.json").write_text(
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
    return {"pretrain-lm": str(lm_dir), "pretrain-vision": str(vis_dir)}
