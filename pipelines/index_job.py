"""Beam ingest job: crops from corpus shards → embeddings (batched, model loaded in DoFn.setup) → sharded index.

Resumable twice over: a shard file whose crops were all written gets a ``<state_dir>/<file>.done`` marker
(keyed by the file's sha256, so a rewritten shard is ingested again), and inside an unfinished file, crops
already in the index are skipped before embedding (the expensive step) — which also keeps their stored
quality scores. Upserts are keyed by sha256, so even a full re-run changes nothing.

    scifolio index build out/shards --uri ./index.db --shards 4 --embed-model tiny/retrieval/clip \\
        --runner DirectRunner
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions

from retrieval.crops import CropItem, iter_crops, list_shards
from retrieval.index import IndexConfig, IndexRow, ShardedIndex

NAMESPACE = "scifolio.index"


@dataclass(frozen=True)
class IndexJobConfig:
    shards_dir: str
    """Directory of shard parquet files (searched recursively)."""
    index: IndexConfig
    """Where and how to write (URI, collection prefix, number of shards, index type)."""
    embed_model: str
    """sentence-transformers image+text model (hub name or path); its dimension sizes the collections."""
    caption_model: str | None = None
    """Optional image-to-text model: store a generated caption with every crop (slower ingest)."""
    batch_size: int = 32
    """Crops per embedding batch (and per upsert)."""
    state_dir: str | None = None
    """Where ``.done`` markers live; default ``<shards_dir>/.index_state/<collection prefix>``."""
    skip_existing: bool = True
    """Skip crops already in the index (resume; keeps stored quality scores)."""
    device: str = "cpu"
    """torch device for the models."""

    @property
    def resolved_state_dir(self) -> Path:
        return Path(self.state_dir) if self.state_dir else Path(self.shards_dir) / ".index_state" / self.index.name


def _marker(state_dir: Path, source: str) -> Path:
    return state_dir / (source.replace(os.sep, "__") + ".done")


def pending_shards(cfg: IndexJobConfig) -> list[str]:
    """Shard files (relative paths) without a valid done marker."""
    from pipelines.shards import file_sha256

    root = Path(cfg.shards_dir)
    out = []
    for path in list_shards(root):
        rel = str(path.relative_to(root))
        m = _marker(cfg.resolved_state_dir, rel)
        if m.exists() and json.loads(m.read_text()).get("sha256") == file_sha256(path):
            continue
        out.append(rel)
    return out


class ReadCrops(beam.DoFn):
    """shard file (relative path) → its crops, once per sha256 per file; also emits (file, 0) so a file with
    no crops still gets its done marker."""

    def __init__(self, shards_dir: str):
        self.shards_dir = shards_dir
        self.read = Metrics.counter(NAMESPACE, "crops_read")
        self.files = Metrics.counter(NAMESPACE, "shard_files_read")

    def process(self, rel: str) -> Iterator:
        seen: set[str] = set()
        for crop in iter_crops(Path(self.shards_dir) / rel, root=self.shards_dir):
            if crop.sha256 in seen:  # chunk overlap repeats images; the first occurrence is the provenance
                continue
            seen.add(crop.sha256)
            self.read.inc()
            yield crop
        self.files.inc()
        yield beam.pvalue.TaggedOutput("files", (rel, 0))


class EmbedAndWrite(beam.DoFn):
    """A batch of crops → skip stored ones → caption (optional) → embed → upsert. Emits (file, n_written)."""

    def __init__(self, cfg: IndexJobConfig):
        self.cfg = cfg
        self.written = Metrics.counter(NAMESPACE, "crops_written")
        self.skipped = Metrics.counter(NAMESPACE, "crops_skipped_existing")
        self.batches = Metrics.counter(NAMESPACE, "batches")
        self.embed_ms = Metrics.distribution(NAMESPACE, "embed_ms_per_batch")

    def setup(self) -> None:
        from retrieval.caption import CaptionConfig, Captioner
        from retrieval.embed import EmbedConfig, STEmbedder

        self.embedder = STEmbedder(EmbedConfig(self.cfg.embed_model, self.cfg.batch_size, self.cfg.device)).load()
        self.captioner = (
            Captioner(CaptionConfig(self.cfg.caption_model, device=self.cfg.device)).load()
            if self.cfg.caption_model
            else None
        )
        self.index = ShardedIndex(self.cfg.index)
        self.index.ensure(self.embedder.dim)

    def process(self, batch: Sequence[CropItem]) -> Iterator[tuple[str, int]]:
        import time

        self.batches.inc()
        todo = list({c.sha256: c for c in batch}.values())
        if self.cfg.skip_existing and todo:
            stored = self.index.existing(c.sha256 for c in todo)
            self.skipped.inc(len(stored))
            todo = [c for c in todo if c.sha256 not in stored]
        if todo:
            t0 = time.perf_counter()
            pngs = [c.png for c in todo]
            captions = self.captioner.run_batch(pngs) if self.captioner else [""] * len(todo)
            vecs = self.embedder.encode_images(pngs)
            self.embed_ms.update(int((time.perf_counter() - t0) * 1000))
            rows = [IndexRow.from_crop(c, v, cap) for c, v, cap in zip(todo, vecs, captions)]
            self.written.inc(self.index.upsert(rows))
        for c in batch:
            yield c.source, 1

    def teardown(self) -> None:  # best effort only: nothing relies on it
        index = getattr(self, "index", None)
        if index is not None:
            index.close()


class MarkDone(beam.DoFn):
    """After every batch of a file is written (the GroupByKey barrier), record the file as done."""

    def __init__(self, shards_dir: str, state_dir: str):
        self.shards_dir = shards_dir
        self.state_dir = state_dir
        self.done = Metrics.counter(NAMESPACE, "shard_files_done")

    def process(self, item: tuple[str, Iterable[int]]) -> Iterator[str]:
        from pipelines.shards import file_sha256

        rel, counts = item
        state = Path(self.state_dir)
        state.mkdir(parents=True, exist_ok=True)
        marker = _marker(state, rel)
        tmp = marker.with_name(f".{marker.name}.tmp-{os.getpid()}")
        tmp.write_text(
            json.dumps({"file": rel, "sha256": file_sha256(Path(self.shards_dir) / rel), "crops": int(sum(counts))})
        )
        os.replace(tmp, marker)
        self.done.inc()
        yield rel


def build(p: beam.Pipeline, cfg: IndexJobConfig, files: list[str]):
    read = (
        p
        | "ShardFiles" >> beam.Create(files)
        | "Reshuffle" >> beam.Reshuffle()
        | "ReadCrops" >> beam.ParDo(ReadCrops(cfg.shards_dir)).with_outputs("files", main="crops")
    )
    written = (
        read.crops
        | "Batch" >> beam.BatchElements(min_batch_size=cfg.batch_size, max_batch_size=cfg.batch_size)
        | "EmbedAndWrite" >> beam.ParDo(EmbedAndWrite(cfg))
    )
    return (
        (written, read.files)
        | "Flatten" >> beam.Flatten()
        | "PerFile" >> beam.GroupByKey()
        | "MarkDone" >> beam.ParDo(MarkDone(cfg.shards_dir, str(cfg.resolved_state_dir)))
    )


def run(cfg: IndexJobConfig, beam_args: Sequence[str] = ()) -> dict[str, int]:
    """Run the job; returns Beam counter totals (plus ``shard_files_pending`` before the run)."""
    files = pending_shards(cfg)
    args = list(beam_args)
    if not any(a.startswith("--runner") for a in args):
        args += ["--runner", "DirectRunner"]  # never Beam's default Prism runner: it downloads a binary
    opts = PipelineOptions(args)
    p = beam.Pipeline(options=opts)
    build(p, cfg, files)
    result = p.run()
    result.wait_until_finish()
    totals = {"shard_files_pending": len(files)}
    for c in result.metrics().query()["counters"]:
        if c.key.metric.namespace == NAMESPACE:
            totals[c.key.metric.name] = totals.get(c.key.metric.name, 0) + int(c.committed or c.attempted or 0)
    return totals
