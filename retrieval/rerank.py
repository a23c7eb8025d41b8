"""Reranker: a sentence-transformers CrossEncoder scores (query text, candidate caption/context) pairs; the score
in [0, 1] reorders the candidates and becomes the crop's quality score (stored back in the index).

``Reranker`` has the shape of Beam's ``ModelHandler``: ``load()`` returns the ``CrossEncoder`` once per worker,
``run_batch(items, model)`` scores ``RerankItem(query, texts)`` items (one score array per item).

    python -c "from retrieval.rerank import *; r = Reranker(RerankConfig('tiny/retrieval/reranker')); m = r.load(); \
print(r.run_batch([RerankItem('a phase diagram', ('binary alloy phase diagram', 'author photo'))], m))"
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

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


class RerankItem(NamedTuple):
    """One query and the candidate texts to score against it (a plain ``(query, texts)`` pair works too)."""

    query: str
    texts: Sequence[str]


class Reranker:
    """Handler: ``load()`` returns the ``CrossEncoder``; ``run_batch(items, model)`` → per item, [0,1] scores."""

    def __init__(self, config: RerankConfig):
        self.config = config

    def load(self) -> Any:
        from sentence_transformers import CrossEncoder

        return CrossEncoder(self.config.model, device=self.config.device)

    def item(self, query: str, hits: Sequence[Hit]) -> RerankItem:
        """The item that scores ``hits`` for ``query`` (each hit read as its capped caption/context text)."""
        return RerankItem(query, tuple(candidate_text(h, self.config.max_chars) for h in hits))

    def run_batch(self, items: Sequence[RerankItem | tuple[str, Sequence[str]]], model: Any) -> list[np.ndarray]:
        """Scores in [0, 1] (float64), one array per item, aligned with its texts. Every pair of every item goes
        through one ``predict`` call (split in ``batch_size`` pairs)."""
        import torch

        if model is None:
            raise RuntimeError("Reranker.run_batch: pass the model returned by load()")
        items = [RerankItem(*it) for it in items]
        pairs = [(it.query, t) for it in items for t in it.texts]
        if not pairs:
            return [np.zeros(0, dtype=np.float64) for _ in items]
        with torch.inference_mode():
            # Identity activation, then our own sigmoid: the [0,1] mapping must not depend on whichever
            # default activation a checkpoint's config happens to declare.
            logits = model.predict(
                pairs,
                batch_size=self.config.batch_size,
                activation_fn=torch.nn.Identity(),
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        logits = np.asarray(logits, dtype=np.float64)
        if logits.ndim == 2:  # multi-label heads: the last label is "relevant"
            logits = logits[:, -1]
        scores = to_unit_interval(logits)
        bounds = np.cumsum([0] + [len(it.texts) for it in items])
        return [scores[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
