"""Memory Decoder configs: small frozen dataclasses; named runs are functions (``RECIPES``).

    from formats.overrides import with_overrides
    from posttrain.memdec.config import RECIPES
    cfg = with_overrides(RECIPES["debug"]("out/memdec"), {"memory.steps": 50})

Paths left empty resolve under ``work_dir`` (``MemdecConfig.path``), so one ``--work-dir`` places a whole run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from formats.overrides import with_overrides
from posttrain.memdec.synthetic import SyntheticConfig


@dataclass(frozen=True)
class StoreConfig:
    """The Milvus collection(s) holding the datastore (the CLI turns it into retrieval's store config); the same
    layout choice as the crop index: one collection sharded by Milvus unless ``n_shards`` > 1."""

    uri: str = ""
    """Milvus Lite file or server URI; empty = ``<work_dir>/datastore.db``."""
    name: str = "memdec"
    """Collection name (``<name>_s00`` … prefix when ``n_shards`` > 1)."""
    n_shards: int = 1
    """Collections the keys are spread over (fixed once written); 1 = one collection, Milvus shards it."""
    shards_num: int = 2
    """Milvus shards of the collection on a server (ignored by Milvus Lite)."""
    index_type: str = "HNSW"
    """ANN index (FLAT = exact)."""
    metric: str = "L2"
    """L2: Milvus returns squared Euclidean distances, used as Eq 1's d unchanged."""


@dataclass(frozen=True)
class DatastoreConfig:
    """How keys are made and how kNN targets are computed from them (Eq 1)."""

    batch_examples: int = 32
    """Examples encoded and upserted per committed batch (the resume cursor moves by whole batches)."""
    max_len: int = 128
    """Token cap per example (question + answer + BOS/EOS); longer examples are cut."""
    k: int = 16
    """Neighbours per query (N of Eq 1)."""
    tau: float = 1.0
    """Temperature τ of Eq 1, in units of Milvus' squared-L2 distance."""
    exclude_self: bool = True
    """Drop a training position's own key from its neighbours (else the target collapses onto the gold token)."""


@dataclass(frozen=True)
class BaseTrainConfig:
    """Pre-training of the tiny base on general text (the synthetic experiment only; a real base is given)."""

    hidden: int = 64
    """Hidden size of the 2-layer Qwen2 base."""
    steps: int = 300
    """Optimizer steps."""
    batch: int = 32
    """Examples per step."""
    lr: float = 3e-3
    """AdamW learning rate (cosine to 10%)."""


@dataclass(frozen=True)
class MemoryConfig:
    """The memory model and its Eq 2 training."""

    hidden: int = 64
    """Hidden size of the 2-layer Qwen2 memory (same tokenizer as the base)."""
    steps: int = 300
    """Optimizer steps in total (a resumed run continues up to this)."""
    batch: int = 16
    """Examples per step."""
    lr: float = 3e-3
    """AdamW learning rate (cosine to 10%)."""
    beta: float = 0.5
    """β of Eq 2: weight of KL(p_kNN ‖ p_mem) against CE(gold)."""
    save_every: int = 100
    """Checkpoint every N steps (and at the end)."""


@dataclass(frozen=True)
class RouterTrainConfig:
    """The λ router and its Eq 4 training on a domain/general mixture."""

    width: int = 64
    """Router MLP width."""
    steps: int = 200
    """Optimizer steps."""
    batch: int = 32
    """Examples per step, half domain, half general."""
    lr: float = 3e-3
    """Adam learning rate."""
    alpha_s: float = 0.1
    """α_s of Eq 4: strength of the signed prior (−1 domain, +1 general)."""


PATH_FIELDS = ("base", "tokenizer", "domain_train", "domain_eval", "general_train", "general_eval")
"""``MemdecConfig`` fields that name a file or directory with a default under ``work_dir``."""


@dataclass(frozen=True)
class MemdecConfig:
    """One Memory Decoder run."""

    work_dir: str = "out/memdec"
    """Everything the run writes: models, datastore cursor, kNN targets, checkpoints, eval.json."""
    base: str = ""
    """Frozen base causal LM (HF name or path); empty = ``<work_dir>/base`` (trained by ``prepare``)."""
    tokenizer: str = ""
    """Tokenizer shared by base and memory; empty = ``<work_dir>/tokenizer``."""
    domain_train: str = ""
    """jsonl of {"question", "answer"} (or {"text"}) rows: the datastore and memory corpus."""
    domain_eval: str = ""
    """Domain held-out jsonl."""
    shards: str = ""
    """Build output directory (``scifolio build --out``) whose shards' text is a second datastore/memory source;
    empty = none."""
    general_train: str = ""
    """General-text jsonl ({"text"}): the base's pre-training set and the router's general half."""
    general_eval: str = ""
    """General held-out jsonl."""
    store: StoreConfig = field(default_factory=StoreConfig)
    """Where the datastore's keys live."""
    datastore: DatastoreConfig = field(default_factory=DatastoreConfig)
    """Key encoding and Eq 1."""
    base_train: BaseTrainConfig = field(default_factory=BaseTrainConfig)
    """Base pre-training (synthetic experiment)."""
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    """Memory model and Eq 2."""
    router: RouterTrainConfig = field(default_factory=RouterTrainConfig)
    """Router and Eq 4."""
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    """Generated data sizes (``prepare``)."""
    seed: int = 0
    """Seeds model init and batch order."""
    threads: int = 0
    """torch intra-op threads; 0 = torch's default (one per core). Tiny models want 1: on a busy 2-core machine
    two OpenMP threads spin against other processes and ran base training 14x slower here."""

    def path(self, name: str) -> str:
        """A configured path, or its default under ``work_dir``: ``name`` is one of ``PATH_FIELDS``."""
        if name not in PATH_FIELDS:
            raise ValueError(f"unknown path {name!r}: one of {', '.join(PATH_FIELDS)}")
        default = name if name in ("base", "tokenizer") else f"data/{name}.jsonl"  # where ``prepare`` writes them
        return getattr(self, name) or str(Path(self.work_dir) / default)

    @property
    def store_uri(self) -> str:
        return self.store.uri or str(Path(self.work_dir) / "datastore.db")

    @property
    def memory_dir(self) -> Path:
        return Path(self.work_dir) / "memory"

    @property
    def router_path(self) -> Path:
        return Path(self.work_dir) / "router.pt"

    @property
    def targets_path(self) -> Path:
        return Path(self.work_dir) / "knn_targets.parquet"


def debug(work_dir: str = "out/memdec", **overrides: Any) -> MemdecConfig:
    """Tiny everything: a 2-layer d=64 base and memory, ~120 domain examples, exact FLAT search; ~1–2 min on 2 cores."""
    cfg = MemdecConfig(
        work_dir=work_dir,
        store=StoreConfig(index_type="FLAT"),
        datastore=DatastoreConfig(batch_examples=32, k=8, tau=4.0),
        base_train=BaseTrainConfig(steps=250, batch=32),
        memory=MemoryConfig(steps=250, batch=16, beta=0.5, save_every=100),
        router=RouterTrainConfig(steps=250, batch=32, alpha_s=0.1),
        synthetic=SyntheticConfig(n_genes=40, n_general_train=2000, n_general_eval=100),
        threads=1,
    )
    return with_overrides(cfg, overrides)


def small(work_dir: str = "out/memdec", **overrides: Any) -> MemdecConfig:
    """A real run's shape: point ``base``/``tokenizer``/data paths at real ones; HNSW, one collection on 8 Milvus
    shards."""
    cfg = MemdecConfig(
        work_dir=work_dir,
        store=StoreConfig(index_type="HNSW", shards_num=8),
        datastore=DatastoreConfig(batch_examples=64, max_len=1024, k=64, tau=10.0),
        memory=MemoryConfig(hidden=512, steps=20000, batch=32, lr=5e-4, save_every=1000),
        router=RouterTrainConfig(width=256, steps=5000, batch=32, lr=1e-3),
    )
    return with_overrides(cfg, overrides)


RECIPES: dict[str, Callable[..., MemdecConfig]] = {"debug": debug, "small": small}
