"""Tiny random vision-language models for offline smoke runs and tests, described here and written by the
project's one tiny-model writer (``scifolio models tiny DIR``; ``pipelines.tiny.write_area(DIR, "visual_gain")``).

The weights are random: scores from these models exercise the whole path (tokenise, interleave crops,
two passes, thresholds) but mean nothing. Real scores need a real VLM (README: Qwen2-VL-2B-Instruct).
Each directory loads through the scorer's ordinary ``from_pretrained(path)`` path: config + weights,
a byte-level BPE tokenizer with the family's special tokens, and the family's image processor (PIL
backend; no torchvision needed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

QWEN_SPECIALS = ("<|endoftext|>", "<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>")
LLAVA_SPECIALS = ("<|endoftext|>", "<image>")

# A small scientific-sounding corpus so the BPE merges are words of the domain, not noise.
_WORDS = (
    "the protein binds a ligand in the cell membrane and the enzyme catalyses the reaction of the substrate "
    "figure shows the crystal structure of the alloy with grain boundaries and lattice strain measured by "
    "diffraction the spectrum of the compound has peaks at wavelength nm the yield of the synthesis was "
    "percent table lists the mean and standard deviation of samples equation gives the energy of the state "
    "gene expression in mice was measured with sequencing the catalyst surface area and porosity increased"
).split()


def _corpus(n_lines: int = 400) -> list[str]:
    import random

    rng = random.Random(0)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(6, 20))) + "." for _ in range(n_lines)]


def corpus() -> list[str]:
    """The lines the VLM tokenizers are trained on."""
    return _corpus()


def qwen2_vl(kit: Any, hidden_size: int = 32, layers: int = 2) -> list[Any]:
    """A random Qwen2-VL (M-RoPE, dynamic-resolution vision tower) small enough for unit tests."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tok = kit.bpe(QWEN_SPECIALS, 512, corpus())
    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN_SPECIALS}
    heads = 4
    half = hidden_size // heads // 2  # M-RoPE splits each head's rotary half into (t, h, w) sections
    section = [half // 4, half // 4, half - 2 * (half // 4)]
    config = Qwen2VLConfig(
        text_config=dict(
            vocab_size=len(tok),
            hidden_size=hidden_size,
            intermediate_size=2 * hidden_size,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=2,
            max_position_embeddings=32768,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section},
            bos_token_id=ids["<|endoftext|>"],
            eos_token_id=ids["<|endoftext|>"],
            pad_token_id=ids["<|endoftext|>"],
        ),
        vision_config=dict(
            depth=1,
            embed_dim=16,
            hidden_size=hidden_size,
            num_heads=2,
            mlp_ratio=2,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            in_channels=3,
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|endoftext|>"],
    )
    model = Qwen2VLForConditionalGeneration(config).eval()
    # at most 16 merged image tokens per crop keeps tests fast; real checkpoints use the processor default
    return [model, tok, Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=28 * 28 * 16)]


def llava(kit: Any, hidden_size: int = 32, layers: int = 2) -> list[Any]:
    """A random LLaVA (CLIP vision tower, Llama decoder), 16 image tokens per crop."""
    from transformers import LlavaConfig, LlavaForConditionalGeneration
    from transformers.models.llava.image_processing_pil_llava import LlavaImageProcessorPil

    tok = kit.bpe(LLAVA_SPECIALS, 512, corpus())
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    config = LlavaConfig(
        vision_config=dict(
            model_type="clip_vision_model",
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=28,
            patch_size=7,
        ),
        text_config=dict(
            model_type="llama",
            vocab_size=len(tok),
            hidden_size=hidden_size,
            intermediate_size=2 * hidden_size,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            bos_token_id=eos,
            eos_token_id=eos,
            pad_token_id=eos,
        ),
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
    )
    model = LlavaForConditionalGeneration(config).eval()
    return [model, tok, LlavaImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})]


def qwen2_5_vl(kit: Any, hidden_size: int = 32, layers: int = 2) -> list[Any]:
    """A random Qwen2.5-VL (windowed-attention vision tower); same tokens and processor as Qwen2-VL."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tok = kit.bpe(QWEN_SPECIALS, 512, corpus())
    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN_SPECIALS}
    heads = 4
    half = hidden_size // heads // 2
    section = [half // 4, half // 4, half - 2 * (half // 4)]
    eos = ids["<|endoftext|>"]
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(tok),
            hidden_size=hidden_size,
            intermediate_size=2 * hidden_size,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=2,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section},
            bos_token_id=eos,
            eos_token_id=eos,
            pad_token_id=eos,
        ),
        vision_config=dict(
            depth=1,
            hidden_size=16,
            out_hidden_size=hidden_size,
            intermediate_size=32,
            num_heads=2,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=56,
            fullatt_block_indexes=[0],
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        bos_token_id=eos,
        eos_token_id=eos,
    )
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    return [model, tok, Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=28 * 28 * 16)]


def tiny_models(kit: Any) -> dict[str, tuple[str, Callable[[], list[Any]]]]:
    """name → (subdir, builder); pass a directory to ``--visual-gain-model``."""
    return {
        "visual_gain_vlm": ("visual_gain_qwen2_vl", lambda: qwen2_vl(kit)),
        "visual_gain_vlm_qwen2_5": ("visual_gain_qwen2_5_vl", lambda: qwen2_5_vl(kit)),
        "visual_gain_vlm_llava": ("visual_gain_llava", lambda: llava(kit)),
    }
