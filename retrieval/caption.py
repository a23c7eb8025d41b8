"""Captioner: Hugging Face image-to-text model (VisionEncoderDecoder, BLIP, …) used at query time for image
queries (image → caption → text vector) and optionally at ingest to store captions.

    python -c "from retrieval.caption import *; c = Captioner(CaptionConfig('tiny/retrieval/captioner')).load(); \
print(c.run_batch([open('fig.png','rb').read()]))"
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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


class Captioner:
    """load() once (in DoFn.setup / at service start), then run_batch(images) -> captions."""

    def __init__(self, config: CaptionConfig):
        self.config = config
        self._model = None
        self._processor = None
        self._tokenizer = None

    def load(self) -> Captioner:
        from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

        self._model = AutoModelForImageTextToText.from_pretrained(self.config.model).to(self.config.device).eval()
        try:
            # Multimodal processors (BLIP, VLMs) bundle image processor + tokenizer and handle prompts.
            self._processor = AutoProcessor.from_pretrained(self.config.model)
            if not hasattr(self._processor, "tokenizer"):
                raise TypeError("not a multimodal processor")
            self._tokenizer = self._processor.tokenizer
        except (OSError, ValueError, TypeError, KeyError):
            # VisionEncoderDecoder checkpoints ship an image processor and a tokenizer separately.
            self._processor = AutoImageProcessor.from_pretrained(self.config.model)
            self._tokenizer = AutoTokenizer.from_pretrained(self.config.model)
        return self

    def run_batch(self, images: Sequence[ImageLike]) -> list[str]:
        import torch

        if self._model is None:
            raise RuntimeError("Captioner.load() must be called before run_batch()")
        captions: list[str] = []
        step = self.config.batch_size
        for start in range(0, len(images), step):
            pil = [to_pil(im) for im in images[start : start + step]]
            if self.config.prompt is not None:
                inputs = self._processor(images=pil, text=[self.config.prompt] * len(pil), return_tensors="pt")
            else:
                inputs = self._processor(images=pil, return_tensors="pt")
            inputs = {k: v.to(self.config.device) for k, v in inputs.items()}
            with torch.inference_mode():
                out = self._model.generate(**inputs, max_new_tokens=self.config.max_new_tokens, do_sample=False)
            captions.extend(t.strip() for t in self._tokenizer.batch_decode(out, skip_special_tokens=True))
        return captions
