"""Queries against the sharded index: text → image, and image → image by the image vector **and** the vector
of a generated caption (visual and semantic neighbours), unioned; optional cross-encoder rerank.

    scifolio index query "stress-strain curve" --uri ./index.db --embed-model tiny/retrieval/clip --rerank
    scifolio index query --image fig.png --captioner tiny/retrieval/captioner --embed-model tiny/retrieval/clip
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from retrieval.caption import Captioner
from retrieval.embed import Embedder, ImageLike
from retrieval.index import Hit, ShardedIndex, merge_hits
from retrieval.rerank import Reranker, order_by_scores


@dataclass(frozen=True)
class SearchConfig:
    k: int = 10
    """Results returned."""
    candidates: int = 50
    """Candidates fetched (per query vector, per shard) before rerank; >= k. The reranker only reorders what
    retrieval found, so this bounds rerank recall."""
    store_quality: bool = True
    """Write reranker scores back to the index as quality scores (max over queries)."""


@dataclass(frozen=True)
class SearchResult:
    query: str  # the query text, or the generated caption for an image query
    hits: list[Hit]
    caption: str | None = None  # set for image queries

    def to_json(self) -> dict:
        return {"query": self.query, "caption": self.caption, "results": [h.to_json() for h in self.hits]}


class Searcher:
    """Binds an index, a loaded embedder, and optionally a captioner (image queries) and a reranker, each a
    handler with the model its ``load()`` returned."""

    def __init__(
        self,
        index: ShardedIndex,
        embedder: Embedder,
        captioner: Captioner | None = None,
        caption_model: Any = None,
        reranker: Reranker | None = None,
        rerank_model: Any = None,
        config: SearchConfig = SearchConfig(),
    ):
        if (captioner is None) != (caption_model is None) or (reranker is None) != (rerank_model is None):
            raise ValueError("a captioner/reranker handler comes with the model its load() returned")
        self.index = index
        self.embedder = embedder
        self.captioner = captioner
        self.caption_model = caption_model
        self.reranker = reranker
        self.rerank_model = rerank_model
        self.config = config

    def _finish(self, query: str, candidates: list[Hit], k: int, rerank: bool) -> list[Hit]:
        if not rerank:
            return candidates[:k]
        if self.reranker is None:
            raise ValueError("rerank requested but no reranker is configured (--reranker MODEL)")
        (scores,) = self.reranker.run_batch([self.reranker.item(query, candidates)], self.rerank_model)
        hits = order_by_scores(candidates, scores)
        if self.config.store_quality and hits:
            self.index.set_quality({h.sha256: h.score for h in hits})
        return hits[:k]

    def text(self, query: str, k: int | None = None, rerank: bool = False) -> SearchResult:
        k = k or self.config.k
        vec = self.embedder.encode_texts([query])
        n = max(k, self.config.candidates) if rerank else k
        candidates = self.index.search(vec, n, via="text")[0]
        return SearchResult(query=query, hits=self._finish(query, candidates, k, rerank))

    def texts(self, queries: Sequence[str], k: int | None = None) -> list[SearchResult]:
        """Batched text queries (one embedding pass, one fan-out), no rerank: the throughput path."""
        k = k or self.config.k
        vecs = self.embedder.encode_texts(list(queries))
        return [SearchResult(query=q, hits=h) for q, h in zip(queries, self.index.search(vecs, k, via="text"))]

    def image(self, image: ImageLike, k: int | None = None, rerank: bool = False) -> SearchResult:
        """Search with the image vector and with the caption's text vector, union (dedupe by sha256, best
        score kept, ``via`` records which vector found it). The caption is also the rerank query."""
        if self.captioner is None:
            raise ValueError("image queries need a captioner (--captioner MODEL)")
        k = k or self.config.k
        n = max(k, self.config.candidates) if rerank else k
        caption = self.captioner.run_batch([image], self.caption_model)[0]
        img_vec = self.embedder.encode_images([image])
        cap_vec = self.embedder.encode_texts([caption])
        by_image = self.index.search(img_vec, n, via="image")[0]
        by_caption = self.index.search(cap_vec, n, via="caption")[0]
        candidates = merge_hits([by_image, by_caption], 2 * n)
        return SearchResult(query=caption, caption=caption, hits=self._finish(caption, candidates, k, rerank))


def load_searcher(
    index: ShardedIndex,
    embed_model: str,
    caption_model: str | None = None,
    rerank_model: str | None = None,
    device: str = "cpu",
    config: SearchConfig = SearchConfig(),
) -> Searcher:
    """Load the models named and bind them to ``index`` (what the CLI and the service start from)."""
    from retrieval.caption import CaptionConfig
    from retrieval.embed import EmbedConfig, LoadedEmbedder, STEmbedder
    from retrieval.rerank import RerankConfig

    embedder = LoadedEmbedder.load(STEmbedder(EmbedConfig(embed_model, device=device)))
    if index.exists() and index.dim() != embedder.dim:
        raise ValueError(f"index holds {index.dim()}-d vectors but {embed_model!r} gives {embedder.dim}-d")
    captioner = Captioner(CaptionConfig(caption_model, device=device)) if caption_model else None
    reranker = Reranker(RerankConfig(rerank_model, device=device)) if rerank_model else None
    return Searcher(
        index,
        embedder,
        captioner,
        captioner.load() if captioner else None,
        reranker,
        reranker.load() if reranker else None,
        config,
    )
