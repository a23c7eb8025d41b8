"""One interface over vision-language model families for the visual-gain scorer.

An adapter knows two things about its family: which tokens stand for an image in the token sequence
(``encode_image``) and how to run the decoder over a padded batch to its last hidden states
(``hidden_states``). Everything else (sequence building, windowing, batching, NLL) is family-free in
``scorer.py``. Families: Qwen2-VL / Qwen2.5-VL (dynamic resolution, M-RoPE) and LLaVA (fixed patch grid).

    python -m pytest tests/visual_gain/test_scorer.py -q
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class ImageInput:
    """One image ready for the model: the token ids it occupies and its per-image tensors."""

    placeholder_ids: tuple[int, ...]
    # family-specific tensors for this image alone (e.g. Qwen: pixel_values patches + image_grid_thw)
    tensors: dict[str, Any] = field(repr=False)


class VLMAdapter(Protocol):
    family: str
    # token ids that may appear only as image placeholders/markers; never scored
    image_token_ids: frozenset[int]

    def encode_image(self, png: bytes) -> ImageInput: ...

    def hidden_states(
        self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, images: list[ImageInput]
    ) -> torch.Tensor: ...


def _rgb(png: bytes) -> Any:
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        return im.convert("RGB")


class Qwen2VLAdapter:
    """Qwen2-VL and Qwen2.5-VL: ``<|vision_start|> <|image_pad|>×n <|vision_end|>`` per image.

    n = t·h·w / merge² from the image processor's grid. The forward needs ``mm_token_type_ids``
    (1 on image pads) so M-RoPE gives image tokens their 2-D positions.
    """

    family = "qwen2_vl"

    def __init__(self, config: Any, image_processor: Any, max_image_pixels: int | None = None) -> None:
        self.image_processor = image_processor
        self.image_token_id = int(config.image_token_id)
        self.vision_start_id = int(config.vision_start_token_id)
        self.vision_end_id = int(config.vision_end_token_id)
        self.merge = int(config.vision_config.spatial_merge_size)
        self.image_token_ids = frozenset({self.image_token_id, self.vision_start_id, self.vision_end_id})
        # Dynamic resolution: a big figure would otherwise cost thousands of tokens; cap it explicitly.
        self._kwargs: dict[str, Any] = {}
        if max_image_pixels:
            size = dict(getattr(image_processor, "size", None) or {})
            self._kwargs["size"] = {
                "shortest_edge": min(size.get("shortest_edge", 56 * 56), max_image_pixels),
                "longest_edge": max_image_pixels,
            }

    def encode_image(self, png: bytes) -> ImageInput:
        out = self.image_processor(images=[_rgb(png)], return_tensors="pt", **self._kwargs)
        grid = out["image_grid_thw"]
        n = int(grid.prod()) // (self.merge**2)
        ids = (self.vision_start_id, *([self.image_token_id] * n), self.vision_end_id)
        return ImageInput(ids, {"pixel_values": out["pixel_values"], "image_grid_thw": grid})

    def hidden_states(
        self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, images: list[ImageInput]
    ) -> torch.Tensor:
        import torch

        kwargs: dict[str, Any] = {}
        if images:
            dtype = model.model.visual.dtype
            kwargs["pixel_values"] = torch.cat([im.tensors["pixel_values"] for im in images]).to(
                input_ids.device, dtype
            )
            kwargs["image_grid_thw"] = torch.cat([im.tensors["image_grid_thw"] for im in images]).to(input_ids.device)
            kwargs["mm_token_type_ids"] = (input_ids == self.image_token_id).int()
        # The model caches rope deltas between calls (for generation); a scoring call must never reuse them.
        model.model.rope_deltas = None
        out = model.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs)
        return out.last_hidden_state


class LlavaAdapter:
    """LLaVA-style: a fixed number of ``<image>`` tokens per image (one per vision patch)."""

    family = "llava"

    def __init__(self, config: Any, image_processor: Any, max_image_pixels: int | None = None) -> None:
        del max_image_pixels  # fixed input size: the processor resizes every crop to the encoder's square
        self.image_processor = image_processor
        self.image_token_id = int(config.image_token_id)
        vc = config.vision_config
        n = (int(vc.image_size) // int(vc.patch_size)) ** 2
        if getattr(config, "vision_feature_select_strategy", "default") == "full":
            n += 1  # the CLS token is kept
        self.n_image_tokens = n
        self.image_token_ids = frozenset({self.image_token_id})

    def encode_image(self, png: bytes) -> ImageInput:
        out = self.image_processor(images=[_rgb(png)], return_tensors="pt")
        return ImageInput((self.image_token_id,) * self.n_image_tokens, {"pixel_values": out["pixel_values"]})

    def hidden_states(
        self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, images: list[ImageInput]
    ) -> torch.Tensor:
        import torch

        kwargs: dict[str, Any] = {}
        if images:
            pv = torch.cat([im.tensors["pixel_values"] for im in images])
            kwargs["pixel_values"] = pv.to(input_ids.device, model.dtype)
        out = model.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs)
        return out.last_hidden_state


ADAPTERS: dict[str, type] = {
    "qwen2_vl": Qwen2VLAdapter,
    "qwen2_5_vl": Qwen2VLAdapter,
    "llava": LlavaAdapter,
}


def adapter_for(config: Any, image_processor: Any, max_image_pixels: int | None = None) -> VLMAdapter:
    """The adapter for a loaded model config; a clear error for families not supported yet."""
    cls = ADAPTERS.get(config.model_type)
    if cls is None:
        raise ValueError(
            f"visual gain has no adapter for model_type={config.model_type!r}; supported: {sorted(ADAPTERS)}"
        )
    return cls(config, image_processor, max_image_pixels)
