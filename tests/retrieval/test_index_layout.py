"""One collection sharded by Milvus (``shards_num`` + partition key) vs the old fan-out layout, on Milvus Lite and
the Milvus server (loopback-only namespace): exact top-k, and a migration that loses no row."""

from __future__ import annotations

import numpy as np
import pytest

from retrieval.index import (
    IndexRow,
    ShardedIndex,
    discover_n_shards,
    fanout_names,
    migrate_fanout,
)
from retrieval.vectors import ShardedVectorStore, VectorStoreConfig

pytestmark = pytest.mark.integration


def clustered_rows(n: int, dim: int = 16, docs: int = 7, seed: int = 0) -> list[IndexRow]:
    """Unit vectors around a few centres, crops spread over ``docs`` documents (so the partition key varies)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(4, dim))
    v = centres[rng.integers(0, 4, n)] + 0.3 * rng.normal(size=(n, dim))
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return [
        IndexRow(sha256=f"{i:064x}", vector=v[i].astype(np.float32), doc_id=f"doc{i % docs}", kind="figure", row=i)
        for i in range(n)
    ]


def exact_top_k(rows: list[IndexRow], q: np.ndarray, k: int) -> list[str]:
    m = np.stack([r.vector for r in rows])
    s = m @ q
    return [rows[i].sha256 for i in sorted(range(len(rows)), key=lambda i: (-s[i], rows[i].sha256))[:k]]


def test_one_collection_with_milvus_shards_and_partition_key_is_exact(index_config_factory):
    rows = clustered_rows(300)
    cfg = index_config_factory(n_shards=1, shards_num=2, partition_key="doc_id", index_type="FLAT")
    with ShardedIndex(cfg) as ix:
        ix.ensure(16)
        assert ix.names == [cfg.name]
        desc = ix.client.describe_collection(cfg.name)
        assert [f["name"] for f in desc["fields"] if f.get("is_partition_key")] == ["doc_id"]
        if not cfg.is_lite:  # Milvus Lite has no shards_num; the server must have created two shards
            assert desc["num_shards"] == 2 and desc.get("num_partitions", 16) == cfg.num_partitions
        assert ix.upsert(rows) == 300 and ix.count() == 300
        queries = clustered_rows(20, seed=1)
        got = ix.search(np.stack([q.vector for q in queries]), k=10)
        for q, hits in zip(queries, got):
            assert [h.sha256 for h in hits] == exact_top_k(rows, np.asarray(q.vector), 10)
        # The partition key prunes a doc_id filter to one partition; the answer is still the exact filtered top-k.
        q = np.asarray(queries[0].vector)
        want = exact_top_k([r for r in rows if r.doc_id == "doc3"], q, 5)
        assert [h.sha256 for h in ix.search(q, k=5, filter='doc_id == "doc3"')[0]] == want
    assert discover_n_shards(cfg.uri, cfg.name, cfg.token) == 1


def test_migration_from_fanout_collections_loses_no_row(index_config_factory):
    rows = clustered_rows(250)
    old_cfg = index_config_factory(n_shards=3, index_type="FLAT")
    with ShardedIndex(old_cfg) as old:
        old.ensure(16)
        old.upsert(rows)
        old.set_quality({rows[7].sha256: 0.9})
        assert old.names == fanout_names(old_cfg.name, 3) and sum(old.counts()) == 250
    assert discover_n_shards(old_cfg.uri, old_cfg.name) == 3  # the old layout keeps working without a flag
    new_cfg = index_config_factory(n_shards=1, shards_num=2, index_type="FLAT")
    assert new_cfg.name == old_cfg.name
    with ShardedIndex(new_cfg) as new:
        report = migrate_fanout(new, batch=64)
        assert report == {"collections": 3, "rows_read": 250, "rows_written": 250, "rows_in_target": 250}
        assert new.ids() == sorted(r.sha256 for r in rows)
        stored = {r["sha256"]: r for r in new.get([r.sha256 for r in rows], with_vectors=True)}
        for r in rows:
            s = stored[r.sha256]
            assert np.allclose(s["vector"], r.vector, atol=1e-6)
            assert (s["doc_id"], s["row"], s["kind"]) == (r.doc_id, r.row, r.kind)
        assert stored[rows[7].sha256]["quality"] == pytest.approx(0.9)
        assert migrate_fanout(new, drop_old=True)["rows_in_target"] == 250  # re-run: upserts, no duplicates
        assert not any(new.client.has_collection(n) for n in fanout_names(old_cfg.name, 3))
    assert discover_n_shards(new_cfg.uri, new_cfg.name) == 1
    # the fixture drops what it made; the old names are gone already


def test_memory_decoder_store_migrates_to_one_collection(tmp_path):
    uri = str(tmp_path / "kv.db")
    rng = np.random.default_rng(0)
    ids = np.arange(500, dtype=np.int64) * 7
    keys = rng.normal(size=(500, 8)).astype(np.float32)
    vals = rng.integers(0, 100, 500)
    with ShardedVectorStore(VectorStoreConfig(uri=uri, name="kv", n_shards=3, index_type="FLAT")) as old:
        old.ensure(8)
        old.upsert(ids, keys, vals)
        want = old.search(keys[:5], k=4)
    with ShardedVectorStore(VectorStoreConfig(uri=uri, name="kv", index_type="FLAT")) as new:
        assert new.names == ["kv"]
        assert migrate_fanout(new, batch=100, drop_old=True)["rows_in_target"] == 500
        got_ids, got_vals = new.rows()
        assert np.array_equal(got_ids, ids) and np.array_equal(got_vals, vals)
        got = new.search(keys[:5], k=4)
        assert np.array_equal(got.ids, want.ids) and np.allclose(got.distances, want.distances, atol=1e-4)
