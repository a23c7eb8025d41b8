"""Milvus index of image crops: one collection that Milvus shards itself, or N fan-out collections.

Layouts (``IndexConfig.n_shards``):
- 1 (the default): one collection ``<name>`` created with ``shards_num`` (Milvus's own sharding: writes spread
  over its channels, query nodes search the shards in parallel) and a partition key (``doc_id``, hashed by
  Milvus into ``num_partitions`` buckets). This is what a server or cluster runs at scale.
- N > 1 (``--collections N``): collections ``<name>_s00 … s{N-1}``, a crop routed by its sha256, search fanned
  out and merged. It earns its place only across deployments (a ``{shard}`` URI template: several Lite files
  or several clusters); on one server it costs 1.26–1.41× the latency of one collection
  (benchmarks/results/index.md). ``scifolio index migrate`` moves an old fan-out layout into one collection.

The same code runs against Milvus Lite (a local file, ``./index.db``; it has no ``shards_num``) and a Milvus
server or cluster (``http://host:19530``). Upserts are keyed by sha256, so re-ingesting a shard changes nothing.

Text channels (``ensure(dim, text_dim)`` with ``text_dim > 0``; see ``retrieval.channels``): the same collection
also holds the crop's channel text (``text``, analysed), its sentence-embedder vector (``text_vector``) and the
BM25 sparse vector Milvus computes from the text (``sparse``). BM25 functions need Milvus 2.5, multi-vector
collections 2.4: Milvus Lite has both; an older server (the project's 2.3.5 test server) is refused with a message
(``TextChannelsUnsupported``). An index is one schema: writing text channels into an image-only index, or an
image-only build into a text-channel index, is refused (``SchemaMismatch``) — rebuild under another ``--name``.

    python -c "from retrieval.index import *; ix = ShardedIndex(IndexConfig('./index.db')); print(ix.count())"
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from retrieval.crops import CropItem

UNSCORED = -1.0  # quality of a crop no reranker has scored yet; real scores live in [0, 1]

# Field lengths in bytes (Milvus VARCHAR limits are byte lengths of the UTF-8 text).
MAX_CAPTION = 1024
MAX_CONTEXT = 2048
MAX_SOURCE = 512
MAX_TEXT = 8192  # channel text of a crop (``retrieval.channels.channel_text`` cuts it to this)
TEXT_FIELDS = ("text", "text_vector")  # written by the client; ``sparse`` is the BM25 function's output
MIN_TEXT_SERVER = (2, 5)  # BM25 functions (and multi-vector collections, 2.4) on a Milvus server

# Build and search parameters per index type. HNSW is the default (in-memory, best recall/latency);
# IVF_SQ8 trades ~1 point of recall for 4x less memory; DiskANN / IVF_PQ exist only on a real cluster.
DEFAULT_BUILD_PARAMS: dict[str, dict[str, Any]] = {
    "FLAT": {},
    "HNSW": {"M": 16, "efConstruction": 200},
    "IVF_FLAT": {"nlist": 1024},
    "IVF_SQ8": {"nlist": 1024},
    "IVF_PQ": {"nlist": 1024, "m": 64, "nbits": 8},
    "DISKANN": {},
    "AUTOINDEX": {},
}
DEFAULT_SEARCH_PARAMS: dict[str, dict[str, Any]] = {
    "FLAT": {},
    "HNSW": {"ef": 128},
    "IVF_FLAT": {"nprobe": 32},
    "IVF_SQ8": {"nprobe": 32},
    "IVF_PQ": {"nprobe": 32},
    "DISKANN": {"search_list": 100},
    "AUTOINDEX": {},
}


@dataclass(frozen=True)
class IndexConfig:
    uri: str = "./index.db"
    """Milvus Lite file (``*.db``) or server URI (``http://127.0.0.1:19530``)."""
    name: str = "crops"
    """Collection name: the collection itself when ``n_shards`` is 1, else the prefix of ``<name>_s00`` …"""
    n_shards: int = 1
    """Number of collections. 1: one collection sharded by Milvus (``shards_num``, ``partition_key``). N > 1: the
    fan-out layout, a crop in ``shard_of(sha256, n_shards)`` (Milvus Lite; several deployments). Fixed once
    data is written; ``scifolio index migrate`` moves a fan-out index into one collection."""
    shards_num: int = 2
    """Milvus shards (DML channels) of each collection on a server; Milvus Lite ignores it. Fixed at creation."""
    partition_key: str = "doc_id"
    """Field Milvus hashes into ``num_partitions`` partitions ("" = none): a document's crops share a partition,
    so ``doc_id`` filters search one partition. Fixed at creation."""
    num_partitions: int = 16
    """Partitions behind the partition key on a server (Milvus' default is 16 in 2.4, 64 in 2.3)."""
    index_type: str = "HNSW"
    """HNSW (default), IVF_SQ8, IVF_FLAT, FLAT, AUTOINDEX; IVF_PQ / DISKANN on a real cluster only."""
    metric: str = "IP"
    """IP on L2-normalised vectors = cosine similarity."""
    build_params: Mapping[str, Any] | None = None
    """Index build parameters; None = ``DEFAULT_BUILD_PARAMS[index_type]``."""
    search_params: Mapping[str, Any] | None = None
    """Search parameters (ef, nprobe…); None = ``DEFAULT_SEARCH_PARAMS[index_type]``."""
    token: str = ""
    """Auth token for a secured server ("user:password"); empty for Lite and open servers."""
    max_workers: int = 8
    """Threads for the concurrent per-shard fan-out."""
    consistency: str = "Strong"
    """Milvus read consistency. Strong: reads see every acknowledged write (idempotence checks and resume
    rely on it). "Bounded" trades a few seconds of staleness for latency on a busy cluster."""

    def __post_init__(self) -> None:
        if self.n_shards < 1:
            raise ValueError("n_shards must be >= 1")
        if self.shards_num < 1:
            raise ValueError("shards_num must be >= 1")
        if self.index_type.upper() not in DEFAULT_BUILD_PARAMS:
            raise ValueError(f"unknown index_type {self.index_type!r}; expected one of {sorted(DEFAULT_BUILD_PARAMS)}")
        if self.partition_key not in ("", *PARTITION_KEY_FIELDS):
            raise ValueError(
                f"partition_key must be one of {PARTITION_KEY_FIELDS} or empty, got {self.partition_key!r}"
            )
        object.__setattr__(self, "index_type", self.index_type.upper())

    @property
    def is_lite(self) -> bool:
        return is_lite_uri(self.uri)


PARTITION_KEY_FIELDS = ("doc_id", "kind")


def is_lite_uri(uri: str) -> bool:
    return not uri.startswith(("http://", "https://", "tcp://", "unix:"))


# Index type per scale on a server, from benchmarks/results/index_scale.json (see infra/milvus/CAPACITY.md):
# HNSW while the graph fits in query-node memory, IVF_SQ8 (¼ of the raw vector bytes) beyond.
SCALE_INDEX: tuple[tuple[int, str], ...] = ((5_000_000, "HNSW"), (10**15, "IVF_SQ8"))


def index_for_scale(n_vectors: int) -> str:
    """The index type for a collection expected to hold ``n_vectors`` rows (``SCALE_INDEX``)."""
    return next(t for limit, t in SCALE_INDEX if n_vectors <= limit)


@dataclass(frozen=True)
class IndexRow:
    """One crop as stored: its id, vector, text for reranking, and provenance back to its shard row."""

    sha256: str
    vector: Sequence[float]
    caption: str = ""
    context: str = ""
    kind: str = ""
    doc_id: str = ""
    page_index: int = -1
    source: str = ""  # shard file, relative to the shards directory given at build time
    row: int = -1  # row (chunk) number inside that shard file
    quality: float = UNSCORED
    text: str = ""  # channel text (caption + citing sentences + context), text-channel indexes only
    text_vector: Sequence[float] | None = None  # its sentence-embedder vector; None = an image-only row

    @classmethod
    def from_crop(
        cls,
        crop: CropItem,
        vector: Sequence[float],
        caption: str = "",
        text: str = "",
        text_vector: Sequence[float] | None = None,
    ) -> IndexRow:
        """The stored row of a crop read from a shard (``retrieval.crops.iter_crops``). ``caption``: a generated
        caption (else the caption line the citation resolver found)."""
        return cls(
            sha256=crop.sha256,
            vector=vector,
            caption=caption or crop.caption,
            context=crop.context,
            kind=crop.kind,
            doc_id=crop.doc_id,
            page_index=crop.page_index,
            source=crop.source,
            row=crop.row,
            text=text,
            text_vector=text_vector,
        )

    def to_entity(self) -> dict[str, Any]:
        d = asdict(self)
        d["vector"] = [float(v) for v in self.vector]
        if self.text_vector is None:
            del d["text"], d["text_vector"]
        else:
            d["text_vector"] = [float(v) for v in self.text_vector]
            d["text"] = clip_bytes(self.text, MAX_TEXT)
        d["caption"] = clip_bytes(self.caption, MAX_CAPTION)
        d["context"] = clip_bytes(self.context, MAX_CONTEXT)
        d["source"] = clip_bytes(self.source, MAX_SOURCE)
        return d


@dataclass(frozen=True)
class Hit:
    """A search result; ``score`` is the similarity (or the reranker's score after rerank)."""

    sha256: str
    score: float
    caption: str = ""
    context: str = ""
    kind: str = ""
    doc_id: str = ""
    page_index: int = -1
    source: str = ""
    row: int = -1
    quality: float = UNSCORED
    shard: int = -1
    via: tuple[str, ...] = field(default=())  # which query vectors found it ("text", "image", "caption")

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["via"] = list(self.via)
        return d


OUTPUT_FIELDS = ["caption", "context", "kind", "doc_id", "page_index", "source", "row", "quality"]


def clip_bytes(text: str, max_bytes: int) -> str:
    """Truncate to at most ``max_bytes`` UTF-8 bytes without splitting a character."""
    raw = (text or "").encode("utf-8")
    if len(raw) <= max_bytes:
        return text or ""
    return raw[:max_bytes].decode("utf-8", errors="ignore")


def shard_of(sha256: str, n_shards: int) -> int:
    """Collection for a crop. sha256 is already uniform, so its first 64 bits mod N balance the shards and
    the route never changes between runs, processes or languages (unlike Python's salted ``hash``)."""
    if len(sha256) < 16:
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    return int(sha256[:16], 16) % n_shards


def collection_names(name: str, n_shards: int) -> list[str]:
    """One collection ``name`` (Milvus shards it), or the fan-out family ``name_s00 …`` for N > 1."""
    return [name] if n_shards == 1 else fanout_names(name, n_shards)


def fanout_names(name: str, n_shards: int) -> list[str]:
    return [f"{name}_s{i:02d}" for i in range(n_shards)]


def merge_hits(per_shard: Iterable[Sequence[Hit]], k: int) -> list[Hit]:
    """Merge per-shard (or per-query-vector) top-k lists: dedupe by sha256 keeping the best score (and the
    union of ``via``), order by score descending (sha256 breaks ties so the order is deterministic), cut to k."""
    best: dict[str, Hit] = {}
    for hits in per_shard:
        for h in hits:
            prev = best.get(h.sha256)
            if prev is None:
                best[h.sha256] = h
                continue
            via = tuple(dict.fromkeys(prev.via + h.via))
            keep = h if h.score > prev.score else prev
            best[h.sha256] = replace(keep, via=via)
    ordered = sorted(best.values(), key=lambda h: (-h.score, h.sha256))
    return ordered[:k]


def index_params(client, field: str, index_type: str, metric: str, build_params: Mapping[str, Any] | None = None):
    """Milvus index parameters for one vector field (``build_params`` None = ``DEFAULT_BUILD_PARAMS``)."""
    ip = client.prepare_index_params()
    params = dict(build_params or DEFAULT_BUILD_PARAMS[index_type])
    ip.add_index(field_name=field, index_type=index_type, metric_type=metric, params=params)
    return ip


def search_params(index_type: str, metric: str, k: int, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``search_params`` argument of a search returning ``k`` hits (HNSW needs ef >= k)."""
    out = dict(params or DEFAULT_SEARCH_PARAMS[index_type])
    if "ef" in out:
        out["ef"] = max(int(out["ef"]), k)
    return {"metric_type": metric, "params": out}


class ShardedCollections:
    """Connection and life cycle of one collection ``<name>`` or N collections ``<name>_s00 …`` at one URI (or a
    ``{shard}`` URI template), shared by the crop index (:class:`ShardedIndex`) and the key-vector stores
    (``retrieval.vectors``).

    The subclass sets ``config`` (with ``uri``, ``token``, ``consistency``, ``name``, ``n_shards``, ``shards_num``)
    before calling ``__init__``'s body through ``super().__init__()``."""

    config: Any

    def __init__(self) -> None:
        self.names = collection_names(self.config.name, self.config.n_shards)
        self._clients: dict[str, Any] = {}
        self._loaded: set[int] = set()

    # -- connection -------------------------------------------------------------------------------------------
    def uri_of(self, shard: int) -> str:
        return self.config.uri.format(shard=f"{shard:02d}") if "{shard}" in self.config.uri else self.config.uri

    def cl(self, shard: int):
        """Client serving ``shard``; collections that exist are loaded on first use (Milvus keeps collections
        released after a restart, and a Lite file reopened by a new process starts released)."""
        uri = self.uri_of(shard)
        if uri not in self._clients:
            from pymilvus import MilvusClient

            self._clients[uri] = MilvusClient(uri=uri, token=self.config.token)
        client = self._clients[uri]
        if shard not in self._loaded and client.has_collection(self.names[shard]):
            self._load(client, shard)
            self._loaded.add(shard)
        return client

    def _load(self, client, shard: int) -> None:
        client.load_collection(self.names[shard])

    @property
    def client(self):
        """The client of shard 0 (index params, schema helpers)."""
        return self.cl(0)

    def close(self) -> None:
        for c in self._clients.values():
            c.close()
        self._clients.clear()
        self._loaded.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def _read(self) -> dict[str, str]:
        return {"consistency_level": self.config.consistency}

    def exists(self) -> bool:
        return all(self.cl(i).has_collection(n) for i, n in enumerate(self.names))

    def _vector_dim(self, shard: int, field: str) -> int:
        for f in self.cl(shard).describe_collection(self.names[shard])["fields"]:
            if f["name"] == field:
                return int(f["params"]["dim"])
        raise RuntimeError(f"collection {self.names[shard]} has no {field} field")

    def _ensure(
        self, dim: int, schema, field: str, index_type: str, metric: str, build_params, more_indexes=None
    ) -> None:
        """Create missing collections; refuse to write into collections of another dimension. ``more_indexes``:
        ``(client, IndexParams) -> None`` adds the indexes of further vector fields.

        Safe to call from every worker's setup: a concurrent create by another worker is tolerated."""
        for i, name in enumerate(self.names):
            client = self.cl(i)
            if not client.has_collection(name):
                params = index_params(client, field, index_type, metric, build_params)
                if more_indexes is not None:
                    more_indexes(client, params)
                create = {}
                if not is_lite_uri(self.uri_of(i)):  # Milvus Lite has no shards_num
                    create["shards_num"] = self.config.shards_num
                    if any(f.is_partition_key for f in schema.fields):
                        create["num_partitions"] = self.config.num_partitions
                try:
                    client.create_collection(
                        name,
                        schema=schema,
                        index_params=params,
                        consistency_level=self.config.consistency,
                        **create,
                    )
                except Exception:
                    if not client.has_collection(name):
                        raise
            existing = self._vector_dim(i, field)
            if existing != dim:
                raise ValueError(f"index {self.config.name!r} holds {existing}-d vectors, the model gives {dim}-d")
            self._load(client, i)
            self._loaded.add(i)

    def write_rows(self, shard: int, rows: list[dict[str, Any]]) -> int:
        """Upsert entity dicts into collection ``shard`` (keyed by the primary key). Returns rows written.

        On a server with a partition key this is delete + insert: Milvus before 2.3.10/2.4 hashes the wrong
        field when an upsert computes the partition (milvus-io/milvus#30607, fixed by #30772), so the 2.3.5 server
        put upserted rows into partitions where a partition-key filter never looks (measured in
        tests/retrieval/test_index_layout.py). A crash between the two leaves the row absent, never duplicated:
        resume sees it missing and writes it again."""
        client = self.cl(shard)
        if getattr(self.config, "partition_key", "") and not is_lite_uri(self.uri_of(shard)):
            pk = self._primary(shard)
            client.delete(self.names[shard], ids=[r[pk] for r in rows])
            return int(client.insert(self.names[shard], rows)["insert_count"])
        return int(client.upsert(self.names[shard], rows)["upsert_count"])

    def _primary(self, shard: int) -> str:
        if not hasattr(self, "_pk"):
            desc = self.cl(shard).describe_collection(self.names[shard])
            self._pk = next(f["name"] for f in desc["fields"] if f.get("is_primary"))
        return self._pk

    def drop(self) -> None:
        for i, name in enumerate(self.names):
            if self.cl(i).has_collection(name):
                self.cl(i).drop_collection(name)
            self._loaded.discard(i)

    def reload(self) -> None:
        """Release and load every collection: Milvus Lite builds its ANN index for sealed data at load time,
        so a bulk load ends with a reload before it is searched at full speed."""
        for i, name in enumerate(self.names):
            self.cl(i).flush(name)
            self.cl(i).release_collection(name)
            self.cl(i).load_collection(name)

    def flush(self) -> None:
        for i, name in enumerate(self.names):
            self.cl(i).flush(name)

    def counts(self) -> list[int]:
        return [self.count_of(i) for i in range(len(self.names))]

    def count_of(self, shard: int, consistency: str | None = None) -> int:
        """Rows in collection ``shard`` that reads see (at the index's consistency level unless given)."""
        level = consistency or self.config.consistency
        res = self.cl(shard).query(self.names[shard], filter="", output_fields=["count(*)"], consistency_level=level)
        return int(res[0]["count(*)"])

    def wait_indexed(self, shard: int, rows: int, deadline: float) -> None:
        """Wait until every vector index of collection ``shard`` covers ``rows`` rows with none pending (a server
        builds indexes on sealed segments in the background); ``deadline`` is a ``time.monotonic()`` value."""
        import time

        client, name = self.cl(shard), self.names[shard]
        for field_index in client.list_indexes(name):
            while True:
                d = client.describe_index(name, field_index)
                if d.get("state") == "Failed":
                    raise RuntimeError(f"{name}: index build failed: {d.get('index_state_fail_reason') or d}")
                if int(d.get("indexed_rows", 0)) >= rows and int(d.get("pending_index_rows", 0)) == 0:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name}: index {field_index} not built in time: {d}")
                time.sleep(0.5)

    def count(self) -> int:
        return sum(self.counts())


class ShardedIndex(ShardedCollections):
    """N Milvus collections behind one object: ensure(dim), upsert, search (fan-out + merge), quality updates.

    All collections normally share one URI (one Lite file, one server or cluster, which spreads the
    collections over its query nodes). A URI containing ``{shard}`` (``./index_{shard}.db``) puts each shard
    in its own Lite file (own store, lock and index files). Milvus Lite 3.x serves every file inside the client
    process, so this is no parallel speed-up (see benchmarks/results/index.md); it keeps shard files separable.
    """

    def __init__(self, config: IndexConfig):
        self.config = config
        super().__init__()

    # -- schema -----------------------------------------------------------------------------------------------
    def _schema(self, dim: int, text_dim: int = 0):
        from pymilvus import DataType, Function, FunctionType, MilvusClient

        s = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        s.add_field("sha256", DataType.VARCHAR, max_length=64, is_primary=True)
        s.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
        s.add_field("caption", DataType.VARCHAR, max_length=MAX_CAPTION)
        s.add_field("context", DataType.VARCHAR, max_length=MAX_CONTEXT)
        pk = self.config.partition_key
        s.add_field("kind", DataType.VARCHAR, max_length=16, is_partition_key=pk == "kind")
        s.add_field("doc_id", DataType.VARCHAR, max_length=64, is_partition_key=pk == "doc_id")
        s.add_field("page_index", DataType.INT32)
        s.add_field("source", DataType.VARCHAR, max_length=MAX_SOURCE)
        s.add_field("row", DataType.INT64)
        s.add_field("quality", DataType.FLOAT)
        if text_dim:
            s.add_field("text", DataType.VARCHAR, max_length=MAX_TEXT, enable_analyzer=True)
            s.add_field("text_vector", DataType.FLOAT_VECTOR, dim=text_dim)
            s.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
            s.add_function(
                Function(
                    name="text_bm25",
                    function_type=FunctionType.BM25,
                    input_field_names=["text"],
                    output_field_names=["sparse"],
                )
            )
        return s

    def dim(self) -> int:
        """Vector dimension of the existing collections."""
        return self._vector_dim(0, "vector")

    def text_dim(self) -> int:
        """Dimension of the text-channel vectors of the existing collections; 0 for an image-only index."""
        fields = {f["name"]: f for f in self.cl(0).describe_collection(self.names[0])["fields"]}
        return int(fields["text_vector"]["params"]["dim"]) if "text_vector" in fields else 0

    def has_text_channels(self) -> bool:
        if not hasattr(self, "_text_dim"):
            if not self.exists():
                return False
            self._text_dim = self.text_dim()
        return self._text_dim > 0

    def check_text_support(self) -> None:
        """Refuse text channels on a Milvus server older than 2.5 (no BM25 function, no sparse vectors)."""
        for i in range(self.config.n_shards):
            if is_lite_uri(self.uri_of(i)):
                continue
            version = str(self.cl(i).get_server_version())
            nums = tuple(int(x) for x in re.findall(r"\d+", version)[:2])
            if nums < MIN_TEXT_SERVER:
                raise TextChannelsUnsupported(
                    f"the Milvus server at {self.uri_of(i)} is {version}: text channels (BM25 function, sparse and "
                    f"several vector fields in one collection) need Milvus >= {'.'.join(map(str, MIN_TEXT_SERVER))} "
                    "or Milvus Lite. Build an image-only index there (--text-model none) or upgrade the server."
                )

    def check_schema(self, text_dim: int) -> None:
        """Refuse a build whose text channels (``text_dim``; -1 = some, dimension not known yet; 0 = none) differ
        from those of the existing index."""
        if not self.exists():
            return
        have = self.text_dim()
        if have == text_dim or (text_dim == -1 and have):
            return
        c = self.config
        want = "has no text model (--text-model none)" if not text_dim else "has text channels"
        if text_dim > 0:
            want = f"gives {text_dim}-d text vectors"
        raise SchemaMismatch(
            f"index {c.name!r} at {c.uri} was built "
            + (f"with {have}-d text channels" if have else "without text channels (image vectors only)")
            + f", this build {want}. One index holds one schema: build into a new --name (or drop this one and "
            "rebuild); an image-only index is still queried as before, with --text-model none."
        )

    def ensure(self, dim: int, text_dim: int = 0) -> None:
        """Create missing collections (with the text channels when ``text_dim`` > 0); refuse to write into
        collections of another dimension or another schema (image-only vs text channels)."""
        c = self.config
        if text_dim:
            self.check_text_support()
        self.check_schema(text_dim)

        def text_indexes(client, params) -> None:
            if text_dim:
                params.add_index(
                    field_name="text_vector",
                    index_type=c.index_type,
                    metric_type=c.metric,
                    params=dict(c.build_params or DEFAULT_BUILD_PARAMS[c.index_type]),
                )
                params.add_index(field_name="sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25")

        self._ensure(dim, self._schema(dim, text_dim), "vector", c.index_type, c.metric, c.build_params, text_indexes)
        self._text_dim = text_dim

    def route(self, sha256: str) -> int:
        """Collection of a crop (always 0 in the one-collection layout)."""
        return shard_of(sha256, self.config.n_shards)

    # -- writes -----------------------------------------------------------------------------------------------
    def upsert(self, rows: Sequence[IndexRow]) -> int:
        """Upsert rows into their shards (keyed by sha256: idempotent). Returns rows written."""
        by_shard: dict[int, dict[str, dict[str, Any]]] = {}
        for r in rows:
            # Last write wins inside one call too, so a batch holding the same crop twice stores it once.
            by_shard.setdefault(shard_of(r.sha256, self.config.n_shards), {})[r.sha256] = r.to_entity()
        return sum(self.write_rows(shard, list(ents.values())) for shard, ents in by_shard.items())

    def _by_shard(self, ids: Iterable[str]) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for i in ids:
            out.setdefault(shard_of(i, self.config.n_shards), []).append(i)
        return out

    def existing(self, ids: Iterable[str]) -> set[str]:
        """The subset of ``ids`` already stored (resuming skips them, keeping their stored quality scores)."""
        found: set[str] = set()
        for shard, group in self._by_shard(ids).items():
            for rec in self.cl(shard).get(self.names[shard], ids=group, output_fields=["sha256"], **self._read):
                found.add(rec["sha256"])
        return found

    def get(self, ids: Sequence[str], with_vectors: bool = False) -> list[dict[str, Any]]:
        """Stored rows; ``with_vectors`` adds the vectors and, in a text-channel index, the channel text (all a
        rewrite needs)."""
        fields = ["sha256", *OUTPUT_FIELDS] + (["vector"] if with_vectors else [])
        if with_vectors and self.has_text_channels():
            fields += list(TEXT_FIELDS)
        out: list[dict[str, Any]] = []
        for shard, group in self._by_shard(ids).items():
            recs = self.cl(shard).get(self.names[shard], ids=group, output_fields=fields, **self._read)
            out.extend(dict(r) for r in recs)
        return out

    def set_quality(self, scores: Mapping[str, float]) -> int:
        """Store reranker quality scores. A crop keeps the best score any quality query gave it (max), so the
        order in which queries run does not matter. Rewrites whole rows: partial updates are not portable
        across Milvus Lite and server versions. Returns rows changed."""
        rows = self.get(list(scores), with_vectors=True)
        changed = []
        for r in rows:
            new = max(float(r["quality"]), float(scores[r["sha256"]]))
            if new != float(r["quality"]):
                r["quality"] = new
                r["vector"] = [float(v) for v in r["vector"]]
                changed.append(IndexRow(**{k: r[k] for k in IndexRow.__dataclass_fields__ if k in r}))
        return self.upsert(changed) if changed else 0

    # -- reads ------------------------------------------------------------------------------------------------

    def ids(self) -> list[str]:
        """Every stored sha256, sorted (iterates; meant for tests and small indexes)."""
        out: list[str] = []
        for i, name in enumerate(self.names):
            it = self.cl(i).query_iterator(name, filter="", output_fields=["sha256"], batch_size=1000, **self._read)
            try:
                while batch := it.next():
                    out.extend(r["sha256"] for r in batch)
            finally:
                it.close()
        return sorted(out)

    def _params(self, field: str, k: int) -> dict[str, Any]:
        c = self.config
        if field == "sparse":
            return {"metric_type": "BM25", "params": {}}
        return search_params(c.index_type, c.metric, k, c.search_params)

    def _search_shard(
        self, shard: int, vectors: list, k: int, flt: str, via: str, field: str = "vector"
    ) -> list[list[Hit]]:
        res = self.cl(shard).search(
            self.names[shard],
            data=vectors,
            limit=k,
            filter=flt,
            output_fields=OUTPUT_FIELDS,
            search_params=self._params(field, k),
            anns_field=field,
            **self._read,
        )
        return self._hits(res, shard, via, bm25=field == "sparse")

    def _hits(self, res, shard: int, via: str, bm25: bool = False) -> list[list[Hit]]:
        """Hits of a search result. BM25 scores are non-negative; Milvus Lite reports them negated (best first
        still), so their absolute value is the score that orders them the same way after a merge."""
        out = []
        for hits in res:
            row = []
            for h in hits:
                e = h["entity"]
                row.append(
                    Hit(
                        sha256=h["id"] if "id" in h else h["sha256"],
                        score=abs(float(h["distance"])) if bm25 else float(h["distance"]),
                        shard=shard,
                        via=(via,) if via else (),
                        **{k_: e[k_] for k_ in OUTPUT_FIELDS},
                    )
                )
            out.append(row)
        return out

    def search(
        self, vectors: np.ndarray | Sequence[str], k: int = 10, filter: str = "", via: str = "", field: str = "vector"
    ) -> list[list[Hit]]:
        """Top-k per query over all shards: each shard returns its own top-k concurrently (any global top-k item
        is in its shard's top-k, so the merge is exact w.r.t. the per-shard results). ``field``: ``vector``
        (CLIP), ``text_vector`` (sentence embedder) or ``sparse`` (BM25: the queries are strings)."""
        if field == "sparse":
            data: list = [str(q) for q in vectors]
        else:
            vecs = np.asarray(vectors, dtype=np.float32)
            if vecs.ndim == 1:
                vecs = vecs[None, :]
            data = vecs.tolist()
        if field != "vector" and not self.has_text_channels():
            raise SchemaMismatch(f"index {self.config.name!r} has no text channels (built without a text model)")
        if len(data) == 0:
            return []
        for i in range(self.config.n_shards):
            self.cl(i)  # connect and load before fanning out, not concurrently inside the threads
        if self.config.n_shards == 1:
            per_shard = [self._search_shard(0, data, k, filter, via, field)]
        else:
            with ThreadPoolExecutor(max_workers=min(self.config.max_workers, self.config.n_shards)) as pool:
                futures = [
                    pool.submit(self._search_shard, s, data, k, filter, via, field) for s in range(self.config.n_shards)
                ]
                per_shard = [f.result() for f in futures]
        return [merge_hits((shard_res[q] for shard_res in per_shard), k) for q in range(len(data))]

    def hybrid(
        self, queries: Mapping[str, tuple[str, Any]], k: int, candidates: int, rrf_k: int, filter: str = ""
    ) -> list[Hit]:
        """One query through several channels fused by RRF inside Milvus (``rrf_k``: ``retrieval.channels.RRF_K``):
        ``hybrid_search`` with an ``RRFRanker``, one collection only (the fan-out layout fuses client-side with
        ``retrieval.channels.rrf``).
        ``queries``: channel name → (field, query vector or BM25 query string); ``candidates`` per channel."""
        from pymilvus import AnnSearchRequest, RRFRanker

        if self.config.n_shards != 1:
            raise ValueError("hybrid() needs the one-collection layout; fuse per-channel searches instead")
        reqs = []
        for anns, q in queries.values():
            data = [q] if anns == "sparse" else [np.asarray(q, dtype=np.float32).reshape(-1).tolist()]
            reqs.append(AnnSearchRequest(data, anns, self._params(anns, candidates), candidates, expr=filter))
        res = self.cl(0).hybrid_search(
            self.names[0], reqs, RRFRanker(rrf_k), limit=k, output_fields=OUTPUT_FIELDS, **self._read
        )
        return [replace(h, via=tuple(queries)) for h in self._hits(res, 0, "")[0]]


class SchemaMismatch(ValueError):
    """An index built with one schema (image-only, or text channels of one dimension) used as another."""


class TextChannelsUnsupported(ValueError):
    """A Milvus server too old for text channels (BM25 function, sparse vectors, several vector fields)."""


def discover_n_shards(uri: str, name: str, token: str = "") -> int:
    """Layout of the index ``name`` at ``uri`` (so query-side commands need no --collections): 1 when the
    collection ``name`` exists, else the number of fan-out collections ``<name>_sNN``, checked to be exactly
    s00 … s{N-1} (a gap means a half-created or half-dropped index). A lone ``<name>_s00`` (an old one-collection
    index) must be migrated first: its name is not the one-collection layout's."""
    from pymilvus import MilvusClient

    if "{shard}" in uri:
        raise ValueError("a per-shard URI template needs an explicit --collections")
    client = MilvusClient(uri=uri, token=token)
    try:
        have = client.list_collections()
    finally:
        client.close()
    if name in have:
        return 1
    found = fanout_collections(have, name)
    if not found:
        raise ValueError(f"no collection {name} (or {name}_sNN) at {uri}; build the index first")
    if found != list(range(len(found))):
        raise ValueError(f"collections {name}_s* at {uri} are not contiguous: {found}")
    if len(found) == 1:
        raise ValueError(f"{name}_s00 at {uri} is an old one-collection index: run `scifolio index migrate`")
    return len(found)


def fanout_collections(collections: Iterable[str], name: str) -> list[int]:
    """Shard numbers of the fan-out collections ``<name>_sNN`` among ``collections``, sorted."""
    pat = re.compile(rf"^{re.escape(name)}_s(\d{{2,}})$")
    return sorted(int(m.group(1)) for c in collections if (m := pat.match(c)))


def migrate_fanout(target: ShardedCollections, batch: int = 2000, drop_old: bool = False) -> dict[str, int]:
    """Copy every row of the fan-out collections ``<name>_sNN`` at ``target``'s URI into ``target``'s layout (one
    collection sharded by Milvus, or another number of collections), with the same fields and vectors.

    Works for any collection family on :class:`ShardedCollections` (the crop index, the Memory Decoder store):
    rows are copied as stored, primary key first, through upserts, so a migration interrupted and run again
    finishes without duplicates. The old collections are dropped only when ``drop_old`` and every primary key
    is found in the target afterwards. Returns ``{"collections", "rows_read", "rows_written", "rows_in_target"}``."""
    from pymilvus import MilvusClient

    cfg = target.config
    if "{shard}" in cfg.uri:
        raise ValueError("migrate one URI at a time (a {shard} template is already a per-deployment layout)")
    src = MilvusClient(uri=cfg.uri, token=cfg.token)
    try:
        old = [f"{cfg.name}_s{i:02d}" for i in fanout_collections(src.list_collections(), cfg.name)]
        old = [n for n in old if n not in target.names]
        if not old:
            raise ValueError(f"no fan-out collections {cfg.name}_sNN at {cfg.uri} to migrate")
        desc = src.describe_collection(old[0])
        # A function's output (the BM25 ``sparse`` of a text-channel index) is recomputed by the target.
        fields = [f["name"] for f in desc["fields"] if not f.get("is_function_output") and f["name"] != "sparse"]
        pk = next(f["name"] for f in desc["fields"] if f.get("is_primary"))
        dims = {f["name"]: int(f["params"]["dim"]) for f in desc["fields"] if "dim" in f.get("params", {})}
        vec = next(iter(dims))
        if "text_vector" in dims:
            target.ensure(dims[vec], dims["text_vector"])
        else:
            target.ensure(dims[vec])
        keys: set = set()
        read = written = 0
        for name in old:
            src.load_collection(name)
            it = src.query_iterator(name, filter="", output_fields=fields, batch_size=batch, consistency_level="Strong")
            try:
                while rows := it.next():
                    read += len(rows)
                    keys.update(r[pk] for r in rows)
                    by_shard: dict[int, list[dict[str, Any]]] = {}
                    for r in rows:
                        by_shard.setdefault(target.route(r[pk]), []).append({f: r[f] for f in fields})
                    for s, group in by_shard.items():
                        written += target.write_rows(s, group)
            finally:
                it.close()
        target.flush()
        missing = len(keys) - sum(
            len(target.cl(s).get(target.names[s], ids=part, output_fields=[pk], consistency_level="Strong"))
            for s, group in _group(keys, target.route).items()
            for part in (group[i : i + 1000] for i in range(0, len(group), 1000))
        )
        if missing:
            raise RuntimeError(f"migration lost {missing} of {len(keys)} rows; the old collections are kept")
        if drop_old:
            for name in old:
                src.drop_collection(name)
    finally:
        src.close()
    return {"collections": len(old), "rows_read": read, "rows_written": written, "rows_in_target": target.count()}


def _group(keys: Iterable, route) -> dict[int, list]:
    out: dict[int, list] = {}
    for k in keys:
        out.setdefault(route(k), []).append(k)
    return out


# -- bulk path ---------------------------------------------------------------------------------------------------
# Rows per bulk-import file. The 2.3 standalone server runs import tasks one at a time and each task costs seconds
# whatever its size (one segment per shard channel x partition-key bucket, each sealed, flushed and indexed on its
# own): ten 10k-row files took 69 s to import where one 100k-row file took 12 s (benchmarks/RESULTS.md, issue 35).
# 1M 512-d rows is 2 GiB of parquet, well under the server's 16 GiB import file limit.
BULK_ROWS_PER_FILE = 1_000_000


class BulkWriter:
    """Stage rows as Milvus bulk-import parquet files while they are produced: one open file per shard, rows
    buffered into row groups of ``group_rows`` built straight from the vectors (one float32 matrix, no Python
    floats), a file closed and moved into ``out_dir`` in one rename once it holds ``rows_per_file`` rows, the
    rest at ``close``. One column per schema field, vectors as list<float32> (the layout pymilvus'
    ``LocalBulkWriter`` produces; written with pyarrow directly so the ``pymilvus[bulk_writer]`` extra and its
    cloud SDKs are not needed).

    Files are named ``s03-<writer id>-00000.parquet`` and appear complete or not at all (an unfinished one is a
    hidden ``.s03-….tmp``). Repeats inside one ``add`` fold (last wins, as upsert does); repeats across calls or
    writers are for the importer to drop (``pipelines.jobs.index.dedupe_staged``)."""

    def __init__(self, out_dir: str, n_shards: int, rows_per_file: int = BULK_ROWS_PER_FILE, group_rows: int = 16_384):
        import os
        import uuid

        if rows_per_file < 1 or group_rows < 1:
            raise ValueError("rows_per_file and group_rows must be >= 1")
        self.out_dir, self.n_shards = out_dir, n_shards
        self.rows_per_file, self.group_rows = rows_per_file, group_rows
        self.id = uuid.uuid4().hex
        self.files: dict[int, list[str]] = {}
        self._open: dict[int, tuple[Any, str, str]] = {}  # shard -> (parquet writer, tmp path, final path)
        self._rows: dict[int, int] = {}  # rows in the shard's open file, buffered ones included
        self._buf: dict[int, list[IndexRow]] = {}
        self._parts: dict[int, int] = {}
        os.makedirs(out_dir, exist_ok=True)

    def add(self, rows: Iterable[IndexRow]) -> int:
        """Append rows (routed to their shard's file); returns rows taken after folding repeats."""
        by_shard: dict[int, dict[str, IndexRow]] = {}
        for r in rows:
            by_shard.setdefault(shard_of(r.sha256, self.n_shards), {})[r.sha256] = r
        n = 0
        for shard, got in sorted(by_shard.items()):
            for r in got.values():
                buf = self._buf.setdefault(shard, [])
                buf.append(r)
                self._rows[shard] = self._rows.get(shard, 0) + 1
                if len(buf) >= self.group_rows:
                    self._write(shard)
                if self._rows[shard] >= self.rows_per_file:
                    self._finish(shard)
            n += len(got)
        return n

    def close(self) -> dict[int, list[str]]:
        """Write what is buffered, close and move in every open file; returns shard -> every file staged."""
        for shard in sorted(set(self._open) | {s for s, b in self._buf.items() if b}):
            self._finish(shard)
        return self.files

    def __enter__(self) -> BulkWriter:
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()
        else:  # leave no half-written file behind (nor move one in)
            import os

            for w, tmp, _ in self._open.values():
                w.close()
                os.unlink(tmp)
            self._open.clear()
            self._buf.clear()

    def _write(self, shard: int) -> None:
        import os

        import pyarrow.parquet as pq

        table = bulk_table(self._buf.pop(shard))
        if shard not in self._open:
            part = self._parts.get(shard, 0)
            self._parts[shard] = part + 1
            name = f"s{shard:02d}-{self.id}-{part:05d}.parquet"
            tmp = os.path.join(self.out_dir, f".{name}.tmp")
            self._open[shard] = (pq.ParquetWriter(tmp, table.schema), tmp, os.path.join(self.out_dir, name))
        self._open[shard][0].write_table(table)

    def _finish(self, shard: int) -> None:
        from formats import fs

        if self._buf.get(shard):
            self._write(shard)
        w, tmp, path = self._open.pop(shard)
        w.close()
        fs.commit(tmp, path)
        self._rows[shard] = 0
        self.files.setdefault(shard, []).append(path)


def bulk_table(rows: Sequence[IndexRow]):
    """Rows as one bulk-import table in the image-only schema (``BulkWriter``'s row groups)."""
    import pyarrow as pa

    vec = np.asarray([r.vector for r in rows], dtype=np.float32)
    flat = pa.FixedSizeListArray.from_arrays(pa.array(vec.reshape(-1)), vec.shape[1]).cast(pa.list_(pa.float32()))
    return pa.table(
        {
            "sha256": pa.array([r.sha256 for r in rows], pa.string()),
            "vector": flat,
            "caption": pa.array([clip_bytes(r.caption, MAX_CAPTION) for r in rows], pa.string()),
            "context": pa.array([clip_bytes(r.context, MAX_CONTEXT) for r in rows], pa.string()),
            "kind": pa.array([r.kind for r in rows], pa.string()),
            "doc_id": pa.array([r.doc_id for r in rows], pa.string()),
            "page_index": pa.array([r.page_index for r in rows], pa.int32()),
            "source": pa.array([clip_bytes(r.source, MAX_SOURCE) for r in rows], pa.string()),
            "row": pa.array([r.row for r in rows], pa.int64()),
            "quality": pa.array([r.quality for r in rows], pa.float32()),
        }
    )


def write_bulk_files(
    rows: Iterable[IndexRow], out_dir: str, n_shards: int, rows_per_file: int = BULK_ROWS_PER_FILE
) -> dict[int, list[str]]:
    """Write rows as bulk-import files in one go (``BulkWriter``); returns shard -> file paths. Rows are
    deduplicated by sha256 (last wins), as upsert would."""
    with BulkWriter(out_dir, n_shards, rows_per_file) as w:
        w.add(list(rows))
    return w.files


@dataclass(frozen=True)
class BulkImport:
    """What ``bulk_import`` did: rows imported and where the time went (seconds from the first task submitted)."""

    rows: int
    files: int
    import_s: float
    """Every import task completed (rows persisted as segments)."""
    indexed_s: float
    """Every imported row indexed (the server builds the collection's index on each imported segment)."""
    searchable_s: float
    """Collections loaded with the imported segments and a search returned an imported row."""


def bulk_import(
    index: ShardedIndex,
    files_by_shard: Mapping[int, Sequence[str]],
    timeout_s: float = 3600,
    max_tasks: int = 8,
) -> BulkImport:
    """Import bulk files into their shard collections on a Milvus server/cluster and wait until the rows are
    searchable: tasks completed, every row indexed, the collections reloaded, and Strong reads counting every
    imported row (``BulkImport`` says how long each part took).

    One import task per file, at most ``max_tasks`` submitted and not yet finished at any time (a cluster runs
    them in parallel over its data nodes; the standalone server runs one at a time, so bigger files, not more
    tasks, are what speeds it up). File paths must be readable by the server: keys in its object-storage bucket
    on a cluster, absolute paths under its local storage for a standalone server. Import has insert semantics
    (no dedupe against stored rows), so it is refused on a non-empty collection: first loads go through here,
    re-ingests through upsert(). Milvus Lite has no import service."""
    import time

    if index.config.is_lite:
        raise NotImplementedError("Milvus Lite has no bulk import; load it with ShardedIndex.upsert (row inserts)")
    counts = index.counts()
    busy = [index.names[s] for s in files_by_shard if counts[s]]
    if busy:
        raise ValueError(f"bulk import into non-empty collections {busy} would duplicate ids; use upsert()")
    from pymilvus import connections, utility

    todo = [(s, f) for s, files in files_by_shard.items() for f in files]
    alias = f"scifolio-bulk-{id(index)}"
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    # The import API is only exposed through the ORM-style utility module in pymilvus 3.0.
    connections.connect(alias=alias, uri=index.config.uri, token=index.config.token)
    try:
        imported: dict[int, int] = dict.fromkeys(files_by_shard, 0)
        running: list[tuple[int, int]] = []
        nap = 0.05
        while todo or running:
            while todo and len(running) < max_tasks:
                s, f = todo.pop(0)
                running.append((s, utility.do_bulk_insert(index.names[s], files=[f], using=alias)))
            still = []
            for s, tid in running:
                st = utility.get_bulk_insert_state(tid, using=alias)
                if st.state_name.startswith("Failed"):
                    raise RuntimeError(f"bulk import task {tid} failed: {st.infos.get('failed_reason')}")
                if st.state_name == "Completed":
                    imported[s] += int(st.row_count)
                else:
                    still.append((s, tid))
            if len(still) == len(running) and still:
                nap = min(nap * 2, 1.0)  # poll fast while tasks finish, back off to 1 s while one runs long
                _wait(deadline, nap, f"bulk import tasks {[t for _, t in still]} not done after {timeout_s}s")
            else:
                nap = 0.05
            running = still
    finally:
        connections.disconnect(alias)
    import_s = time.monotonic() - t0
    shards = sorted(files_by_shard)
    # Imported segments are searched once indexed and loaded: wait for the build, then a refreshing load of every
    # collection at once (each keeps serving while its new segments load; 4.5 s for 100k rows where release +
    # load took 5.4-6.4 s), then until reads see every imported row (count(*) at Strong consistency).
    for s in shards:
        index.wait_indexed(s, imported[s], deadline)
    indexed_s = time.monotonic() - t0
    for s in shards:
        index.cl(s).load_collection(index.names[s], refresh=True, _async=True)
    for s in shards:
        while index.count_of(s, "Strong") < imported[s]:
            _wait(deadline, 0.2, f"{index.names[s]}: imported rows not all visible after {timeout_s}s")
    return BulkImport(
        sum(imported.values()),
        sum(len(f) for f in files_by_shard.values()),
        import_s,
        indexed_s,
        time.monotonic() - t0,
    )


def _wait(deadline: float, nap: float, what: str) -> None:
    import time

    if time.monotonic() > deadline:
        raise TimeoutError(what)
    time.sleep(nap)
