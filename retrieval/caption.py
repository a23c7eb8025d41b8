"""Captioner: Hugging Face image-to-text model (VisionEncoderDecoder, BLIP, …) used at query time for image
queries (image → caption → text vector) and optionally at ingest to store captions.

``Captioner`` has the shape of Beam's ``ModelHandler``: ``load() -> CaptionModel`` once per worker,
``run_batch(images, model) -> captions``.

    python -c "from retrieval.caption import *; c = Captioner(CaptionConfig('tiny/retrieval/captioner')); \
m = c.load(); print(c.run_batch([open('fig.png','rb').read()], m))"
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from retrieval.embed import ImageLike, to_pil


@dataclass(frozen=True)
class CaptionConfig:
    model: str
    """Hub name or local directory of an image-to-text model (``AutoModelForImageTextToText``)."""
    max_new_tokens: int = 32
    """Caption length cap; captions only feed a text embedding and a reranker, short is enough."""
    batch_size: int = 8
    """Images per generate() call."""
    device: str = "cpu"
    """torch device string."""
    prompt: str | None = None
    """Optional text prompt for conditional captioners (BLIP: ``"a figure of"``); None for plain ones."""


@dataclass(frozen=True)
class CaptionModel:
    """What ``Captioner.load()`` returns and ``run_batch`` consumes."""

    model: Any
    """The ``AutoModelForImageTextToText`` in eval mode on the configured device."""
    processor: Any
    """Multimodal processor (BLIP, VLMs: images + prompt) or a bare image processor (VisionEncoderDecoder)."""
    tokenizer: Any
    """Decodes generated ids (the processor's own tokenizer when it has one)."""


class Captioner:
    """Handler: ``load()`` once (in DoFn.setup / at service start), then ``run_batch(images, model) -> captions``."""

    def __init__(self, config: CaptionConfig):
        self.config = config

    def load(self) -> CaptionModel:
        from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

        model = AutoModelForImageTextToText.from_pretrained(self.config.model).to(self.config.device).eval()
        try:
            # Multimodal processors (BLIP, VLMs) bundle image processor + tokenizer and handle prompts.
            processor = AutoProcessor.from_pretrained(self.config.model)
            if not hasattr(processor, "tokenizer"):
                raise TypeError("not a multimodal processor")
            tokenizer = processor.tokenizer
        except (OSError, ValueError, TypeError, KeyError):
            # VisionEncoderDecoder checkpoints ship an image processor and a tokenizer separately.
            processor = AutoImageProcessor.from_pretrained(self.config.model)
            tokenizer = AutoTokenizer.from_pretrained(self.config.model)
        return CaptionModel(model, processor, tokenizer)

    def run_batch(self, images: Sequence[ImageLike], model: CaptionModel) -> list[str]:
        import torch

        if model is None:
            raise RuntimeError("Captioner.run_batch: pass the model returned by load()")
        captions: list[str] = []
        step = self.config.batch_size
        for start in range(0, len(images), step):
            pil = [to_pil(im) for im in images[start : start + step]]
            if self.config.prompt is not None:
                inputs = model.processor(images=pil, text=[self.config.prompt] * len(pil), return_tensors="pt")
            else:
                inputs = model.processor(images=pil, return_tensors="pt")
            inputs = {k: v.to(self.config.device) for k, v in inputs.items()}
            with torch.inference_mode():
                out = model.model.generate(**inputs, max_new_tokens=self.config.max_new_tokens, do_sample=False)
            captions.extend(t.strip() for t in model.tokenizer.batch_decode(out, skip_special_tokens=True))
        return captions
