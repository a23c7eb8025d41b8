"""ShardedIndex against real Milvus: Milvus Lite always, the Milvus server inside a loopback-only namespace.
Same test code for both backends (the ``index_config_factory`` fixture is parametrized)."""

from __future__ import annotations

import numpy as np
import pytest
from retrieval_fakes import HashEmbedder

from formats.shards import list_shards
from retrieval.crops import iter_crops
from retrieval.index import UNSCORED, IndexRow, ShardedIndex, shard_of

pytestmark = pytest.mark.integration


def rows_from(corpus_out, emb: HashEmbedder) -> list[IndexRow]:
    crops = [c for p in list_shards(corpus_out) for c in iter_crops(p, corpus_out)]
    vecs = emb.encode_images([c.png for c in crops])
    return [IndexRow.from_crop(c, v) for c, v in zip(crops, vecs)]


def test_upsert_routes_by_sha_and_is_idempotent(index_config_factory, corpus_out):
    emb = HashEmbedder(16)
    rows = rows_from(corpus_out, emb)
    with ShardedIndex(index_config_factory(n_shards=3)) as ix:
        ix.ensure(emb.dim)
        assert ix.upsert(rows) == 12
        first_ids, first_counts = ix.ids(), ix.counts()
        ix.upsert(rows)  # re-ingest: nothing changes
        ix.ensure(emb.dim)  # and a second ensure() is a no-op
        assert ix.ids() == first_ids == sorted(r.sha256 for r in rows)
        assert ix.counts() == first_counts and ix.count() == 12
        expected = [0, 0, 0]
        for r in rows:
            expected[shard_of(r.sha256, 3)] += 1
        assert first_counts == expected
        with pytest.raises(ValueError, match="16-d"):
            ix.ensure(32)


def test_fanout_search_finds_each_crop_first_with_provenance(index_config_factory, corpus_out):
    emb = HashEmbedder(16)
    rows = rows_from(corpus_out, emb)
    with ShardedIndex(index_config_factory(n_shards=4, index_type="HNSW")) as ix:
        ix.ensure(emb.dim)
        ix.upsert(rows)
        results = ix.search(np.stack([r.vector for r in rows]), k=5)
        assert len(results) == len(rows)
        for r, hits in zip(rows, results):
            assert hits[0].sha256 == r.sha256 and hits[0].score == pytest.approx(1.0, abs=1e-4)
            assert hits[0].shard == shard_of(r.sha256, 4)
            assert (hits[0].doc_id, hits[0].source, hits[0].row, hits[0].page_index) == (
                r.doc_id,
                r.source,
                r.row,
                r.page_index,
            )
            assert "[IMAGE]" in hits[0].context and hits[0].quality == UNSCORED
            assert len({h.sha256 for h in hits}) == len(hits) == 5
            assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        # Exactness of the fan-out on a tiny index: identical to brute force over all rows.
        q = emb.encode_texts(["query"])[0]
        brute = sorted(rows, key=lambda r: -float(np.dot(q, r.vector)))[:5]
        assert [h.sha256 for h in ix.search(q, k=5)[0]] == [r.sha256 for r in brute]


def test_quality_scores_are_stored_as_max(index_config_factory, corpus_out):
    emb = HashEmbedder(16)
    rows = rows_from(corpus_out, emb)[:4]
    with ShardedIndex(index_config_factory(n_shards=2, index_type="IVF_SQ8", build_params={"nlist": 4})) as ix:
        ix.ensure(emb.dim)
        ix.upsert(rows)
        a, b = rows[0].sha256, rows[1].sha256
        assert ix.set_quality({a: 0.7, b: 0.2}) == 2
        assert ix.set_quality({a: 0.4}) == 0  # lower than stored: kept
        got = {r["sha256"]: r["quality"] for r in ix.get([a, b, rows[2].sha256])}
        assert got[a] == pytest.approx(0.7) and got[b] == pytest.approx(0.2) and got[rows[2].sha256] == UNSCORED
        assert ix.existing([a, "f" * 64]) == {a}
        assert ix.count() == 4  # updates rewrote rows, never duplicated them


def test_bulk_files_roundtrip_and_import(index_config_factory, corpus_out, tmp_path):
    import pyarrow.parquet as pq

    from retrieval.index import bulk_import, write_bulk_files

    emb = HashEmbedder(16)
    rows = rows_from(corpus_out, emb)
    cfg = index_config_factory(n_shards=2)
    files = write_bulk_files(rows + rows[:3], str(tmp_path / "bulk"), n_shards=2, rows_per_file=4)
    tables = [pq.read_table(f) for fs in files.values() for f in fs]
    assert sum(t.num_rows for t in tables) == 12  # duplicates folded
    assert all(set(t.column("sha256").to_pylist()) for t in tables)
    for shard, fs in files.items():
        for f in fs:
            assert all(shard_of(s, 2) == shard for s in pq.read_table(f).column("sha256").to_pylist())
    with ShardedIndex(cfg) as ix:
        ix.ensure(emb.dim)
        if cfg.is_lite:
            with pytest.raises(NotImplementedError, match="Lite"):
                bulk_import(ix, files)
            return
        done = bulk_import(ix, files, timeout_s=120)
        assert done.rows == 12 and done.files == len(tables)
        assert 0 < done.import_s <= done.indexed_s <= done.searchable_s
        assert ix.ids() == sorted(r.sha256 for r in rows)
        hit = ix.search(np.asarray(rows[5].vector), k=1)[0][0]
        assert hit.sha256 == rows[5].sha256 and hit.source == rows[5].source
        with pytest.raises(ValueError, match="non-empty"):
            bulk_import(ix, files)


