"""Pure logic of the index: shard routing, merge and dedupe, rerank ordering, crop context."""

from __future__ import annotations

import hashlib

import pytest

from formats.shards import Segment
from retrieval.crops import image_context
from retrieval.index import (
    Hit,
    IndexConfig,
    clip_bytes,
    collection_names,
    fanout_collections,
    index_for_scale,
    merge_hits,
    shard_of,
)
from retrieval.rerank import candidate_text, order_by_scores, to_unit_interval


def sha(i: int) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()


def test_shard_of_is_the_first_64_bits_mod_n():
    s = "00000000000000ff" + "0" * 48
    assert shard_of(s, 4) == 255 % 4 == 3
    assert shard_of(s, 1) == 0
    with pytest.raises(ValueError):
        shard_of("abc", 4)


def test_shard_routing_is_balanced_over_many_ids():
    n, shards = 20_000, 4
    counts = [0] * shards
    for i in range(n):
        counts[shard_of(sha(i), shards)] += 1
    # Uniform hash: each shard within 5% of n/shards (binomial sd ~ 0.6%).
    assert all(abs(c - n / shards) < 0.05 * n / shards for c in counts), counts


def test_collection_names_and_config_validation():
    assert collection_names("crops", 3) == ["crops_s00", "crops_s01", "crops_s02"]
    assert collection_names("crops", 1) == ["crops"]  # one collection: Milvus shards it
    assert fanout_collections(["crops", "crops_s01", "crops_s00", "other_s00", "crops_s1"], "crops") == [0, 1]
    assert index_for_scale(1_000_000) == "HNSW" and index_for_scale(100_000_000) == "IVF_SQ8"
    with pytest.raises(ValueError, match="partition_key"):
        IndexConfig(partition_key="caption")
    assert IndexConfig(index_type="hnsw").index_type == "HNSW"
    assert IndexConfig("./x.db").is_lite and not IndexConfig("http://127.0.0.1:19530").is_lite
    with pytest.raises(ValueError):
        IndexConfig(index_type="LSH")
    with pytest.raises(ValueError):
        IndexConfig(n_shards=0)


def test_merge_orders_by_score_dedupes_and_cuts():
    a, b, c, d = sha(1), sha(2), sha(3), sha(4)
    shard0 = [Hit(a, 0.9, shard=0, via=("image",)), Hit(c, 0.5, shard=0, via=("image",))]
    shard1 = [Hit(b, 0.7, shard=1, via=("image",)), Hit(d, 0.1, shard=1, via=("image",))]
    by_caption = [Hit(c, 0.95, shard=0, via=("caption",)), Hit(a, 0.2, shard=0, via=("caption",))]
    merged = merge_hits([shard0, shard1, by_caption], k=3)
    assert [h.sha256 for h in merged] == [c, a, b]
    assert [h.score for h in merged] == [0.95, 0.9, 0.7]  # best score kept for a duplicate
    assert merged[0].via == ("image", "caption") and merged[1].via == ("image", "caption")
    assert merged[2].via == ("image",)


def test_merge_ties_break_by_sha_deterministically():
    a, b = sorted([sha(5), sha(6)])
    assert [h.sha256 for h in merge_hits([[Hit(b, 0.5)], [Hit(a, 0.5)]], k=2)] == [a, b]
    assert merge_hits([], k=5) == []


def test_rerank_orders_by_score_and_sets_quality():
    hits = [Hit(sha(i), 1.0 - i / 10) for i in range(4)]
    out = order_by_scores(hits, [0.2, 0.9, 0.2, 0.5])
    assert [h.sha256 for h in out] == [sha(1), sha(3), sha(0), sha(2)]  # tie 0.2: retrieval order kept
    assert [h.quality for h in out] == [0.9, 0.5, 0.2, 0.2]
    with pytest.raises(ValueError):
        order_by_scores(hits, [0.1])


def test_sigmoid_maps_logits_into_unit_interval():
    p = to_unit_interval([-50.0, 0.0, 50.0])
    assert p[0] < 1e-20 and p[1] == 0.5 and p[2] == pytest.approx(1.0)


def test_candidate_text_joins_caption_and_context():
    assert candidate_text(Hit(sha(1), 0.0, caption="a plot", context="left [IMAGE] right")) == (
        "a plot | left [IMAGE] right"
    )
    assert candidate_text(Hit(sha(1), 0.0, context="x" * 50), max_chars=10) == "x" * 10


def test_image_context_takes_text_on_both_sides():
    segs = [
        Segment("text", 2, 0, text="Intro."),
        Segment("image", 4, 0, image_sha256="other"),
        Segment("text", 6, 1, text="Figure 2: a phase diagram."),
        Segment("image", 4, 1, image_sha256="want"),
        Segment("text", 5, 1, text="It shows two phases."),
    ]
    page, ctx = image_context(segs, "want", chars=200)
    assert page == 1
    assert ctx == "Intro. Figure 2: a phase diagram. [IMAGE] It shows two phases."
    page, ctx = image_context(segs, "want", chars=10)
    assert ctx == "e diagram. [IMAGE] It shows t"  # last 10 chars before, first 10 after
    assert image_context(segs, "missing") == (-1, "")


def test_clip_bytes_never_splits_a_character():
    assert clip_bytes("ééé", 3) == "é"
    assert clip_bytes("abc", 10) == "abc"
