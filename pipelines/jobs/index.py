"""Beam ingest job: crops from corpus shards → skip stored → ``RunInference`` (the retrieval handlers: model
loaded once per worker, batched) → index writes.

Graph: ShardFiles → ReadCrops → BatchElements → SkipStored → RunInference(CropEmbedding) → BatchElements →
WriteRows → per file → MarkDone. ReadCrops resolves the citations of each shard file's documents
(``retrieval.citations``); with a text model, CropEmbedding also embeds each crop's channel text (caption, citing
sentences, context: ``retrieval.channels``) and the rows carry the text channels.

Resumable twice over: a shard file whose crops were all written gets a ``<state_dir>/<file>.done`` marker
(keyed by the file's sha256, so a rewritten shard is ingested again), and inside an unfinished file, crops
already in the index are skipped before embedding (the expensive step) — which also keeps their stored
quality scores. Upserts are keyed by sha256, so even a full re-run changes nothing.

Bulk path (``bulk_dir``, a first load into empty collections on a Milvus server): instead of upserting, the
writer stage appends each embedded batch to its bundle's Milvus bulk-import parquet files in ``bulk_dir``
(``retrieval.index.BulkWriter``: one file per shard per bundle, ``s03-<writer id>-00000.parquet``, moved in whole
when the bundle finishes, so a crash never leaves a half-written file and a done marker never precedes its
rows); after the pipeline the driver drops crops staged twice and imports every staged file with
``retrieval.index.bulk_import`` (which returns once the rows are indexed and searchable). Import has insert semantics, so it is
refused unless every collection is empty, and Milvus Lite (no import service) is refused before any work.
Done markers then mean "staged" and live in ``<bulk_dir>/.index_state``; a re-run after a crash skips crops
already staged and imports old and new files together.

    scifolio index build --shards out --uri ./index.db --collections 4 --embed-model tiny/retrieval/clip \\
        --runner DirectRunner
    scifolio index build --shards out --uri http://127.0.0.1:19530 --embed-model M --bulk-dir /data/bulk
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.ml.inference.base import ModelHandler, PredictionResult, RunInference
from apache_beam.options.pipeline_options import PipelineOptions

from formats import fs
from formats.manifest import Manifest
from formats.shards import file_sha256, list_shards, relative_name, shards_dir
from pipelines.jobs.index_config import IndexJobConfig
from retrieval.crops import CropItem, iter_crops
from retrieval.index import BulkWriter, IndexRow, ShardedIndex, bulk_import

NAMESPACE = "scifolio.index"
# A staged bulk file: shard, writer id (one per bundle), part (BulkWriter's rows_per_file split).
STAGED_RE = re.compile(r"^s(\d{2,})-([0-9a-f]{32})-(\d{5})\.parquet$")
LAYOUT_FILE = "layout.json"


class BulkRefused(ValueError):
    """The bulk path cannot run against this index (Milvus Lite, non-empty collections, other shard layout)."""


def _marker(state_dir: str, source: str) -> str:
    return fs.join(state_dir, source.replace(os.sep, "__") + ".done")


def pending_shards(cfg: IndexJobConfig) -> list[str]:
    """Shard files (relative to ``OUT/shards``) without a valid done marker. The manifest's sha256 of each file is
    trusted when it exists (no re-hashing); shards listed without a manifest are hashed."""
    try:
        known = {e.file: e.sha256 for e in Manifest.read(cfg.out).shards}
    except FileNotFoundError:
        known = {}
    pending = []
    for path in list_shards(cfg.out):
        rel = relative_name(path, cfg.out)
        m = _marker(cfg.resolved_state_dir, rel)
        if fs.exists(m) and json.loads(fs.read_text(m)).get("sha256") == (known.get(rel) or file_sha256(path)):
            continue
        pending.append(rel)
    return pending


class ReadCrops(beam.DoFn):
    """shard file (relative path) → its crops, once per sha256 per file; also emits (file, 0) so a file with
    no crops still gets its done marker."""

    def __init__(self, out: str):
        self.out = out
        self.read = Metrics.counter(NAMESPACE, "crops_read")
        self.files = Metrics.counter(NAMESPACE, "shard_files_read")

    def process(self, rel: str) -> Iterator:
        seen: set[str] = set()
        for crop in iter_crops(fs.join(shards_dir(self.out), rel), self.out):
            if crop.sha256 in seen:  # chunk overlap repeats images; the first occurrence is the provenance
                continue
            seen.add(crop.sha256)
            self.read.inc()
            yield crop
        self.files.inc()
        yield beam.pvalue.TaggedOutput("files", (rel, 0))


def staged_files(bulk_dir: str | os.PathLike) -> list[Path]:
    """Every complete staged bulk file in ``bulk_dir`` (absolute paths, sorted)."""
    root = Path(bulk_dir).absolute()
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if STAGED_RE.match(p.name))


def staged_ids(bulk_dir: str | os.PathLike) -> set[str]:
    """sha256 of every crop already staged (reads one column per file)."""
    import pyarrow.parquet as pq

    out: set[str] = set()
    for f in staged_files(bulk_dir):
        out.update(pq.read_table(f, columns=["sha256"]).column("sha256").to_pylist())
    return out


def stage_batch(rows: Sequence[IndexRow], bulk_dir: str, n_shards: int) -> int:
    """Stage one batch as its own bulk files (per shard; each moved in whole). Returns rows staged (repeats
    inside the batch fold, as upsert does)."""
    with BulkWriter(bulk_dir, n_shards) as w:
        return w.add(rows)


class _Loaded:
    """The loaded handlers and models (Beam keeps a weak reference to what ``load_model`` returns: no tuple)."""

    def __init__(self, *parts):
        self.parts = parts


class CropEmbedding(ModelHandler):
    """Beam's ``ModelHandler`` over the retrieval handlers: ``load_model`` loads the embedder (and the optional
    captioner) once per worker; ``run_inference`` captions and embeds one batch of crops. Emits
    ``PredictionResult(crop, (vector, caption))``."""

    def __init__(self, cfg: IndexJobConfig):
        super().__init__()
        self.cfg = cfg

    def load_model(self):
        from retrieval.caption import CaptionConfig, Captioner
        from retrieval.embed import EmbedConfig, STEmbedder

        embedder = STEmbedder(EmbedConfig(self.cfg.embed_model, self.cfg.batch_size, self.cfg.device))
        captioner = (
            Captioner(CaptionConfig(self.cfg.caption_model, device=self.cfg.device)) if self.cfg.caption_model else None
        )
        texter = (
            STEmbedder(EmbedConfig(self.cfg.text_model, self.cfg.batch_size, self.cfg.device))
            if self.cfg.text_model
            else None
        )
        return _Loaded(
            embedder,
            embedder.load(),
            captioner,
            captioner.load() if captioner else None,
            texter,
            texter.load() if texter else None,
        )

    def run_inference(self, batch: Sequence[CropItem], model, inference_args=None) -> Iterable[PredictionResult]:
        from retrieval.channels import channel_text

        embedder, embed_model, captioner, caption_model, texter, text_model = model.parts
        pngs = [c.png for c in batch]
        captions = captioner.run_batch(pngs, caption_model) if captioner else [""] * len(batch)
        vecs = embedder.run_batch(pngs, embed_model)
        if texter is None:
            return [PredictionResult(c, (v, cap, "", None)) for c, v, cap in zip(batch, vecs, captions)]
        texts = [channel_text(cap or c.caption, c.citing, c.context) for c, cap in zip(batch, captions)]
        tvecs = texter.run_batch_texts(texts, text_model)
        return [PredictionResult(c, (v, cap, t, tv)) for c, v, cap, t, tv in zip(batch, vecs, captions, texts, tvecs)]

    def batch_elements_kwargs(self) -> dict[str, int]:
        return {"min_batch_size": self.cfg.batch_size, "max_batch_size": self.cfg.batch_size}

    def share_model_across_processes(self) -> bool:
        return False


class _IndexDoFn(beam.DoFn):
    """Opens the index in setup (creating the collections on first use is the writers' job)."""

    def __init__(self, cfg: IndexJobConfig):
        self.cfg = cfg

    def setup(self) -> None:
        self.index = ShardedIndex(self.cfg.index)

    def teardown(self) -> None:  # best effort only: nothing relies on it
        index = getattr(self, "index", None)
        if index is not None:
            index.close()


class SkipStored(_IndexDoFn):
    """A batch of crops → the ones not yet stored (or staged); skipped crops count for their file at once
    (``files`` output), before any embedding (the expensive step)."""

    def __init__(self, cfg: IndexJobConfig):
        super().__init__(cfg)
        self.skipped = Metrics.counter(NAMESPACE, "crops_skipped_existing")
        self.batches = Metrics.counter(NAMESPACE, "batches")

    def setup(self) -> None:
        super().setup()
        # Bulk path: the collections are empty (checked by the driver); what a resumed run can skip is what an
        # earlier attempt already staged. Files staged concurrently by other workers are deduped by the driver.
        self.staged_before = staged_ids(self.cfg.bulk_dir) if self.cfg.bulk_dir and self.cfg.skip_existing else set()

    def process(self, batch: Sequence[CropItem]) -> Iterator:
        self.batches.inc()
        first = {c.sha256: c for c in reversed(batch)}  # the first occurrence of each crop in the batch
        todo = [c for c in batch if first[c.sha256] is c]
        stored: set[str] = set()
        if self.cfg.skip_existing and todo:
            stored = (
                {c.sha256 for c in todo} & self.staged_before
                if self.cfg.bulk_dir
                else (self.index.existing(c.sha256 for c in todo) if self.index.exists() else set())
            )
            self.skipped.inc(len(stored))
        for c in batch:  # a crop repeated inside the batch (from another file) still counts for its own file
            if first[c.sha256] is c and c.sha256 not in stored:
                yield c
            else:
                yield beam.pvalue.TaggedOutput("files", (c.source, 1))


class WriteRows(_IndexDoFn):
    """Embedded crops → index rows → upsert, or stage as bulk files when ``cfg.bulk_dir`` is set.
    Emits (file, 1) per crop."""

    def __init__(self, cfg: IndexJobConfig):
        super().__init__(cfg)
        self.written = Metrics.counter(NAMESPACE, "crops_written")
        self.staged = Metrics.counter(NAMESPACE, "crops_staged")
        self.skipped = Metrics.counter(NAMESPACE, "crops_skipped_existing")

    def start_bundle(self) -> None:
        self.writer: BulkWriter | None = None

    def finish_bundle(self) -> None:
        # The bundle's (file, 1) outputs reach MarkDone only after this returns: files are in before markers.
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def process(self, batch: Sequence[PredictionResult]) -> Iterator[tuple[str, int]]:
        rows = [IndexRow.from_crop(r.example, *r.inference) for r in batch]
        if rows and not getattr(self, "ready", False):
            # also on the bulk path: creates the collections, checks dim and schema (text channels or not)
            tv = rows[0].text_vector
            self.index.ensure(len(rows[0].vector), 0 if tv is None else len(tv))
            self.ready = True
        if rows and self.cfg.skip_existing and not self.cfg.bulk_dir:
            # A crop held by two shard files can pass SkipStored in two batches before either is written (every
            # skip check runs before RunInference): the later batch finds it here and does not write it again.
            stored = self.index.existing(r.sha256 for r in rows)
            self.skipped.inc(len(stored))
            rows = [r for r in rows if r.sha256 not in stored]
        if self.cfg.bulk_dir:
            if self.writer is None:
                self.writer = BulkWriter(self.cfg.bulk_dir, self.cfg.index.n_shards)
            self.staged.inc(self.writer.add(rows))
        elif rows:
            self.written.inc(self.index.upsert(rows))
        for r in batch:
            yield r.example.source, 1


class MarkDone(beam.DoFn):
    """After every batch of a file is written (the GroupByKey barrier), record the file as done."""

    def __init__(self, out: str, state_dir: str):
        self.out = out
        self.state_dir = state_dir
        self.done = Metrics.counter(NAMESPACE, "shard_files_done")

    def process(self, item: tuple[str, Iterable[int]]) -> Iterator[str]:
        rel, counts = item
        marker = _marker(self.state_dir, rel)
        sha = file_sha256(fs.join(shards_dir(self.out), rel))
        fs.write_text(marker, json.dumps({"file": rel, "sha256": sha, "crops": int(sum(counts))}))
        self.done.inc()
        yield rel


def build(p: beam.Pipeline, cfg: IndexJobConfig, files: list[str]):
    read = (
        p
        | "ShardFiles" >> beam.Create(files)
        | "Reshuffle" >> beam.Reshuffle()
        | "ReadCrops" >> beam.ParDo(ReadCrops(cfg.out)).with_outputs("files", main="crops")
    )
    pending = (
        read.crops
        | "Batch" >> beam.BatchElements(min_batch_size=cfg.batch_size, max_batch_size=cfg.batch_size)
        | "SkipStored" >> beam.ParDo(SkipStored(cfg)).with_outputs("files", main="crops")
    )
    written = (
        pending.crops
        | "RunInference" >> RunInference(CropEmbedding(cfg))
        | "BatchRows" >> beam.BatchElements(min_batch_size=cfg.batch_size, max_batch_size=cfg.batch_size)
        | "WriteRows" >> beam.ParDo(WriteRows(cfg))
    )
    return (
        (written, pending.files, read.files)
        | "Flatten" >> beam.Flatten()
        | "PerFile" >> beam.GroupByKey()
        | "MarkDone" >> beam.ParDo(MarkDone(cfg.out, str(cfg.resolved_state_dir)))
    )


def prepare_bulk(cfg: IndexJobConfig) -> None:
    """Driver-side checks before any work on the bulk path; raises BulkRefused with what to do instead."""
    assert cfg.bulk_dir
    if cfg.index.is_lite:
        raise BulkRefused(
            f"--bulk-dir needs a Milvus server: {cfg.index.uri!r} is Milvus Lite, which has no bulk import "
            "service. Give a server URI (http://host:19530), or build a Lite index without --bulk-dir (upserts)."
        )
    if cfg.text_model:
        raise BulkRefused(
            "--bulk-dir stages image vectors only; the text channels are written by upserts. Build without "
            "--bulk-dir, or with --text-model none for an image-only index."
        )
    with ShardedIndex(cfg.index) as ix:
        n = sum(
            int(ix.cl(i).query(name, filter="", output_fields=["count(*)"], consistency_level="Strong")[0]["count(*)"])
            for i, name in enumerate(ix.names)
            if ix.cl(i).has_collection(name)
        )
        if n:
            raise BulkRefused(
                f"collections {ix.names} at {cfg.index.uri} already hold {n} rows; bulk import only "
                "loads empty collections (it inserts, so stored ids would be duplicated). Add shards to a built "
                "index without --bulk-dir (upserts skip stored crops), or drop the collections to re-import."
            )
    root = Path(cfg.bulk_dir)
    root.mkdir(parents=True, exist_ok=True)
    layout = root / LAYOUT_FILE
    want = {"n_shards": cfg.index.n_shards}
    if layout.exists():
        have = json.loads(layout.read_text())
        if have != want:
            raise BulkRefused(f"{root} holds files staged for {have}, this build has {want}; use another --bulk-dir")
    else:
        layout.write_text(json.dumps(want))
    for tmp in root.glob(".*.tmp"):  # files a crashed worker never moved in
        tmp.unlink()


def dedupe_staged(files: Sequence[Path]) -> int:
    """Drop rows whose sha256 an earlier file (in path order) already holds: the same crop in two shard files,
    or a batch staged again by a retried bundle. Rewrites (or removes) the affected files; returns rows dropped."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    seen: set[str] = set()
    dropped = 0
    for f in files:
        keep = []
        for i in pq.read_table(f, columns=["sha256"]).column("sha256").to_pylist():
            keep.append(i not in seen)
            seen.add(i)
        if all(keep):
            continue
        dropped += keep.count(False)
        table = pq.read_table(f).filter(pa.array(keep))
        if table.num_rows:
            tmp = f.with_name(f".{f.name}.tmp")
            pq.write_table(table, tmp)
            fs.commit(tmp, f)
        else:
            f.unlink()
    return dropped


def import_staged(cfg: IndexJobConfig) -> dict[str, int]:
    """Dedupe and import every staged file of ``cfg.bulk_dir``; returns counts for the report."""
    import pyarrow.parquet as pq

    dropped = dedupe_staged(staged_files(cfg.bulk_dir))
    files = staged_files(cfg.bulk_dir)
    by_shard: dict[int, list[str]] = {}
    for f in files:
        by_shard.setdefault(int(STAGED_RE.match(f.name).group(1)), []).append(str(f))
    imported = 0
    if files:
        dim = len(pq.read_table(files[0], columns=["vector"]).column("vector")[0])
        with ShardedIndex(cfg.index) as ix:
            ix.ensure(dim)  # the workers created them, unless nothing was pending this run
            imported = bulk_import(ix, by_shard, timeout_s=cfg.bulk_timeout_s).rows
    return {"bulk_files": len(files), "bulk_duplicates_dropped": dropped, "rows_imported": imported}


def check_schema(cfg: IndexJobConfig) -> None:
    """Before any work: text channels on a server that lacks them, or a build whose schema (text channels or
    not) differs from the existing index's, raise ``TextChannelsUnsupported`` / ``SchemaMismatch`` with what to
    do instead (the workers check the vector dimensions again when they write)."""
    with ShardedIndex(cfg.index) as ix:
        if cfg.text_model:
            ix.check_text_support()
        ix.check_schema(-1 if cfg.text_model else 0)


def run(cfg: IndexJobConfig, beam_args: Sequence[str] = ()) -> dict[str, int]:
    """Run the job; returns Beam counter totals (plus ``shard_files_pending`` before the run, and on the bulk
    path ``bulk_files``, ``bulk_duplicates_dropped`` and ``rows_imported``). Raises BulkRefused before any work
    when the bulk path cannot load this index."""
    if cfg.bulk_dir:
        cfg = replace(cfg, bulk_dir=str(Path(cfg.bulk_dir).absolute()))  # the server resolves the paths
        prepare_bulk(cfg)
    check_schema(cfg)
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
    if cfg.bulk_dir:
        totals.update(import_staged(cfg))
    return totals
