"""Text, image (image + caption vectors) and reranked search with the tiny models against Milvus Lite."""

from __future__ import annotations

import pytest

from retrieval.index import ShardedIndex
from retrieval.search import SearchConfig, load_searcher

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def searcher(ready_index, tiny_models):
    s = load_searcher(
        ShardedIndex(ready_index["config"]),
        tiny_models["retrieval-clip"],
        tiny_models["retrieval-captioner"],
        tiny_models["retrieval-reranker"],
        config=SearchConfig(k=5, candidates=12),
    )
    yield s
    s.index.close()


def test_text_query_returns_ranked_unique_hits(searcher, ready_index):
    res = searcher.text("a red circle", k=5)
    assert len(res.hits) == 5 and len({h.sha256 for h in res.hits}) == 5
    assert [h.score for h in res.hits] == sorted((h.score for h in res.hits), reverse=True)
    assert all(h.via == ("clip",) for h in res.hits)
    by_sha = {c.sha256: c for c in ready_index["crops"]}
    assert all(
        (h.doc_id, h.source, h.row) == (by_sha[h.sha256].doc_id, by_sha[h.sha256].source, by_sha[h.sha256].row)
        for h in res.hits
    )


def test_image_query_unions_image_and_caption_vectors(searcher, ready_index):
    crop = ready_index["crops"][3]
    res = searcher.image(crop.png, k=12)
    assert res.caption is not None and res.query == res.caption
    top = res.hits[0]
    assert top.sha256 == crop.sha256 and top.score == pytest.approx(1.0, abs=1e-3)  # itself, by its image vector
    assert "image" in top.via
    # Both query vectors were searched: every hit is tagged, and the caption vector tagged some.
    assert all(set(h.via) <= {"image", "caption"} and h.via for h in res.hits)
    assert any("caption" in h.via for h in res.hits)
    assert len({h.sha256 for h in res.hits}) == len(res.hits) == 12


def test_rerank_orders_by_cross_encoder_and_stores_quality(searcher):
    res = searcher.text("a blue square plot", k=4, rerank=True)
    assert len(res.hits) == 4
    scores = [h.score for h in res.hits]
    assert scores == sorted(scores, reverse=True) and all(0.0 <= s <= 1.0 for s in scores)
    # The scores are the cross-encoder's on (query, caption/context) pairs, computed independently here.
    from retrieval.rerank import candidate_text

    texts = [candidate_text(h) for h in res.hits]
    (direct,) = searcher.reranker.run_batch([("a blue square plot", texts)], searcher.rerank_model)
    assert list(direct) == pytest.approx(scores, abs=1e-6)
    stored = {r["sha256"]: r["quality"] for r in searcher.index.get([h.sha256 for h in res.hits])}
    assert all(stored[h.sha256] >= h.score - 1e-6 for h in res.hits)


def test_rerank_without_reranker_is_an_error(ready_index, tiny_models):
    s = load_searcher(ShardedIndex(ready_index["config"]), tiny_models["retrieval-clip"])
    with pytest.raises(ValueError, match="reranker"):
        s.text("x", rerank=True)
    with pytest.raises(ValueError, match="captioner"):
        s.image(ready_index["crops"][0].png)
    s.index.close()
