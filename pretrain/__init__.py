"""Visual pre-training: shard stream (data), frozen-encoder model, Eq 5–9 objective, DeepSpeed loop (train).

scifolio pretrain --config debug --shards out/shards --models tiny --max-steps 50
"""

from __future__ import annotations

from pathlib import Path


def write_tiny_pretrain(out_dir: Path) -> dict[str, str]:
    """Tiny random LM (+ tokenizer) and vision tower for offline runs; see :mod:`pretrain.tiny`."""
    from pretrain.tiny import write_tiny_pretrain as write

    return write(Path(out_dir))
