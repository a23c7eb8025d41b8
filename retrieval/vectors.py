"""Key-vector store on Milvus: rows ``(id int64, key float vector, value int64)`` in one collection ``<name>``
sharded by Milvus (``shards_num``; the default, as for the crop index), or N fan-out collections
``<name>_s00 … s{N-1}``, shard = a mix of the id (Milvus Lite; ``retrieval.index.migrate_fanout`` moves them). The Memory Decoder's token datastore lives here (a prefix's
hidden state → the next token id), in a collection family of its own beside the crop index.

The same code runs against Milvus Lite (a local ``*.db`` file, the default) and a Milvus server/cluster URI.
Upserts are keyed by id, so re-writing a batch after a crash changes nothing. Search fans out to every shard
concurrently, takes each shard's top-k and merges; it returns what Milvus returns as the distance.

Metric: ``L2`` (the default) — Milvus returns the **squared** Euclidean distance ‖q − k‖² (checked in
tests/retrieval/test_vectors.py); that is the ``d`` of SPEC §C9 Eq 1. ``IP`` returns the inner product
(a similarity: larger is nearer); callers wanting Eq 1 on IP must pass ``d = −score`` themselves.

    python -c "from retrieval.vectors import *; s = ShardedVectorStore(VectorStoreConfig('./memdec.db')); \
print(s.count())"
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from retrieval.index import DEFAULT_BUILD_PARAMS, ShardedCollections, search_params

log = logging.getLogger(__name__)
_MIX = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class VectorStoreConfig:
    """Where and how the key-vector collections live."""

    uri: str = "./memdec.db"
    """Milvus Lite file (``*.db``) or server URI (``http://127.0.0.1:19530``); ``{shard}`` = one file per shard."""
    name: str = "memdec"
    """Collection name (``n_shards`` 1), else the prefix of ``<name>_s00`` … ``<name>_s{N-1}``."""
    n_shards: int = 1
    """Number of collections: 1 = one collection sharded by Milvus (``shards_num``); N > 1 = fan-out, a row in
    ``shard_of_ids(id, n_shards)``. Fixed once data is written."""
    shards_num: int = 2
    """Milvus shards of each collection on a server; Milvus Lite ignores it."""
    index_type: str = "HNSW"
    """HNSW (default), FLAT (exact, what tests use), IVF_FLAT, IVF_SQ8, AUTOINDEX; DISKANN on a cluster."""
    metric: str = "L2"
    """L2: Milvus returns the squared Euclidean distance (Eq 1's d). IP: inner product, larger = nearer."""
    build_params: Mapping[str, Any] | None = None
    """Index build parameters; None = the crop index's defaults for ``index_type``."""
    search_params: Mapping[str, Any] | None = None
    """Search parameters (ef, nprobe…); None = the crop index's defaults for ``index_type``."""
    token: str = ""
    """Auth token for a secured server; empty for Lite and open servers."""
    max_workers: int = 8
    """Threads for the concurrent per-shard fan-out."""
    consistency: str = "Strong"
    """Read consistency: Strong makes every acknowledged upsert visible to counts, gets and resume checks."""

    def __post_init__(self) -> None:
        if self.n_shards < 1 or self.shards_num < 1:
            raise ValueError("n_shards and shards_num must be >= 1")
        if self.index_type.upper() not in DEFAULT_BUILD_PARAMS:
            raise ValueError(f"unknown index_type {self.index_type!r}; expected one of {sorted(DEFAULT_BUILD_PARAMS)}")
        if self.metric.upper() not in ("L2", "IP"):
            raise ValueError(f"metric must be L2 or IP, got {self.metric!r}")
        object.__setattr__(self, "index_type", self.index_type.upper())
        object.__setattr__(self, "metric", self.metric.upper())

    @property
    def is_lite(self) -> bool:
        return not self.uri.startswith(("http://", "https://", "tcp://", "unix:"))


def shard_of_ids(ids: np.ndarray, n_shards: int) -> np.ndarray:
    """Shard of each id: a multiplicative hash (Fibonacci) of the id's bits, so structured ids (example × position)
    spread evenly; the route never changes between runs or processes."""
    u = np.asarray(ids, dtype=np.int64).astype(np.uint64)
    with np.errstate(over="ignore"):
        h = (u * _MIX) >> np.uint64(32)
    return (h % np.uint64(n_shards)).astype(np.int64)


@dataclass(frozen=True)
class Neighbours:
    """Top-k of a batch of queries, nearest first; ``ids == -1`` pads rows with fewer than k stored keys."""

    distances: np.ndarray
    """``[B, k]`` float32, exactly what Milvus returned (squared L2 for metric L2; padding = +inf)."""
    values: np.ndarray
    """``[B, k]`` int64 stored values (next-token ids); padding = -1."""
    ids: np.ndarray
    """``[B, k]`` int64 row ids; padding = -1."""


class ShardedVectorStore(ShardedCollections):
    """ensure(dim) · upsert(ids, keys, values) · search(queries, k) → Neighbours · existing(ids) · count()."""

    def __init__(self, config: VectorStoreConfig):
        self.config = config
        super().__init__()

    def _schema(self, dim: int):
        from pymilvus import DataType, MilvusClient

        s = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        s.add_field("id", DataType.INT64, is_primary=True)
        s.add_field("key", DataType.FLOAT_VECTOR, dim=dim)
        s.add_field("value", DataType.INT64)
        return s

    def _load(self, client, shard: int) -> None:
        """Load a collection; on Milvus Lite, recover from a truncated index sidecar once.

        Milvus Lite 3.2 builds each flushed segment's index in a background thread and writes its ``*.idx`` sidecar
        in place (not temp + rename); a process killed during that write leaves a truncated file that every later
        load refuses ("file seems not fully written"). The sidecars are derived data: removing the collection's
        sidecars makes Lite rebuild them from the (intact) parquet segments on the next load."""
        from pymilvus.exceptions import MilvusException

        try:
            client.load_collection(self.names[shard])
        except MilvusException as e:
            root = Path(self.uri_of(shard)) / "collections" / self.names[shard] / "partitions"
            sidecars = sorted(root.glob("*/indexes/*.idx")) if self.config.is_lite else []
            if not sidecars:
                raise
            log.warning("%s: load failed (%s); rebuilding %d index sidecars", self.names[shard], e, len(sidecars))
            for f in sidecars:
                f.unlink()
            client.load_collection(self.names[shard])

    def ensure(self, dim: int) -> None:
        """Create missing collections (refusing ones of another dimension) and load them."""
        c = self.config
        self._ensure(dim, self._schema(dim), "key", c.index_type, c.metric, c.build_params)

    def dim(self) -> int:
        return self._vector_dim(0, "key")

    def route(self, id_: int) -> int:
        """Collection of a row id (always 0 in the one-collection layout)."""
        return int(shard_of_ids(np.array([id_]), self.config.n_shards)[0])

    # -- writes -----------------------------------------------------------------------------------------------
    def upsert(self, ids: np.ndarray, keys: np.ndarray, values: np.ndarray, batch: int = 10_000) -> int:
        """Upsert rows into their shards, keyed by id (idempotent: a replayed batch stores each row once).
        Returns rows written."""
        ids = np.asarray(ids, dtype=np.int64)
        keys = np.asarray(keys, dtype=np.float32)
        values = np.asarray(values, dtype=np.int64)
        if not (len(ids) == len(keys) == len(values)) or keys.ndim != 2:
            raise ValueError(f"ids {ids.shape}, keys {keys.shape}, values {values.shape} do not line up")
        if len(np.unique(ids)) != len(ids):
            raise ValueError("duplicate ids inside one upsert")
        shards = shard_of_ids(ids, self.config.n_shards)
        n = 0
        for s in range(self.config.n_shards):
            sel = np.flatnonzero(shards == s)
            for start in range(0, len(sel), batch):
                part = sel[start : start + batch]
                rows = [{"id": int(ids[j]), "key": keys[j], "value": int(values[j])} for j in part]
                n += self.write_rows(s, rows)
        return n

    # -- reads ------------------------------------------------------------------------------------------------
    def existing(self, ids: np.ndarray) -> np.ndarray:
        """The subset of ``ids`` stored, sorted."""
        ids = np.asarray(ids, dtype=np.int64)
        shards = shard_of_ids(ids, self.config.n_shards)
        found: list[int] = []
        for s in range(self.config.n_shards):
            group = [int(i) for i in ids[shards == s]]
            for start in range(0, len(group), 1000):
                recs = self.cl(s).get(
                    self.names[s], ids=group[start : start + 1000], output_fields=["id"], **self._read
                )
                found.extend(int(r["id"]) for r in recs)
        return np.array(sorted(found), dtype=np.int64)

    def rows(self) -> tuple[np.ndarray, np.ndarray]:
        """Every stored ``(ids, values)``, sorted by id (iterates every shard; for tests and audits)."""
        ids: list[int] = []
        vals: list[int] = []
        for s, name in enumerate(self.names):
            it = self.cl(s).query_iterator(
                name, filter="", output_fields=["id", "value"], batch_size=4096, **self._read
            )
            try:
                while batch := it.next():
                    ids.extend(int(r["id"]) for r in batch)
                    vals.extend(int(r["value"]) for r in batch)
            finally:
                it.close()
        order = np.argsort(np.array(ids, dtype=np.int64), kind="stable")
        return np.array(ids, dtype=np.int64)[order], np.array(vals, dtype=np.int64)[order]

    def _search_shard(self, shard: int, data: np.ndarray, k: int) -> list[list[tuple[float, int, int]]]:
        c = self.config
        res = self.cl(shard).search(
            self.names[shard],
            data=data,
            limit=k,
            output_fields=["value"],
            search_params=search_params(c.index_type, c.metric, k, c.search_params),
            anns_field="key",
            **self._read,
        )
        return [[(float(h["distance"]), int(h["id"]), int(h["entity"]["value"])) for h in hits] for hits in res]

    def search(self, queries: np.ndarray, k: int) -> Neighbours:
        """Top-k per query over all shards: each shard's own top-k, concurrently, then merged (any global top-k
        row is in its shard's top-k, so the merge is exact w.r.t. the per-shard results). Ties break by id."""
        q = np.asarray(queries, dtype=np.float32)
        if q.ndim == 1:
            q = q[None, :]
        for i in range(self.config.n_shards):
            self.cl(i)  # connect and load before fanning out, not concurrently inside the threads
        if self.config.n_shards == 1:
            per_shard = [self._search_shard(0, q, k)]
        else:
            with ThreadPoolExecutor(max_workers=min(self.config.max_workers, self.config.n_shards)) as pool:
                per_shard = list(pool.map(lambda s: self._search_shard(s, q, k), range(self.config.n_shards)))
        sign = 1.0 if self.config.metric == "L2" else -1.0  # L2: smaller is nearer; IP: larger is nearer
        dist = np.full((len(q), k), np.inf if sign > 0 else -np.inf, dtype=np.float32)
        vals = np.full((len(q), k), -1, dtype=np.int64)
        ids = np.full((len(q), k), -1, dtype=np.int64)
        for b in range(len(q)):
            merged = sorted((h for shard_res in per_shard for h in shard_res[b]), key=lambda h: (sign * h[0], h[1]))
            for j, (d, i, v) in enumerate(merged[:k]):
                dist[b, j], ids[b, j], vals[b, j] = d, i, v
        return Neighbours(distances=dist, values=vals, ids=ids)