def test_bulk_writer_rolls_files_in_whole_and_keeps_rows(corpus_out, tmp_path):
    """Batches appended as they come: a file per shard moves in once it holds rows_per_file rows (row groups of
    group_rows), the rest at close; vectors and fields come back as written; an aborted writer leaves nothing."""
    import pyarrow.parquet as pq

    from retrieval.index import BulkWriter

    rows = rows_from(corpus_out, HashEmbedder(16))
    out = tmp_path / "bulk"
    with BulkWriter(str(out), n_shards=2, rows_per_file=4, group_rows=3) as w:
        for i in range(0, 12, 5):
            assert w.add(rows[i : i + 5] + rows[i : i + 1]) == len(rows[i : i + 5])  # a repeat folds
        assert sum(len(f) for f in w.files.values()) >= 2  # full files were in before close
    per_shard = {s: [shard_of(r.sha256, 2) for r in rows].count(s) for s in (0, 1)}
    assert {s: len(f) for s, f in w.files.items()} == {s: -(-n // 4) for s, n in per_shard.items()}
    assert sorted(p.name for p in out.iterdir()) == sorted(p.rsplit("/", 1)[1] for f in w.files.values() for p in f)
    back = {}
    for shard, files in w.files.items():
        for f in files:
            meta = pq.ParquetFile(f).metadata
            assert meta.num_rows <= 4 and all(meta.row_group(g).num_rows <= 3 for g in range(meta.num_row_groups))
            for r in pq.read_table(f).to_pylist():
                assert shard_of(r["sha256"], 2) == shard
                back[r["sha256"]] = r
    assert sorted(back) == sorted(r.sha256 for r in rows)
    for r in rows:
        got = back[r.sha256]
        assert np.allclose(got["vector"], r.vector) and (got["doc_id"], got["row"]) == (r.doc_id, r.row)
    with pytest.raises(RuntimeError), BulkWriter(str(tmp_path / "aborted"), 2) as w:
        w.add(rows)
        raise RuntimeError("worker died")
    assert not list((tmp_path / "aborted").iterdir())


def test_text_channels_on_lite_and_a_clear_refusal_on_an_older_server(index_config_factory, corpus_out):
    """Milvus Lite holds the text channels beside the image vector (BM25 searched across fan-out collections);
    the 2.3.5 server has no BM25 function or sparse vectors: refused before any collection is created."""
    from dataclasses import replace

    from retrieval.index import TextChannelsUnsupported

    emb, texts = HashEmbedder(16), HashEmbedder(8)
    rows = rows_from(corpus_out, emb)
    words = [f"{r.kind} token{i:02d} crop" for i, r in enumerate(rows)]
    rows = [replace(r, text=w, text_vector=v) for r, w, v in zip(rows, words, texts.encode_texts(words))]
    cfg = index_config_factory(n_shards=2)
    with ShardedIndex(cfg) as ix:
        if not cfg.is_lite:
            with pytest.raises(TextChannelsUnsupported, match=r"need Milvus >= 2\.5 or Milvus Lite"):
                ix.ensure(emb.dim, texts.dim)
            assert not ix.exists()
            return
        ix.ensure(emb.dim, texts.dim)
        assert ix.upsert(rows) == 12 and ix.has_text_channels() and ix.text_dim() == 8
        for i in (0, 7):
            hits = ix.search([f"token{i:02d}"], k=3, field="sparse", via="bm25")[0]
            assert hits[0].sha256 == rows[i].sha256 and hits[0].score > 0 and len(hits) == 1
            dense = ix.search(texts.encode_texts([words[i]]), k=3, field="text_vector")[0]
            assert dense[0].sha256 == rows[i].sha256
        got = {r["sha256"]: r for r in ix.get([rows[0].sha256], with_vectors=True)}
        assert got[rows[0].sha256]["text"] == words[0]  # a quality rewrite keeps the channel text
        ix.set_quality({rows[0].sha256: 0.9})
        assert ix.search([f"token{0:02d}"], k=1, field="sparse")[0][0].quality == pytest.approx(0.9)


def test_a_text_channel_fanout_index_migrates_with_its_text(tmp_path, corpus_out):
    """``scifolio index migrate`` on a text-channel fan-out index: text and text vectors are copied, the BM25
    vectors are recomputed by the target's function (Milvus Lite)."""
    from dataclasses import replace

    from retrieval.index import IndexConfig, migrate_fanout

    emb, texts = HashEmbedder(16), HashEmbedder(8)
    rows = rows_from(corpus_out, emb)
    words = [f"token{i:02d} crop" for i in range(len(rows))]
    rows = [replace(r, text=w, text_vector=v) for r, w, v in zip(rows, words, texts.encode_texts(words))]
    uri = str(tmp_path / "mig.db")
    with ShardedIndex(IndexConfig(uri, name="t", n_shards=3)) as old:
        old.ensure(emb.dim, texts.dim)
        old.upsert(rows)
    with ShardedIndex(IndexConfig(uri, name="t")) as new:
        assert migrate_fanout(new, drop_old=True)["rows_in_target"] == 12
        assert new.text_dim() == 8
        hits = new.search(["token05"], k=2, field="sparse")[0]
        assert hits[0].sha256 == rows[5].sha256 and len(hits) == 1
