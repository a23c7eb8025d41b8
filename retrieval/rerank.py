"""Reranker: a sentence-transformers CrossEncoder scores (query text, candidate caption/context) pairs; the score
in [0, 1] reorders the candidates and becomes the crop's quality score (stored back in the index).

    python -c "from retrieval.rerank import *; r = Reranker(RerankConfig('tiny/retrieval/reranker')).load(); \
print(r.score('a phase diagram', ['binary alloy phase diagram', 'author photo']))"
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from retrieval.index import Hit


@dataclass(frozen=True)
class RerankConfig:
    model: str
    """Hub name or local directory of a CrossEncoder (e.g. ``cross-encoder/ms-marco-MiniLM-L6-v2``)."""
    batch_size: int = 32
    """Pairs per forward pass."""
    device: str = "cpu"
    """torch device string."""
    max_chars: int = 1000
    """Candidate text cap; captions are short, context is cut so one long page cannot dominate the batch."""


def candidate_text(hit: Hit, max_chars: int = 1000) -> str:
    """What the reranker reads for a crop: its caption, then its surrounding text."""
    parts = [p for p in (hit.caption, hit.context) if p]
    return " | ".join(parts)[:max_chars]


def order_by_scores(hits: Sequence[Hit], scores: Sequence[float]) -> list[Hit]:
    """Hits with ``score`` and ``quality`` set to the reranker score, best first; ties keep retrieval order."""
    if len(hits) != len(scores):
        raise ValueError(f"{len(hits)} hits but {len(scores)} scores")
    rescored = [replace(h, score=float(s), quality=float(s)) for h, s in zip(hits, scores)]
    order = sorted(range(len(rescored)), key=lambda i: (-rescored[i].score, i))
    return [rescored[i] for i in order]


def to_unit_interval(logits: np.ndarray) -> np.ndarray:
    """Sigmoid, for cross-encoders whose head returns raw logits."""
    return 1.0 / (1.0 + np.exp(-np.asarray(logits, dtype=np.float64)))


class Reranker:
    """load() once, then score(query, texts) -> [0,1] scores, or rerank(query, hits)."""

    def __init__(self, config: RerankConfig):
        self.config = config
        self._model = None

    def load(self) -> Reranker:
        from sentence_transformers import CrossEncoder

        self._model = CrossEncoder(self.config.model, device=self.config.device)
        return self

    def score(self, query: str, texts: Sequence[str]) -> np.ndarray:
        import torch

        if self._model is None:
            raise RuntimeError("Reranker.load() must be called before scoring")
        if not texts:
            return np.zeros(0, dtype=np.float64)
        pairs = [(query, t) for t in texts]
        with torch.inference_mode():
            # Identity activation, then our own sigmoid: the [0,1] mapping must not depend on whichever
            # default activation a checkpoint's config happens to declare.
            logits = self._model.predict(
                pairs,
                batch_size=self.config.batch_size,
                activation_fn=torch.nn.Identity(),
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        logits = np.asarray(logits, dtype=np.float64)
        if logits.ndim == 2:  # multi-label heads: the last label is "relevant"
            logits = logits[:, -1]
        return to_unit_interval(logits)

    def rerank(self, query: str, hits: Sequence[Hit]) -> list[Hit]:
        texts = [candidate_text(h, self.config.max_chars) for h in hits]
        return order_by_scores(hits, self.score(query, texts))
