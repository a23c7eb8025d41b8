"""CLIP-style embedders: images and texts into one L2-normalised float32 space.

Any sentence-transformers model that encodes both modalities works (a hub name such as
``sentence-transformers/clip-ViT-B-32`` where a hub is reachable, or a local path such as the tiny model
written by ``scifolio models tiny DIR``). The dimension is read from the model, never configured twice.

``STEmbedder`` has the shape of Beam's ``ModelHandler``: ``load() -> model`` once per worker (``DoFn.setup``,
service start), then ``run_batch(images, model)`` / ``run_batch_texts(texts, model)``. Callers that want one
object with ``dim`` + ``encode_*`` (the searcher) wrap the pair in ``LoadedEmbedder``.

    python -c "from retrieval.embed import *; h = STEmbedder(EmbedConfig('tiny/retrieval/clip')); m = h.load(); \
print(h.dim(m), h.run_batch_texts(['a phase diagram'], m).shape)"
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

ImageLike = Any  # bytes (PNG/JPEG) or a PIL.Image.Image


@dataclass(frozen=True)
class EmbedConfig:
    model: str
    """Hub name or local directory of a sentence-transformers model that encodes images and text."""
    batch_size: int = 32
    """Images/texts per forward pass; the caller may pass more, they are split."""
    device: str = "cpu"
    """torch device string; ``cuda`` on a GPU worker."""


class Embedder(Protocol):
    """What the searcher needs from a loaded embedder: ``LoadedEmbedder`` (handler + model) implements it, and so
    does the tests' hash fake. The ingest job uses the handler itself (``load`` in setup, ``run_batch`` per batch)."""

    @property
    def dim(self) -> int: ...

    def encode_images(self, images: Sequence[ImageLike]) -> np.ndarray: ...

    def encode_texts(self, texts: Sequence[str]) -> np.ndarray: ...


def l2_normalize(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Rows scaled to unit L2 norm, float32 (inner product then equals cosine similarity)."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 1:
        x = x[None, :]
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.maximum(norms, eps)).astype(np.float32)


def to_pil(image: ImageLike):
    """Decode bytes to an RGB PIL image (CLIP processors expect 3 channels; crops may be L/LA/RGBA)."""
    from PIL import Image

    if isinstance(image, (bytes, bytearray, memoryview)):
        image = Image.open(io.BytesIO(bytes(image)))
        image.load()
    return image.convert("RGB") if image.mode != "RGB" else image


class STEmbedder:
    """Handler for a sentence-transformers image+text model: ``load()`` returns the ``SentenceTransformer``;
    ``run_batch``/``run_batch_texts`` encode with the model they are given (no state of their own)."""

    def __init__(self, config: EmbedConfig):
        self.config = config

    def load(self) -> Any:
        """The ``SentenceTransformer`` in eval mode on ``config.device`` (heavy: once per worker)."""
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(self.config.model, device=self.config.device)
        model.eval()
        return model

    def _check(self, model: Any) -> Any:
        if model is None:
            raise RuntimeError("STEmbedder: pass the model returned by load()")
        return model

    def dim(self, model: Any) -> int:
        """Embedding dimension, as the loaded model reports it."""
        dim = self._check(model).get_embedding_dimension()
        if not dim:
            raise ValueError(f"model {self.config.model!r} does not report an embedding dimension")
        return int(dim)

    def _encode(self, items: list, model: Any) -> np.ndarray:
        import torch

        model = self._check(model)
        if not items:
            return np.zeros((0, self.dim(model)), dtype=np.float32)
        with torch.inference_mode():
            out = model.encode(items, batch_size=self.config.batch_size, convert_to_numpy=True, show_progress_bar=False)
        # Normalise ourselves: not every checkpoint ends in a Normalize module, and IP search needs unit norm.
        return l2_normalize(out)

    def run_batch(self, images: Sequence[ImageLike], model: Any) -> np.ndarray:
        """Images (bytes or PIL) → unit-norm float32 [N, D]."""
        return self._encode([to_pil(im) for im in images], model)

    def run_batch_texts(self, texts: Sequence[str], model: Any) -> np.ndarray:
        """Texts → unit-norm float32 [N, D], in the same space as the images."""
        return self._encode([str(t) for t in texts], model)


@dataclass(frozen=True)
class LoadedEmbedder:
    """The ``Embedder`` protocol over a handler and the model its ``load()`` returned (the one adapter)."""

    handler: STEmbedder
    model: Any

    @classmethod
    def load(cls, handler: STEmbedder) -> LoadedEmbedder:
        return cls(handler, handler.load())

    @property
    def dim(self) -> int:
        return self.handler.dim(self.model)

    def encode_images(self, images: Sequence[ImageLike]) -> np.ndarray:
        return self.handler.run_batch(images, self.model)

    def encode_texts(self, texts: Sequence[str]) -> np.ndarray:
        return self.handler.run_batch_texts(texts, self.model)
