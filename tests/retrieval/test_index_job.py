"""The Beam ingest job on DirectRunner, against Milvus Lite and the Milvus server: idempotent, resumable."""

from __future__ import annotations

import json

import pytest

from pipelines.index_job import IndexJobConfig, pending_shards, run
from retrieval.index import ShardedIndex

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # Beam + model load: ~20-40 s each here


def test_ingest_twice_same_rows_and_resume(index_config_factory, shards_dir, tiny_models, tmp_path):
    icfg = index_config_factory(n_shards=2)
    cfg = IndexJobConfig(
        shards_dir=str(shards_dir),
        index=icfg,
        embed_model=tiny_models["retrieval-clip"],
        batch_size=5,
        state_dir=str(tmp_path / "state"),
    )
    first = run(cfg)
    assert first["shard_files_pending"] == 2 and first["crops_read"] == 12 and first["crops_written"] == 12
    assert first["shard_files_done"] == 2 and pending_shards(cfg) == []
    markers = sorted((tmp_path / "state").glob("*.done"))
    assert [json.loads(m.read_text())["crops"] for m in markers] == [6, 6]
    with ShardedIndex(icfg) as ix:
        ids1, counts1 = ix.ids(), ix.counts()
        assert len(ids1) == 12 and sum(counts1) == 12
        row = ix.get([ids1[0]])[0]
        assert row["source"].startswith("shard-0000") and row["doc_id"] and "[IMAGE]" in row["context"]

    # Same shards again: every file is done, nothing is read.
    second = run(cfg)
    assert second["shard_files_pending"] == 0 and second.get("crops_read", 0) == 0

    # Lose the markers (a crash before MarkDone): files are re-read, every crop is found and skipped.
    for m in markers:
        m.unlink()
    third = run(cfg)
    assert third["crops_read"] == 12 and third["crops_skipped_existing"] == 12 and third.get("crops_written", 0) == 0

    # Force a real re-ingest: upserts by sha256 leave the same ids and counts.
    for m in (tmp_path / "state").glob("*.done"):
        m.unlink()
    fourth = run(IndexJobConfig(**{**cfg.__dict__, "skip_existing": False}))
    assert fourth["crops_written"] == 12
    with ShardedIndex(icfg) as ix:
        assert ix.ids() == ids1 and ix.counts() == counts1


def test_rewritten_shard_is_ingested_again(shards_dir, tiny_models, tmp_path):
    from retrieval_fakes import make_rows

    from pipelines.shards import write_shard
    from retrieval.index import IndexConfig

    cfg = IndexJobConfig(
        shards_dir=str(shards_dir),
        index=IndexConfig(str(tmp_path / "i.db"), n_shards=2),
        embed_model=tiny_models["retrieval-clip"],
        batch_size=8,
    )
    run(cfg)
    assert pending_shards(cfg) == []
    write_shard(
        shards_dir / "shard-00001-of-00002.parquet", make_rows("doc-c", ["red", "blue"], "square", size=(80, 40))
    )
    assert pending_shards(cfg) == ["shard-00001-of-00002.parquet"]
    out = run(cfg)
    assert out["crops_read"] == 2 and out["crops_written"] == 2
    with ShardedIndex(cfg.index) as ix:
        assert ix.count() == 14
