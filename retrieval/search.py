"""Queries against the sharded index; optional cross-encoder rerank.

Text → crops through every channel the index holds (``retrieval.channels``): ``dense`` (sentence embedder over
the crops' channel text), ``bm25`` (Milvus BM25 over the same text) and ``clip`` (CLIP text vector against the
image vectors), fused by reciprocal rank fusion (k = 60): Milvus' ``hybrid_search`` in the one-collection layout,
the same rule client-side over a fan-out layout. Image → crops by the image vector and a generated caption (CLIP
text vector, and the text channels when the index has them), fused the same way; an image-only index (built
with ``--text-model none``) unions the two CLIP lists by best score as before.

    scifolio index query "stress-strain curve" --uri ./index.db --embed-model tiny/retrieval/clip --rerank
    scifolio index query --image fig.png --captioner tiny/retrieval/captioner --embed-model tiny/retrieval/clip
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from retrieval.caption import Captioner
from retrieval.channels import RRF_K, rrf
from retrieval.embed import Embedder, ImageLike
from retrieval.index import Hit, SchemaMismatch, ShardedIndex, merge_hits
from retrieval.rerank import Reranker, order_by_scores

TEXT_CHANNELS = ("dense", "bm25", "clip")  # fused for text queries, in this order


@dataclass(frozen=True)
class SearchConfig:
    k: int = 10
    """Results returned."""
    candidates: int = 50
    """Candidates fetched (per query vector, per shard) before rerank; >= k. The reranker only reorders what
    retrieval found, so this bounds rerank recall."""
    store_quality: bool = True
    """Write reranker scores back to the index as quality scores (max over queries)."""
    channel_candidates: int = 50
    """Hits each channel contributes to the fusion (>= k): a crop ranked below this in a channel gets no
    score from it."""


@dataclass(frozen=True)
class SearchResult:
    query: str  # the query text, or the generated caption for an image query
    hits: list[Hit]
    caption: str | None = None  # set for image queries
    channels: tuple[str, ...] = ()  # the ranked lists behind the hits (several: scores are RRF sums)
    reranked: bool = False  # scores are the reranker's

    def to_json(self) -> dict:
        return {
            "query": self.query,
            "caption": self.caption,
            "channels": list(self.channels),
            "reranked": self.reranked,
            "results": [h.to_json() for h in self.hits],
        }


class Searcher:
    """Binds an index, a loaded embedder, and optionally a captioner (image queries) and a reranker, each a
    handler with the model its ``load()`` returned."""

    def __init__(
        self,
        index: ShardedIndex,
        embedder: Embedder | None,
        captioner: Captioner | None = None,
        caption_model: Any = None,
        reranker: Reranker | None = None,
        rerank_model: Any = None,
        config: SearchConfig = SearchConfig(),
        text_embedder: Embedder | None = None,
    ):
        if (captioner is None) != (caption_model is None) or (reranker is None) != (rerank_model is None):
            raise ValueError("a captioner/reranker handler comes with the model its load() returned")
        if embedder is None and text_embedder is None:
            raise ValueError("a searcher needs a CLIP embedder, a text embedder, or both")
        self.index = index
        self.embedder = embedder
        self.text_embedder = text_embedder
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

    @property
    def channels(self) -> tuple[str, ...]:
        """The text-query channels this searcher and its index have."""
        text = self.index.has_text_channels()
        have = {"dense": text and self.text_embedder is not None, "bm25": text, "clip": self.embedder is not None}
        return tuple(c for c in TEXT_CHANNELS if have[c])

    def _queries(self, texts: Sequence[str], channels: Sequence[str]) -> dict[str, tuple[str, list]]:
        """channel → (field, one query per text): the embeddings of every text, computed once per model."""
        out: dict[str, tuple[str, list]] = {}
        for c in channels:
            if c not in self.channels:
                raise ValueError(f"channel {c!r} is not available here (have: {', '.join(self.channels)})")
            if c == "dense":
                out[c] = ("text_vector", list(self.text_embedder.encode_texts(list(texts))))
            elif c == "bm25":
                out[c] = ("sparse", list(texts))
            else:
                out[c] = ("vector", list(self.embedder.encode_texts(list(texts))))
        return out

    def _fuse(self, queries: dict[str, tuple[str, Any]], n: int) -> list[Hit]:
        """One query through its channels: a single channel's ranking as it is; several fused by RRF (k = 60),
        inside Milvus (``hybrid_search``) in the one-collection layout, client-side over fan-out collections."""
        cand = max(n, self.config.channel_candidates)
        if len(queries) == 1:
            ((name, (field, q)),) = queries.items()
            return self.index.search([q] if field == "sparse" else q, n, via=name, field=field)[0]
        if self.index.config.n_shards == 1:
            return self.index.hybrid(queries, n, cand, RRF_K)
        lists = {
            name: self.index.search([q] if field == "sparse" else q, cand, via=name, field=field)[0]
            for name, (field, q) in queries.items()
        }
        return rrf(lists, n)

    def text(
        self, query: str, k: int | None = None, rerank: bool = False, channels: Sequence[str] | None = None
    ) -> SearchResult:
        """Text → crops through ``channels`` (default: every channel available), fused when several."""
        k = k or self.config.k
        n = max(k, self.config.candidates) if rerank else k
        qs = self._queries([query], channels or self.channels)
        candidates = self._fuse({c: (f, v[0]) for c, (f, v) in qs.items()}, n)
        hits = self._finish(query, candidates, k, rerank)
        return SearchResult(query=query, hits=hits, channels=tuple(qs), reranked=rerank)

    def texts(
        self, queries: Sequence[str], k: int | None = None, channels: Sequence[str] | None = None
    ) -> list[SearchResult]:
        """Batched text queries (one embedding pass per model), no rerank: the throughput path."""
        k = k or self.config.k
        qs = self._queries(list(queries), channels or self.channels)
        return [
            SearchResult(query=q, hits=self._fuse({c: (f, v[i]) for c, (f, v) in qs.items()}, k), channels=tuple(qs))
            for i, q in enumerate(queries)
        ]

    def image(self, image: ImageLike, k: int | None = None, rerank: bool = False) -> SearchResult:
        """Search with the image vector and with a generated caption, which is also the rerank query. With
        text channels: the image vector, and the caption through every text channel, fused by RRF. Without
        (an image-only index): image and caption CLIP vectors unioned (dedupe by sha256, best score kept,
        ``via`` records which vector found it)."""
        if self.captioner is None:
            raise ValueError("image queries need a captioner (--captioner MODEL)")
        if self.embedder is None:
            raise ValueError("image queries need the CLIP embedder (--embed-model)")
        k = k or self.config.k
        n = max(k, self.config.candidates) if rerank else k
        caption = self.captioner.run_batch([image], self.caption_model)[0]
        img_vec = self.embedder.encode_images([image])
        if self.index.has_text_channels():
            qs = {f"caption-{c}": (f, v[0]) for c, (f, v) in self._queries([caption], self.channels).items()}
            lists = {"image": ("vector", img_vec[0]), **qs}
            hits = self._finish(caption, self._fuse(lists, n), k, rerank)
            return SearchResult(caption, hits, caption=caption, channels=tuple(lists), reranked=rerank)
        cap_vec = self.embedder.encode_texts([caption])
        by_image = self.index.search(img_vec, n, via="image")[0]
        by_caption = self.index.search(cap_vec, n, via="caption")[0]
        candidates = merge_hits([by_image, by_caption], 2 * n)
        hits = self._finish(caption, candidates, k, rerank)
        return SearchResult(caption, hits, caption=caption, channels=("image+caption",), reranked=rerank)


def load_searcher(
    index: ShardedIndex,
    embed_model: str | None,
    caption_model: str | None = None,
    rerank_model: str | None = None,
    device: str = "cpu",
    config: SearchConfig = SearchConfig(),
    text_model: str | None = None,
) -> Searcher:
    """Load the models named and bind them to ``index`` (what the CLI and the service start from).
    ``text_model``: the sentence embedder the index's text channels were built with (None: no dense channel;
    an image-only index refuses one)."""
    from retrieval.caption import CaptionConfig
    from retrieval.embed import EmbedConfig, LoadedEmbedder, STEmbedder
    from retrieval.rerank import RerankConfig

    embedder = LoadedEmbedder.load(STEmbedder(EmbedConfig(embed_model, device=device))) if embed_model else None
    texter = LoadedEmbedder.load(STEmbedder(EmbedConfig(text_model, device=device))) if text_model else None
    if index.exists():
        if embedder is not None and index.dim() != embedder.dim:
            raise ValueError(f"index holds {index.dim()}-d vectors but {embed_model!r} gives {embedder.dim}-d")
        if texter is not None:
            have = index.text_dim()
            if not have:
                raise SchemaMismatch(
                    f"index {index.config.name!r} has no text channels (built image-only): query it with "
                    "--text-model none, or rebuild it under a new --name with a text model"
                )
            if have != texter.dim:
                raise ValueError(f"index holds {have}-d text vectors but {text_model!r} gives {texter.dim}-d")
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
        texter,
    )
