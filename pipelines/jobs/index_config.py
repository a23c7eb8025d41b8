"""The image-index ingest job's config, Beam-free so the CLI reads its defaults without importing Beam.

scifolio index build --shards out --uri ./index.db --embed-model tiny/retrieval/clip
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from formats import fs
from retrieval.index import IndexConfig


@dataclass(frozen=True)
class IndexJobConfig:
    out: str
    """Build output directory (``scifolio build --out``): its manifest lists the shards and their sha256."""
    index: IndexConfig
    """Where and how to write (URI, collection prefix, number of shards, index type)."""
    embed_model: str
    """sentence-transformers image+text model (hub name or path); its dimension sizes the collections."""
    caption_model: str | None = None
    """Optional image-to-text model: store a generated caption with every crop (slower ingest)."""
    text_model: str | None = None
    """Sentence embedder of the text channels (``retrieval.channels``: caption + citing sentences + context →
    ``text_vector``, plus Milvus BM25 over the same text). None = an image-only index."""
    batch_size: int = 32
    """Crops per embedding batch (and per upsert)."""
    state_dir: str | None = None
    """Where ``.done`` markers live; default ``<out>/_index_state/<collection prefix>``."""
    skip_existing: bool = True
    """Skip crops already in the index (resume; keeps stored quality scores)."""
    device: str = "cpu"
    """torch device for the models."""
    bulk_dir: str | None = None
    """Stage embedded batches as Milvus bulk-import parquet files here instead of upserting, then import them
    after the pipeline (empty collections on a server only). Must be readable by the Milvus server at the same
    absolute path. None = upsert rows (the default)."""
    bulk_timeout_s: float = 3600.0
    """How long the driver waits for the imported rows to be searchable (import tasks, index build, load)."""

    @property
    def resolved_state_dir(self) -> str:
        """Done markers: local path or object-store URL (``formats.fs``)."""
        if self.state_dir:
            return self.state_dir
        if self.bulk_dir:  # markers mean "staged in bulk_dir", not "in the index": keep them with the files
            return str(Path(self.bulk_dir) / ".index_state")
        return fs.join(self.out, "_index_state", self.index.name)
