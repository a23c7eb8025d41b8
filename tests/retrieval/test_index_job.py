"""The Beam ingest job on DirectRunner, against Milvus Lite and the Milvus server: idempotent, resumable."""

from __future__ import annotations

import json

import pytest

from pipelines.jobs.index import IndexJobConfig, pending_shards, run
from retrieval.index import ShardedIndex

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # Beam + model load: ~20-40 s each here


def test_ingest_twice_same_rows_and_resume(index_config_factory, corpus_out, tiny_models, tmp_path):
    icfg = index_config_factory(n_shards=2)
    cfg = IndexJobConfig(
        out=str(corpus_out),
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


def test_rewritten_shard_is_ingested_again(corpus_out, tiny_models, tmp_path):
    from retrieval_fakes import make_rows

    from formats.shards import write_shard
    from retrieval.index import IndexConfig

    cfg = IndexJobConfig(
        out=str(corpus_out),
        index=IndexConfig(str(tmp_path / "i.db"), n_shards=2),
        embed_model=tiny_models["retrieval-clip"],
        batch_size=8,
    )
    run(cfg)
    assert pending_shards(cfg) == []
    write_shard(
        corpus_out / "shards" / "shard-00001-of-00002.parquet",
        make_rows("doc-c", ["red", "blue"], "square", size=(80, 40)),
    )
    assert pending_shards(cfg) == ["shard-00001-of-00002.parquet"]
    out = run(cfg)
    assert out["crops_read"] == 2 and out["crops_written"] == 2
    with ShardedIndex(cfg.index) as ix:
        assert ix.count() == 14


def test_dedupe_staged_keeps_first_copy(corpus_out, tmp_path):
    import pyarrow.parquet as pq
    from retrieval_fakes import HashEmbedder

    from formats.shards import list_shards
    from pipelines.jobs.index import dedupe_staged, stage_batch, staged_files, staged_ids
    from retrieval.crops import iter_crops
    from retrieval.index import IndexRow

    emb = HashEmbedder(8)
    crops = [c for p in list_shards(corpus_out) for c in iter_crops(p, corpus_out)]
    rows = [IndexRow.from_crop(c, v) for c, v in zip(crops, emb.encode_images([c.png for c in crops]))]
    bulk = tmp_path / "bulk"
    assert stage_batch(rows[:8], str(bulk), n_shards=2) == 8
    assert stage_batch(rows[5:] + rows[5:7], str(bulk), n_shards=2) == 7  # repeats inside a batch fold
    assert not list(bulk.glob(".*.tmp"))
    files = staged_files(bulk)
    assert all(f.is_absolute() for f in files) and {f.name[:3] for f in files} == {"s00", "s01"}
    assert dedupe_staged(files) == 3  # rows[5:8] were staged twice
    ids = [i for f in staged_files(bulk) for i in pq.read_table(f).column("sha256").to_pylist()]
    assert sorted(ids) == sorted(r.sha256 for r in rows) and staged_ids(bulk) == set(ids)
    assert dedupe_staged(staged_files(bulk)) == 0


def test_bulk_writer_stage_writes_one_file_per_shard_per_bundle(corpus_out, tmp_path):
    """The writer stage on the bulk path: every batch of a bundle goes into one file per shard, and nothing is
    visible in the staging directory until the bundle finishes (its done markers come after the files)."""
    import pyarrow.parquet as pq
    from apache_beam.ml.inference.base import PredictionResult
    from retrieval_fakes import HashEmbedder

    from formats.shards import list_shards
    from pipelines.jobs.index import WriteRows, staged_files
    from retrieval.crops import iter_crops
    from retrieval.index import IndexConfig

    crops = [c for p in list_shards(corpus_out) for c in iter_crops(p, corpus_out)]
    vecs = HashEmbedder(8).encode_images([c.png for c in crops])
    bulk = tmp_path / "bulk"
    cfg = IndexJobConfig(
        out=str(corpus_out),
        index=IndexConfig(str(tmp_path / "i.db"), n_shards=2),
        embed_model="unused",
        batch_size=4,
        bulk_dir=str(bulk),
    )
    fn = WriteRows(cfg)
    fn.setup()
    try:
        fn.start_bundle()
        emitted = []
        for i in range(0, len(crops), 4):  # three batches
            batch = [PredictionResult(c, (v, "", "", None)) for c, v in zip(crops[i : i + 4], vecs[i : i + 4])]
            emitted += list(fn.process(batch))
            assert staged_files(bulk) == []
        fn.finish_bundle()
    finally:
        fn.teardown()
    files = staged_files(bulk)
    assert len(files) == 2 and {f.name[:3] for f in files} == {"s00", "s01"}
    assert sorted(i for f in files for i in pq.read_table(f).column("sha256").to_pylist()) == sorted(
        c.sha256 for c in crops
    )
    assert len(emitted) == len(crops) and not list(bulk.glob(".*.tmp"))


def test_bulk_build_refuses_lite_before_any_work(corpus_out, tiny_models, tmp_path):
    from pipelines.jobs.index import BulkRefused
    from retrieval.index import IndexConfig

    cfg = IndexJobConfig(
        out=str(corpus_out),
        index=IndexConfig(str(tmp_path / "i.db"), n_shards=2),
        embed_model=tiny_models["retrieval-clip"],
        bulk_dir=str(tmp_path / "bulk"),
    )
    with pytest.raises(BulkRefused, match="Milvus Lite, which has no bulk import"):
        run(cfg)
    assert not (tmp_path / "i.db").exists() and not (tmp_path / "bulk").exists()
    assert not (corpus_out / "_index_state").exists()


def test_bulk_build_on_server_matches_upsert_build(milvus_server, corpus_out, tiny_models, tmp_path):
    """The bulk path against the real server: same rows and same query answers as the upsert path; crops staged
    by an interrupted earlier attempt are skipped and imported with the rest; a crop in two shard files is
    imported once; a re-run into the loaded index is refused before any work."""
    import uuid

    import numpy as np
    from retrieval_fakes import COLORS, make_rows

    from formats.shards import list_shards, write_shard
    from pipelines.jobs.index import BulkRefused, stage_batch, staged_files
    from retrieval.crops import iter_crops
    from retrieval.embed import EmbedConfig, LoadedEmbedder, STEmbedder
    from retrieval.index import IndexConfig, IndexRow

    # A third shard file repeating three of doc-a's crops: the same sha256 reaches two batches.
    write_shard(corpus_out / "shards" / "shard-dup.parquet", make_rows("doc-a", list(COLORS)[:3], "circle"))
    clip = tiny_models["retrieval-clip"]
    prefix = f"t{uuid.uuid4().hex[:8]}"
    up_cfg = IndexJobConfig(
        out=str(corpus_out),
        index=IndexConfig(milvus_server, name=f"{prefix}up", n_shards=2),
        embed_model=clip,
        batch_size=5,
    )
    bulk = tmp_path / "bulk"
    bulk_cfg = IndexJobConfig(
        out=str(corpus_out),
        index=IndexConfig(milvus_server, name=f"{prefix}bulk", n_shards=2),
        embed_model=clip,
        batch_size=5,
        bulk_dir=str(bulk),
        bulk_timeout_s=180,
    )
    emb = LoadedEmbedder.load(STEmbedder(EmbedConfig(clip)))
    crops = [c for p in list_shards(corpus_out) for c in iter_crops(p, corpus_out)]
    # An earlier bulk attempt that staged two crops and died, leaving a file it never moved in behind.
    pre = [c for c in crops if c.source == "shard-00001-of-00002.parquet"][:2]
    stage_batch([IndexRow.from_crop(c, v) for c, v in zip(pre, emb.encode_images([c.png for c in pre]))], str(bulk), 2)
    (bulk / f".s00-{uuid.uuid4().hex}-00000.parquet.tmp").write_bytes(b"PAR1 cut short")
    try:
        up = run(up_cfg)
        assert up["crops_written"] == 12
        out = run(bulk_cfg)
        assert out["shard_files_pending"] == 3 and out["crops_read"] == 15 and out["shard_files_done"] == 3
        assert out["crops_skipped_existing"] == 2 and out.get("crops_written", 0) == 0
        assert out["crops_staged"] + 2 - out["bulk_duplicates_dropped"] == out["rows_imported"] == 12
        assert out["bulk_files"] == len(staged_files(bulk)) and not list(bulk.glob(".*.tmp"))
        assert sorted((bulk / ".index_state").glob("*.done"))  # markers live with the staged files

        with ShardedIndex(up_cfg.index) as ux, ShardedIndex(bulk_cfg.index) as bx:
            ids = ux.ids()
            assert len(ids) == 12 and bx.ids() == ids and bx.counts() == ux.counts()
            # A crop held by two files keeps one copy's provenance; which copy may differ between the paths. Its
            # caption is the caption line next to it in that copy (retrieval.citations): it goes with the copy.
            twice = {c.sha256 for c in crops if c.source == "shard-dup.parquet"}
            caption_in = {(c.sha256, c.source, c.row): c.caption for c in crops}
            by_up = {r["sha256"]: r for r in ux.get(ids, with_vectors=True)}
            for r in bx.get(ids, with_vectors=True):
                u = by_up[r["sha256"]]
                fields = ["kind", "doc_id", "quality"]
                if r["sha256"] not in twice:
                    fields += ["caption", "page_index", "context", "source", "row"]
                assert {f: r[f] for f in fields} == {f: u[f] for f in fields}
                for x in (r, u):
                    assert x["caption"] == caption_in[x["sha256"], x["source"], x["row"]]
                assert np.allclose(r["vector"], u["vector"], atol=1e-6)
            # Same answers to text and image queries.
            queries = np.concatenate(
                [emb.encode_texts(["a red circle", "a blue square"]), emb.encode_images([crops[4].png])]
            )
            for hu, hb in zip(ux.search(queries, k=6), bx.search(queries, k=6)):
                assert [h.sha256 for h in hb] == [h.sha256 for h in hu]
                assert [h.score for h in hb] == pytest.approx([h.score for h in hu], abs=1e-4)
            top = bx.search(queries[2:], k=1)[0][0]
            assert top.sha256 == crops[4].sha256 and top.source == crops[4].source and top.row == crops[4].row

        # Import inserts: a second bulk build into the loaded collections is refused before reading anything.
        files_before = staged_files(bulk)
        with pytest.raises(BulkRefused, match="already hold 12 rows"):
            run(bulk_cfg)
        assert staged_files(bulk) == files_before
    finally:
        for c in (up_cfg, bulk_cfg):
            with ShardedIndex(c.index) as ix:
                ix.drop()


def test_embedding_runs_through_run_inference_and_matches_the_handler(corpus_out, tiny_models, tmp_path):
    """The graph holds Beam's RunInference over the retrieval handler, and the stored vectors equal what the
    handler gives for the same crops outside Beam (the job's output is today's)."""
    import apache_beam as beam
    import numpy as np

    from formats.shards import list_shards
    from pipelines.jobs.index import build
    from retrieval.crops import iter_crops
    from retrieval.embed import EmbedConfig, STEmbedder
    from retrieval.index import IndexConfig

    cfg = IndexJobConfig(
        out=str(corpus_out),
        index=IndexConfig(str(tmp_path / "i.db"), name="ri"),
        embed_model=tiny_models["retrieval-clip"],
        batch_size=4,
        state_dir=str(tmp_path / "state"),
    )
    p = beam.Pipeline(options=beam.options.pipeline_options.PipelineOptions(["--runner=DirectRunner"]))
    build(p, cfg, pending_shards(cfg))
    labels = [t.unique_name for t in p.to_runner_api().components.transforms.values()]
    assert any(label.endswith("RunInference") for label in labels), labels
    assert run(cfg)["crops_written"] == 12
    crops = {c.sha256: c for f in list_shards(corpus_out) for c in iter_crops(f, corpus_out)}
    handler = STEmbedder(EmbedConfig(tiny_models["retrieval-clip"]))
    ids = sorted(crops)
    want = handler.run_batch([crops[i].png for i in ids], handler.load())
    with ShardedIndex(cfg.index) as ix:
        got = {r["sha256"]: np.asarray(r["vector"]) for r in ix.get(ids, with_vectors=True)}
    assert np.allclose(np.stack([got[i] for i in ids]), want, atol=1e-5)
