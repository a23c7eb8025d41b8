"""CLIP-style embedders: images and texts into one L2-normalised float32 space.

Any sentence-transformers model that encodes both modalities works (a hub name such as
``sentence-transformers/clip-ViT-B-32`` where a hub is reachable, or a local path such as the tiny model
written by ``scifolio models tiny DIR``). The dimension is read from the model, never configured twice.

    python -c "from retrieval.embed import *; e = STEmbedder(EmbedConfig('tiny/retrieval/clip')); e.load(); print(e.dim)"
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
    """What the index, the search and the ingest job need from an embedder."""

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
    """sentence-transformers image+text model behind the ``Embedder`` protocol (load once, then encode)."""

    def __init__(self, config: EmbedConfig):
        self.config = config
        self._model = None

    def load(self) -> STEmbedder:
        from sentence_transformers import SentenceTransformer

        self._model = SentenceTransformer(self.config.model, device=self.config.device)
        self._model.eval()
        return self

    @property
    def model(self):
        if self._model is None:
            raise RuntimeError("STEmbedder.load() must be called before encoding")
        return self._model

    @property
    def dim(self) -> int:
        dim = self.model.get_embedding_dimension()
        if not dim:
            raise ValueError(f"model {self.config.model!r} does not report an embedding dimension")
        return int(dim)

    def _encode(self, items: list) -> np.ndarray:
        import torch

        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        with torch.inference_mode():
            out = self.model.encode(
                items, batch_size=self.config.batch_size, convert_to_numpy=True, show_progress_bar=False
            )
        # Normalise ourselves: not every checkpoint ends in a Normalize module, and IP search needs unit norm.
        return l2_normalize(out)

    def encode_images(self, images: Sequence[ImageLike]) -> np.ndarray:
        return self._encode([to_pil(im) for im in images])

    def encode_texts(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode([str(t) for t in texts])

    # Beam ModelHandler-style aliases, so adapters can treat it like any other stage model.
    def run_batch(self, images: Sequence[ImageLike]) -> np.ndarray:
        return self.encode_images(images)
