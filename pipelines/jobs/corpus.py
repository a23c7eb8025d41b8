"""The corpus job on Apache Beam: PDFs → parsed pages → crops → [visual gain] → interleaved chunks → shards, and
series files (CSV/parquet/.tsf) → series rows in the same shards.

    scifolio build ../shared/samples --out out/ --tokenizer tiny/tokenizer
    scifolio build 'gs://bucket/pdfs/**.pdf' --out gs://... --runner DataflowRunner --project P ...

Graph:
    patterns → MatchAll → ReadAndHash (doc_id) → GroupByKey(doc_id) → dedupe (duplicates → dead letters)
      ├─ PDFs → [near-dup] → Reshuffle → ProcessDocument [parse → interleave → chunk; cached per doc; the next
      │     document is parsed while this one is built]
      │     └─ "pending" (visual gain on): parsed documents → RunInference(VisualGainScoring: the VLM loaded once
      │           per worker, documents batched up to the configured pages) → FinishDocument [thresholds →
      │           interleave → chunk; cached per doc]
      └─ series files → Reshuffle → ProcessSeries [read → one row per series; cached per file]
      → (all) finished documents
          ├─ main: finished documents → shard = hash(doc_id) mod N → GroupByKey → WriteShard (sorted)
          └─ "dropped": dead letters → GroupByKey(stage) → quarantine/<stage>.jsonl (sorted)
    Shard and quarantine writers each emit a BuildSummary of what they wrote (entry, doc ids, reasons, page
    scores) → CombineGlobally → counts and histograms in _work/parts.json; the driver adds Beam metrics and
    writes manifest.json without reading any shard or dead letter back.

Output is a function of the input set and the config only: doc ids are content hashes, shard
assignment hashes the doc id, rows inside a shard are sorted, so worker scheduling changes nothing.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.ml.inference.base import PredictionResult, RunInference
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.utils.windowed_value import WindowedValue

from formats import fs
from formats.manifest import QUARANTINE_DIR, SHARDS_DIR, Manifest, QuarantineEntry, ShardEntry, Totals
from formats.quarantine import quarantine_files, write_quarantine
from formats.records import Dropped
from formats.series import is_series_file
from formats.shards import SCHEMA_VERSION, table_chunks
from pipelines.assembly.build import (
    BuildConfig,
    DocResult,
    DocumentBuilder,
    PendingDocument,
    RetryableError,
    RetryPolicy,
    WorkStore,
    is_infrastructure_error,
    n_shards_for,
    retryable_result,
    shard_of,
    write_shard_from_docs,
)
from pipelines.assembly.summary import BuildSummary
from pipelines.jobs.scoring import ScoringOutcome, VisualGainScoring

log = logging.getLogger(__name__)
NAMESPACE = "scifolio"
PDF_SUFFIXES = (".pdf", ".PDF", ".Pdf")


@dataclass(frozen=True)
class JobPaths:
    out: str

    """Where the job writes under ``out`` (a local path or an object-store URL: every write goes through
    ``formats.fs``)."""

    @property
    def shards(self) -> str:
        return fs.join(self.out, SHARDS_DIR)

    @property
    def quarantine(self) -> str:
        return fs.join(self.out, QUARANTINE_DIR)

    def work(self, config_hash: str) -> str:
        return fs.join(self.out, "_work", config_hash)

    @property
    def parts(self) -> str:
        return fs.join(self.out, "_work", "parts.json")


def expand_inputs(inputs: Sequence[str]) -> list[str]:
    """Files, directories, globs or filesystem URLs → match patterns (directories mean every PDF and every series
    file, ``.csv``/``.parquet``/``.tsf``, below)."""
    patterns = []
    for item in inputs:
        if "://" not in item and os.path.isdir(item):
            patterns.append(os.path.join(os.path.abspath(item), "**"))
        elif "://" not in item and not any(ch in item for ch in "*?["):
            patterns.append(os.path.abspath(item))
        else:
            patterns.append(item.rstrip("/") + "/**" if item.endswith("/") else item)
    return patterns


def _is_dir_pattern(pattern: str) -> bool:
    return pattern.endswith("/**")


def corpus_file(path: str) -> bool:
    """What a directory input contributes: PDFs and series files."""
    return path.endswith(PDF_SUFFIXES) or is_series_file(path)


class ReadAndHash(beam.DoFn):
    """Matched file → (doc_id, path). Unreadable files become dead letters."""

    def process(self, meta: Any) -> Iterable[Any]:
        import hashlib

        path = meta.path
        try:
            with FileSystems.open(path) as f:
                h = hashlib.sha256()
                while block := f.read(1 << 20):
                    h.update(block)
        except Exception as e:  # a file that vanished or can't be read is a dead letter, not a crash
            Metrics.counter(NAMESPACE, "dropped.read.unreadable").inc()
            yield beam.pvalue.TaggedOutput("dropped", Dropped(path, "read", "unreadable", {"error": repr(e)}).to_row())
            return
        yield h.hexdigest(), path


def dedupe(element: tuple[str, Iterable[str]]) -> Iterable[Any]:
    """Same bytes under several paths: the smallest path is processed, the others are dead letters."""
    doc_id, paths = element
    paths = sorted(set(paths))
    yield doc_id, paths[0]
    for other in paths[1:]:
        Metrics.counter(NAMESPACE, "dropped.open.duplicate").inc()
        yield beam.pvalue.TaggedOutput(
            "dropped", Dropped(f"{doc_id}@{other}", "open", "duplicate", {"source": other, "kept": paths[0]}).to_row()
        )


def emit_result(store: WorkStore, result: DocResult) -> Iterator[Any]:
    """A built document: saved as done (unless retryable), its stats counted, its dead letters on "dropped", its
    doc_id on the main output when it has chunks."""
    if result.retryable:  # not marked done: the next run retries it
        Metrics.counter(NAMESPACE, "documents_retryable").inc()
        for d in result.dropped:
            Metrics.counter(NAMESPACE, f"dropped.{d.stage}.{d.reason}").inc()
            yield beam.pvalue.TaggedOutput("dropped", d.to_row())
        return
    yield from emit_done(store.save(result), result.dropped)


def emit_done(summary: dict[str, Any], dropped: Iterable[Dropped]) -> Iterator[Any]:
    for key, value in summary["stats"].items():
        Metrics.counter(NAMESPACE, key).inc(int(value))
    for d in dropped:
        Metrics.counter(NAMESPACE, f"dropped.{d.stage}.{d.reason}").inc()
        yield beam.pvalue.TaggedOutput("dropped", d.to_row())
    if summary["n_chunks"]:
        yield summary["doc_id"]


class ProcessDocument(beam.DoFn):
    """Parse, interleave and chunk one document; cached per doc_id under the work dir.

    With visual gain on, a parsed document with pages leaves on the "pending" output instead (a
    ``PendingDocument``): the job scores it through RunInference and ``FinishDocument`` builds it.

    Heavy objects (tokenizer, parser worker) are built in ``setup``; the tokenizer loads in a background thread
    while the parse worker starts up and parses the first document (a loading error is raised by ``process``
    before that document is built, not turned into a dead letter).

    One document of look-ahead within a bundle: ``process`` hands its document to the parse thread and then
    builds the *previous* one, so the parse worker reads document i+1 while this process crops, tokenises,
    chunks and saves document i (the parser otherwise idles during that work); ``finish_bundle`` builds the
    last. Every call on the parser (parse, retry, restart) goes through that one thread, in order.
    """

    def __init__(
        self,
        config: BuildConfig,
        work_root: str,
        parser_version: str,
        progress_total: int | None = None,
        retry: RetryPolicy | None = None,
    ):
        self.config = config
        self.work_root = work_root
        self.parser_version = parser_version
        self.progress_total = progress_total
        self.retry = retry or RetryPolicy()

    def setup(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from parsing import warm_up

        # The parse worker loads MinerU and starts its helpers while this process loads the tokenizer.
        if self.config.parse is not None:
            warm_up(self.config.parse)
        self.store = WorkStore(self.work_root)
        self._builder = _in_background(DocumentBuilder, self.config)
        self._parser = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parse-ahead")
        self._ahead: _Ahead | None = None
        self._bar = None
        if self.progress_total:
            from tqdm import tqdm

            self._bar = tqdm(total=self.progress_total, desc="documents", unit="doc", file=sys.stderr, leave=False)

    def start_bundle(self) -> None:
        self._ahead = None

    def process(
        self, element: tuple[str, str], window: Any = beam.DoFn.WindowParam, timestamp: Any = beam.DoFn.TimestampParam
    ) -> Iterable[Any]:
        doc_id, source = element
        summary = self.store.done(doc_id)
        if summary is not None:
            Metrics.counter(NAMESPACE, "documents_resumed").inc()
            yield from emit_done(summary, self.store.dropped(doc_id))
            self._tick()
            return
        ahead = _Ahead(doc_id, source, window, timestamp, self._parser.submit(self._read_and_parse, source))
        previous, self._ahead = self._ahead, ahead
        if previous is not None:
            yield from self._finish(previous)

    def finish_bundle(self) -> Iterable[Any]:
        last, self._ahead = self._ahead, None
        if last is None:
            return
        for out in self._finish(last):  # outside process(): outputs carry their element's window explicitly
            tag = out.tag if isinstance(out, beam.pvalue.TaggedOutput) else None
            value = WindowedValue(out.value if tag else out, last.timestamp, [last.window])
            yield value if tag is None else beam.pvalue.TaggedOutput(tag, value)

    def _finish(self, ahead: _Ahead) -> Iterator[Any]:
        t0 = time.perf_counter()
        result, parse_s = self._build_with_retries(ahead)
        Metrics.distribution(NAMESPACE, "doc_ms").update(int((time.perf_counter() - t0 + parse_s) * 1000))
        if isinstance(result, PendingDocument) and result.pages:
            yield beam.pvalue.TaggedOutput("pending", result)  # scored by RunInference, built by FinishDocument
        else:
            if isinstance(result, PendingDocument):  # no page to score
                result = self._builder.result().finish(result, None)
            yield from emit_result(self.store, result)
        self._tick()

    def _tick(self) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def _read_and_parse(self, source: str) -> tuple[bytes, _Parsed, float]:
        """On the parse thread: the document's bytes and its parse records (a parse error is replayed to the
        builder; a read error is raised by the Future)."""
        from parsing import iter_parse

        t0 = time.perf_counter()
        with FileSystems.open(source) as f:
            data = f.read()
        return data, _Parsed(iter_parse(data, source, self.config.parse)), time.perf_counter() - t0

    def _build_with_retries(self, ahead: _Ahead) -> tuple[DocResult | PendingDocument, float]:
        """Read, parse and build (with visual gain on: prepare, the page filter comes later); an infrastructure
        failure (out of memory, I/O, a failing model or backend) is retried with exponential backoff, and one
        that persists gives a ``retryable`` result. The first attempt uses the look-ahead parse; a retry
        re-reads and re-parses on the parse thread, after the look-ahead parse already queued there. Returns the
        result and the seconds the parse thread spent reading and parsing it (for the ``doc_ms`` metric)."""
        from parsing.api import close_default_parser

        doc_id, source = ahead.doc_id, ahead.source
        parsing = ahead.parsed
        parse_s = 0.0
        for attempt in range(1, self.retry.attempts + 1):
            try:
                data, parsed, seconds = parsing.result()
                parse_s += seconds
                builder = self._builder.result()
                if self.config.visual_gain is not None:
                    return builder.prepare(data, source, parsed), parse_s
                return builder.build(data, source, parsed), parse_s
            except Exception as e:
                if not is_infrastructure_error(e):
                    raise
                log.warning("%s: attempt %d/%d failed: %r", source, attempt, self.retry.attempts, e)
                # the next try (and document) gets a fresh parse worker; queued behind any look-ahead parse
                self._parser.submit(close_default_parser).result()
                if attempt == self.retry.attempts:
                    return retryable_result(doc_id, source, e, attempt), parse_s
                Metrics.counter(NAMESPACE, "build_retries").inc()
                time.sleep(self.retry.backoff_s * 2 ** (attempt - 1))
                parsing = self._parser.submit(self._read_and_parse, source)
        raise AssertionError("unreachable")

    def teardown(self) -> None:
        if getattr(self, "_parser", None) is not None:
            self._parser.shutdown(wait=True, cancel_futures=True)
        if getattr(self, "_bar", None) is not None:
            self._bar.close()


@dataclass
class _Ahead:
    """A document handed to the parse thread, built when the next one arrives (or at the end of the bundle)."""

    doc_id: str
    source: str
    window: Any
    timestamp: Any
    parsed: Future[tuple[bytes, _Parsed, float]]


class FinishDocument(beam.DoFn):
    """A document scored by the visual-gain RunInference step → thresholds (and the review export) → interleave
    → chunk → saved as done; outputs as ``ProcessDocument``'s. A scoring failure ends here: an infrastructure
    one leaves the document retryable (the scoring step already retried it), any other is its final
    ``build/error`` dead letter, as when the scorer ran inside the build."""

    def __init__(self, config: BuildConfig, work_root: str, retry: RetryPolicy | None = None):
        self.config = config
        self.work_root = work_root
        self.retry = retry or RetryPolicy()

    def setup(self) -> None:
        from pipelines.jobs.stages import VisualGainDecider

        self.store = WorkStore(self.work_root)
        self.builder = DocumentBuilder(self.config)
        self.decide = VisualGainDecider(self.config.visual_gain)

    def process(self, scored: PredictionResult) -> Iterable[Any]:
        doc: PendingDocument = scored.example
        outcome: ScoringOutcome = scored.inference
        yield from emit_result(self.store, self._result(doc, outcome))

    def _result(self, doc: PendingDocument, outcome: ScoringOutcome) -> DocResult:
        if outcome.pages is None:
            detail = {"source": doc.source, "error": outcome.error, "traceback": outcome.traceback}
            if outcome.infrastructure:
                detail["attempts"] = outcome.attempts
                return DocResult(
                    doc.doc_id, doc.source, [], [Dropped(doc.doc_id, "build", "retryable", detail)], {}, retryable=True
                )
            return DocResult(doc.doc_id, doc.source, [], [Dropped(doc.doc_id, "build", "error", detail)], {})
        pages = outcome.pages
        for attempt in range(1, self.retry.attempts + 1):
            try:  # an infrastructure failure here (the review export's I/O) is retried as the build's
                return self.builder.finish(doc, lambda document, _unscored: self.decide(document, pages))
            except RetryableError as e:
                log.warning("%s: attempt %d/%d failed: %r", doc.source, attempt, self.retry.attempts, e)
                if attempt == self.retry.attempts:
                    return retryable_result(doc.doc_id, doc.source, e, attempt)
                Metrics.counter(NAMESPACE, "build_retries").inc()
                time.sleep(self.retry.backoff_s * 2 ** (attempt - 1))
        raise AssertionError("unreachable")


def _in_background(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """``fn(*args)`` in a daemon thread; the Future holds its result or its error."""
    fut: Future[Any] = Future()

    def run() -> None:
        try:
            fut.set_result(fn(*args))
        except BaseException as e:
            fut.set_exception(e)

    threading.Thread(target=run, name=f"load-{getattr(fn, '__name__', 'object')}", daemon=True).start()
    return fut


class _Parsed:
    """Parse records collected now (so parsing overlaps the tokenizer's loading), replayed to the builder;
    an error raised while parsing is re-raised at the same point of the replay."""

    def __init__(self, records: Iterable[Any]) -> None:
        self.records: list[Any] = []
        self.error: Exception | None = None
        try:
            for r in records:
                self.records.append(r)
        except Exception as e:
            self.error = e

    def __iter__(self) -> Iterator[Any]:
        yield from self.records
        if self.error is not None:
            raise self.error


class ProcessSeries(beam.DoFn):
    """One series file → its series rows (``pipelines/assembly/series.py``), cached per file id under the work dir
    like a document; a bad file's dead letter goes to ``quarantine/series.jsonl``."""

    def __init__(self, config: BuildConfig, work_root: str) -> None:
        self.config = config
        self.work_root = work_root

    def setup(self) -> None:
        from pipelines.assembly.series import SeriesBuilder

        self.store = WorkStore(self.work_root)
        self.builder = SeriesBuilder(self.config)

    def process(self, element: tuple[str, str]) -> Iterable[Any]:
        doc_id, source = element
        summary = self.store.done(doc_id)
        if summary is not None:
            Metrics.counter(NAMESPACE, "series_files_resumed").inc()
            dropped = self.store.dropped(doc_id)
        else:
            with FileSystems.open(source) as f:
                data = f.read()
            summary = self.store.save(self.builder.build(data, source))
            dropped = self.store.dropped(doc_id)
        yield from emit_done(summary, dropped)


class WriteShard(beam.DoFn):
    def __init__(self, work_root: str, out_dir: str):
        self.work_root = work_root
        self.out_dir = out_dir

    def process(self, element: tuple[tuple[int, int], Iterable[str]]) -> Iterable[BuildSummary]:
        (index, n_shards), doc_ids = element
        chunks: list = []

        def seen(table) -> None:  # only the key columns and page provenance, decoded from memory
            chunks.extend(table_chunks(table, parts=("pages",)))

        entry = write_shard_from_docs(WorkStore(self.work_root), self.out_dir, index, n_shards, doc_ids, seen)
        Metrics.counter(NAMESPACE, "shards").inc()
        yield BuildSummary.of_shard(entry, chunks)


def write_stage(directory: str, stage: str, rows: Iterable[dict[str, Any]]) -> BuildSummary:
    rows = list(rows)
    return BuildSummary.of_quarantine(write_quarantine(directory, stage, rows), rows)


class CombineSummaries(beam.CombineFn):
    """Merges the writers' BuildSummary parts into the manifest's counts (datatrove merges its stats so)."""

    def __init__(self, visual_gain: bool):
        self.visual_gain = visual_gain

    def create_accumulator(self) -> BuildSummary:
        return BuildSummary()

    def add_input(self, acc: BuildSummary, part: BuildSummary) -> BuildSummary:
        return acc.merge(part)

    def merge_accumulators(self, accs: Iterable[BuildSummary]) -> BuildSummary:
        out = BuildSummary()
        for a in accs:
            out.merge(a)
        return out

    def extract_output(self, acc: BuildSummary) -> dict[str, Any]:
        return acc.finish(self.visual_gain)


def build_pipeline(
    p: beam.Pipeline,
    inputs: Sequence[str],
    config: BuildConfig,
    out: str,
    parser_version: str,
    progress_total: int | None = None,
    retry: RetryPolicy | None = None,
) -> dict[str, beam.PCollection]:
    paths = JobPaths(out)
    config_hash = config.config_hash(parser_version)
    work_root = str(paths.work(config_hash))
    patterns = expand_inputs(inputs)

    out_root = out.rstrip("/") + "/" if "://" in out else os.path.abspath(out) + os.sep

    def keep(meta: Any) -> bool:
        # Directory expansion takes PDFs and series files; explicitly named files and globs are validated whatever
        # they are. Nothing under --out is an input (its shards are parquet files).
        if meta.path.endswith("/") or meta.path.startswith(out_root):
            return False
        return corpus_file(meta.path) or not dir_only(meta.path)

    dir_roots = tuple(pt[:-2] for pt in patterns if _is_dir_pattern(pt))

    def dir_only(path: str) -> bool:
        return any(path.startswith(r) for r in dir_roots)

    matched = (
        p
        | "Patterns" >> beam.Create(patterns)
        | "Match" >> fileio.MatchAll(fileio.EmptyMatchTreatment.DISALLOW)
        | "OnlyFiles" >> beam.Filter(keep)
    )
    hashed = matched | "ReadAndHash" >> beam.ParDo(ReadAndHash()).with_outputs("dropped", main="docs")
    unique = (
        hashed.docs
        | "ByDocId" >> beam.GroupByKey()
        | "Dedupe" >> beam.FlatMap(dedupe).with_outputs("dropped", main="docs")
    )
    split = unique.docs | "SeriesOrPdf" >> beam.Partition(lambda kv, n: int(is_series_file(kv[1])), 2)
    pdfs, series_files = split[0], split[1]
    series = (
        series_files
        | "SpreadSeries" >> beam.Reshuffle()
        | "ProcessSeries" >> beam.ParDo(ProcessSeries(config, work_root)).with_outputs("dropped", main="docs")
    )
    to_build, near_dropped = pdfs, None
    if config.dedup is not None:  # near-duplicates (the same paper as other bytes) go before any parsing
        from pipelines.jobs.dedup import FirstPagesText, NearDuplicates

        texts = pdfs | "FirstPagesText" >> beam.ParDo(FirstPagesText(config.dedup))
        near = texts | "NearDuplicates" >> NearDuplicates(config.dedup)
        near_dropped = near["dropped"]
        to_build = (
            {"path": pdfs, "kept": near["kept"] | "KeptKey" >> beam.Map(lambda d: (d, True))}
            | "JoinKept" >> beam.CoGroupByKey()
            | "OnlyKept" >> beam.FlatMap(lambda kv: [(kv[0], kv[1]["path"][0])] if kv[1]["kept"] else [])
        )
    processed = (
        to_build
        | "Spread" >> beam.Reshuffle()
        | "ProcessDocument"
        >> beam.ParDo(ProcessDocument(config, work_root, parser_version, progress_total, retry)).with_outputs(
            "dropped", "pending", main="docs"
        )
    )
    docs = [processed.docs, series.docs]
    dropped = [
        hashed.dropped,
        unique.dropped,
        processed.dropped,
        series.dropped,
        *([near_dropped] if near_dropped is not None else []),
    ]
    if config.visual_gain is not None:
        finished = (
            processed.pending
            | "VisualGain" >> RunInference(VisualGainScoring(config.visual_gain, retry))
            | "FinishDocument"
            >> beam.ParDo(FinishDocument(config, work_root, retry)).with_outputs("dropped", main="docs")
        )
        docs.append(finished.docs)
        dropped.append(finished.dropped)
    outputs = write_outputs(tuple(docs) | "AllFinished" >> beam.Flatten(), dropped, config, work_root, out)
    return {**outputs, "config_hash": config_hash}


def write_outputs(
    docs: beam.PCollection, dropped: Sequence[beam.PCollection], config: BuildConfig, work_root: str, out: str
) -> dict[str, beam.PCollection]:
    """Finished doc ids → shards; dead letters → quarantine; what both writers saw → combined → parts.json."""
    paths = JobPaths(out)
    # ----- shards: N derived from the number of finished documents, assignment by doc_id hash -----
    n_docs = docs | "CountDocs" >> beam.combiners.Count.Globally()
    entries = (
        docs
        | "AssignShard"
        >> beam.Map(
            lambda doc_id, n: (
                (shard_of(doc_id, n_shards_for(n, config.docs_per_shard)), n_shards_for(n, config.docs_per_shard)),
                doc_id,
            ),
            n=beam.pvalue.AsSingleton(n_docs),
        )
        | "ByShard" >> beam.GroupByKey()
        | "WriteShard" >> beam.ParDo(WriteShard(work_root, str(paths.shards)))
    )
    # ----- dead letters: one sorted jsonl per stage -----
    written_dropped = (
        tuple(dropped)
        | "AllDropped" >> beam.Flatten()
        | "ByStage" >> beam.Map(lambda row: (row["stage"], row))
        | "GroupStage" >> beam.GroupByKey()
        | "WriteQuarantine" >> beam.MapTuple(lambda stage, rows: write_stage(paths.quarantine, stage, rows))
    )
    collected = (
        (entries, written_dropped)
        | "FlattenOut" >> beam.Flatten()
        | "Summarise" >> beam.CombineGlobally(CombineSummaries(config.visual_gain is not None))
        | "WriteParts" >> beam.Map(_write_parts, out=out)
    )
    return {"entries": entries, "dropped": written_dropped, "parts": collected}


def _write_parts(summary: dict[str, Any], out: str) -> str:
    path = JobPaths(out).parts
    fs.write_text(path, json.dumps(summary, sort_keys=True))
    return path


def list_inputs(inputs: Sequence[str], out: str | None = None, series: bool = True) -> list[str]:
    """The distinct files the job reads: every PDF (and series file, unless ``series`` is False) below a directory,
    whatever a file or glob names (nothing under ``out``, when given)."""
    paths: set[str] = set()
    out_root = None if out is None else (out.rstrip("/") + "/" if "://" in out else os.path.abspath(out) + os.sep)
    for pattern in expand_inputs(inputs):
        for m in FileSystems.match([pattern])[0].metadata_list:
            if out_root is not None and m.path.startswith(out_root):
                continue
            if not _is_dir_pattern(pattern) or m.path.endswith(PDF_SUFFIXES) or (series and is_series_file(m.path)):
                paths.add(m.path)
    return sorted(paths)


def count_inputs(inputs: Sequence[str], out: str | None = None) -> int | None:
    """Number of files the job will read (local inputs only; None when unknown/remote)."""
    if any("://" in pattern for pattern in expand_inputs(inputs)):
        return None
    try:
        return len(list_inputs(inputs, out))
    except Exception:
        return None


def local_beam_args(config: BuildConfig, cores: int | None = None) -> list[str]:
    """DirectRunner settings for a local ``scifolio build``: one Beam worker per ``1 + backend_lanes`` cores.

    Each Beam worker owns a parse worker that runs MinerU in ``1 + parse.backend_lanes`` processes (about a
    core each) plus the clean-up/crop helpers, so one Beam worker per core oversubscribes the machine: on
    2 cores two workers measured 0.65x the pages/s of a bare MinerU loop, one worker 0.85-0.93x
    (benchmarks/RESULTS.md). A single worker runs in-memory (no extra Beam process); at most 8.
    """
    n = max(1, min((cores or os.cpu_count() or 1) // (1 + config.parse.backend_lanes), 8))
    if n == 1:
        return ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
    return ["--direct_running_mode=multi_processing", f"--direct_num_workers={n}"]


def run(
    inputs: Sequence[str],
    out: str,
    config: BuildConfig,
    beam_args: Sequence[str] = (),
    progress: bool = True,
    retry: RetryPolicy | None = None,
) -> Manifest:
    """Run the job and write ``OUT/manifest.json``; returns the manifest."""
    from parsing import PARSER_VERSION, available_backends

    options = PipelineOptions(list(beam_args))
    standard = options.view_as(beam.options.pipeline_options.StandardOptions)
    if "--runner" not in " ".join(beam_args):
        standard.runner = "DirectRunner"
    elif standard.runner == "DaskRunner":  # Beam's, with multi-output transforms split (pipelines.jobs.dask_runner)
        standard.runner = "pipelines.jobs.dask_runner.DaskRunner"
    fs.makedirs(out)
    n_inputs = count_inputs(inputs, out)
    t0 = time.time()
    p = beam.Pipeline(options=options)
    graph = build_pipeline(p, inputs, config, out, PARSER_VERSION, n_inputs if progress else None, retry)
    result = p.run()
    result.wait_until_finish()
    elapsed = time.time() - t0
    try:
        queried = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))["counters"]
    except NotImplementedError:  # a runner without metrics (Beam's DaskRunner): the manifest has no counters
        queried = []
    counters = {c.key.metric.name: c.committed if c.committed is not None else c.attempted for c in queried}
    manifest = write_manifest(
        out,
        config,
        config_hash=graph["config_hash"],
        parser_version=PARSER_VERSION,
        backends=available_backends(),
        counters=counters,
        n_inputs=n_inputs,
        inputs=inputs,
        elapsed_s=elapsed,
    )
    return manifest


def write_manifest(
    out: str,
    config: BuildConfig,
    *,
    config_hash: str,
    parser_version: str,
    backends: dict[str, str],
    counters: dict[str, int],
    n_inputs: int | None,
    inputs: Sequence[str],
    elapsed_s: float,
) -> Manifest:
    """Write ``OUT/manifest.json`` from the pipeline's combined summary (``_work/parts.json``, O(shards + stages +
    domains)) and the driver's own facts. Reads no shard and no dead letter; lists the output folders only to
    remove files an earlier run with another shard count left."""
    paths = JobPaths(out)
    parts = json.loads(fs.read_text(paths.parts))
    shards = [ShardEntry(**e) for e in parts["shards"]]
    quarantine = [QuarantineEntry(**e) for e in parts["quarantine"]]
    # shards from an earlier run with another shard count are stale: remove them so the folder = manifest
    keep = {e.file for e in shards}
    for stale in fs.glob(fs.join(paths.shards, "shard-*.parquet")):
        if os.path.basename(stale) not in keep:
            fs.remove(stale)
    keep_q = {e.file for e in quarantine}
    for stale in quarantine_files(paths.quarantine):
        if os.path.basename(stale) not in keep_q:
            fs.remove(stale)
    manifest = Manifest(
        schema_version=SCHEMA_VERSION,
        created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        inputs=list(inputs),
        config=config.config_dict(),
        config_hash=config_hash,
        parser_version=parser_version,
        parser_backends=backends,
        shards=shards,
        totals=Totals(
            input_files=n_inputs,
            documents_in_shards=parts["documents_in_shards"],
            documents_quarantined=parts["documents_quarantined"],
            chunks=sum(e.rows for e in shards),
            tokens=sum(e.tokens for e in shards),
            documents_retryable=parts["documents_retryable"],
            documents_failed=parts["documents_failed"],
            documents_filtered=parts["documents_filtered"],
            pages=int(counters.get("pages", 0)),
            pages_failed=parts["pages_failed"],
            pages_filtered=parts["pages_filtered"],
            series_files=int(counters.get("series_files", 0)),
            series=int(counters.get("series", 0)),
            series_points=int(counters.get("series_points", 0)),
            series_files_quarantined=sum(
                n for key, n in parts["dropped_by_reason"].items() if key.startswith("series.")
            ),
        ),
        dropped_by_reason=parts["dropped_by_reason"],
        quarantine=quarantine,
        metrics=dict(sorted(counters.items())),
        elapsed_s=round(elapsed_s, 2),
        visual_gain=parts["visual_gain"],
    )
    manifest.write(out)
    return manifest
