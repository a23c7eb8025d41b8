"""The manifest of a 2,000-document build is written from what the writers emitted, combined in the pipeline:
the driver reads no shard and no dead letter back (the reads are counted). The count of
documents is not the point (it was 10,000; 2,000 proves the same in a sixth of the time): a summary that grew with
the corpus would already hold 2,000 ids of 64 hex digits, 128 kB, against the 20 kB bound checked below."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from formats import fs
from formats.records import Dropped, page_id, split_page_id
from formats.scores import VISUAL_GAIN, VisualGainScore
from formats.shards import ChunkRow, PageInfo, Segment, ShardFile, rows_to_table
from pipelines.assembly.build import BuildConfig, DocResult, WorkStore

N_DOCS = 2_000


def doc_id(i: int) -> str:
    return hashlib.sha256(f"doc-{i}".encode()).hexdigest()


def test_page_ids_are_built_and_parsed_in_one_place():
    d = doc_id(0)
    assert page_id(d, 7) == f"{d}:7" and split_page_id(page_id(d, 7)) == (d, 7)
    assert split_page_id(d) is None and split_page_id("/in/paper.pdf") is None and split_page_id("x:3") is None


@pytest.fixture(scope="module")
def synthetic_work(tmp_path_factory) -> tuple[Path, list[str], list[dict]]:
    """2,000 finished documents in a WorkStore (one chunk each, the first page of every 10th scored), plus
    dead letters: 50 duplicate documents, 30 failed documents, 200 pages dropped by visual gain."""
    root = tmp_path_factory.mktemp("work")
    store = WorkStore(root)
    ids = []
    for i in range(N_DOCS):
        d = doc_id(i)
        scores = {}
        if i % 10 == 0:
            vg = VisualGainScore(delta_h_nats=(i % 100) / 100, n_text_tokens=3).decided(0.05, "physics", True)
            scores = {VISUAL_GAIN: vg.to_dict()}
        row = ChunkRow(d, 0, (Segment("text", 3, 0, "a b c", (1, 2, 3)),), pages=(PageInfo(0, "fake", scores),))
        if i < 3:  # the real commit path for a few; the rest written the same way, faster (plain files)
            store.save(DocResult(d, f"mem://{i}", [row.to_row()], [], {}))
        else:
            path = Path(store.table_path(d))
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(rows_to_table([row.to_row()]), path, compression="none")
        ids.append(d)
    dropped = [Dropped(f"/in/dup-{i}.pdf", "open", "duplicate").to_row() for i in range(50)]
    dropped += [Dropped(doc_id(N_DOCS + i), "parse", "backend_error").to_row() for i in range(30)]
    dropped += [
        Dropped(
            page_id(doc_id(i), 1),
            "visual_gain",
            "below_threshold",
            VisualGainScore(delta_h_nats=-0.5, n_text_tokens=3).decided(0.05, "physics", False).to_dict(),
        ).to_row()
        for i in range(200)
    ]
    return root, ids, dropped


@pytest.mark.slow
def test_manifest_of_2000_documents_reads_nothing_back(synthetic_work, tmp_path, monkeypatch):
    import apache_beam as beam

    from pipelines.jobs import corpus
    from pipelines.jobs.stages import VisualGainSlot
    from visual_gain.scorer import VisualGainConfig

    work, ids, dropped = synthetic_work
    out = str(tmp_path / "out")
    config = BuildConfig(tokenizer="unused", docs_per_shard=200, visual_gain=VisualGainSlot(VisualGainConfig("m")))

    reads: list[str] = []
    real_open, real_text = fs.open_input, fs.read_text
    monkeypatch.setattr(fs, "open_input", lambda p: reads.append(str(p)) or real_open(p))
    monkeypatch.setattr(fs, "read_text", lambda p: reads.append(str(p)) or real_text(p))
    monkeypatch.setattr(ShardFile, "iter_chunks", _refuse)
    monkeypatch.setattr(ShardFile, "doc_ids", _refuse)

    opts = beam.options.pipeline_options.PipelineOptions(["--runner=DirectRunner", "--direct_running_mode=in_memory"])
    with beam.Pipeline(options=opts) as p:
        corpus.write_outputs(
            p | "Docs" >> beam.Create(ids), [p | "Dropped" >> beam.Create(dropped)], config, str(work), out
        )
    in_pipeline = list(reads)
    reads.clear()
    manifest = corpus.write_manifest(
        out,
        config,
        config_hash="h",
        parser_version="v",
        backends={},
        counters={},
        n_inputs=N_DOCS + 80,
        inputs=["mem://"],
        elapsed_s=0.0,
    )
    # The pipeline read each document's work table once, never an output file.
    out_files = [r for r in in_pipeline if r.startswith(out)]
    assert out_files == [] and len([r for r in in_pipeline if r.endswith(".parquet")]) == N_DOCS
    # The driver read one file: the combined summary (a few KB, not O(corpus)).
    assert reads == [corpus.JobPaths(out).parts]
    assert fs.size(corpus.JobPaths(out).parts) < 20_000

    t = manifest.totals
    assert (t.documents_in_shards, t.documents_quarantined, t.documents_failed) == (N_DOCS, 80, 30)
    assert t.chunks == N_DOCS and t.tokens == 3 * N_DOCS and len(manifest.shards) == 10
    assert manifest.dropped_by_reason == {
        "open.duplicate": 50,
        "parse.backend_error": 30,
        "visual_gain.below_threshold": 200,
    }
    assert {q.stage: q.count for q in manifest.quarantine} == {"open": 50, "parse": 30, "visual_gain": 200}
    vg = manifest.visual_gain["physics"]
    assert (vg["pages"], vg["kept"], vg["dropped"], vg["threshold"]) == (N_DOCS // 10 + 200, N_DOCS // 10, 200, 0.05)
    assert sum(vg["delta_h_nats"]["counts"]) == vg["pages"]
    # The same facts as reading every output back (what the driver used to do).
    monkeypatch.undo()
    files = sorted(Path(out, "shards").glob("*.parquet"))
    assert sum(pq.read_metadata(f).num_rows for f in files) == N_DOCS
    assert set().union(*(ShardFile(f).doc_ids() for f in files)) == set(ids)
    assert json.loads(Path(out, "manifest.json").read_text())["totals"]["documents_in_shards"] == N_DOCS


def _refuse(*a, **k):
    raise AssertionError("a shard was read back")
