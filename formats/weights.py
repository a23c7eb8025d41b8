"""Sample weights: one parquet table, written by retrieval (``scifolio index weights``), read by pre-training.

Schema (one row per weighted item; items not listed weigh 1):

    level   string   "chunk" | "image"
    id      string   chunk id (``doc_id:chunk_index``) or image sha256
    weight  float32  finite, >= 0
    score   float32  the image's best reranker score (NaN on chunk rows and where not applicable)

What a weight means — the one definition every reader applies: the pre-training loader's **draw weight** of a
chunk is

    draw(chunk) = own(chunk) × listed(chunk)

where ``own`` is the shard row's ``sample_weight`` and ``listed`` is the chunk's ``weight`` in this table, 1 when
the chunk is not listed. A weight may be above 1 (drawn more often), below 1 (down-weighted) or 0 (excluded). Over
one epoch the loader draws a chunk ⌊draw⌋ times plus once more with probability draw − ⌊draw⌋, so its expected
count is exactly ``draw`` (``pretrain.data.ShardIndex.plan``). Image rows are provenance (why a chunk was
raised); only chunk rows are applied. A table none of whose chunk ids is in the corpus is an error: it was made
for another corpus, and applying it silently would change nothing.

    from formats.weights import SampleWeights
    SampleWeights(chunks={"d:0": 2.0}).write("weights.parquet")
    draw = SampleWeights.read("weights.parquet").draw_weights(chunk_ids, own)
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from formats import fs

log = logging.getLogger(__name__)

SCHEMA = pa.schema(
    [("level", pa.string()), ("id", pa.string()), ("weight", pa.float32()), ("score", pa.float32())],
    metadata={"scifolio.weights": "1", "scifolio.default_weight": "1.0"},
)
LEVELS = ("chunk", "image")


class WeightsMismatch(ValueError):
    """The weights table names no chunk of the corpus it is applied to."""


def _check(kind: str, weights: Mapping[str, float]) -> None:
    for key, w in weights.items():
        if not (math.isfinite(w) and w >= 0):
            raise ValueError(f"{kind} {key}: a sample weight must be finite and >= 0, got {w}")


@dataclass(frozen=True)
class SampleWeights:
    chunks: Mapping[str, float] = field(default_factory=dict)
    """chunk id → weight (multiplies the row's own sample_weight)."""
    images: Mapping[str, float] = field(default_factory=dict)
    """image sha256 → weight (provenance: which crops raised their chunks)."""
    scores: Mapping[str, float] = field(default_factory=dict)
    """image sha256 → best reranker score."""

    def __post_init__(self) -> None:
        _check("chunk", self.chunks)
        _check("image", self.images)

    def write(self, path: str | os.PathLike[str]) -> int:
        """Write the table (committed whole); returns the number of rows."""
        rows = [("image", k, w, self.scores.get(k, math.nan)) for k, w in sorted(self.images.items())]
        rows += [("chunk", k, w, math.nan) for k, w in sorted(self.chunks.items())]
        table = pa.table(
            {
                "level": pa.array([r[0] for r in rows], pa.string()),
                "id": pa.array([r[1] for r in rows], pa.string()),
                "weight": pa.array([r[2] for r in rows], pa.float32()),
                "score": pa.array([r[3] for r in rows], pa.float32()),
            },
            schema=SCHEMA,
        )
        with fs.open_output(path) as f:
            pq.write_table(table, f)
        return table.num_rows

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> SampleWeights:
        with fs.open_input(path) as f:
            table = pq.read_table(f)
        missing = set(SCHEMA.names) - set(table.column_names)
        if missing:
            raise ValueError(
                f"{path} is not a sample-weights table (missing columns {sorted(missing)}; expected {SCHEMA.names}, "
                "as written by `scifolio index weights`)"
            )
        chunks: dict[str, float] = {}
        images: dict[str, float] = {}
        scores: dict[str, float] = {}
        for level, key, w, s in zip(*(table.column(c).to_pylist() for c in SCHEMA.names)):
            if level == "chunk":
                chunks[key] = float(w)
            elif level == "image":
                images[key] = float(w)
                if s is not None and not math.isnan(s):
                    scores[key] = float(s)
            else:
                raise ValueError(f"{path}: unknown level {level!r} (expected one of {LEVELS})")
        return cls(chunks, images, scores)

    def draw_weights(self, chunk_ids: Sequence[str], own: Sequence[float]) -> list[float]:
        """``own × listed`` per chunk (see the module docstring). Checks nothing about coverage; see ``check_coverage``."""
        return [float(o) * float(self.chunks.get(c, 1.0)) for c, o in zip(chunk_ids, own)]


def check_coverage(weights: SampleWeights, all_chunk_ids: set[str], source: str = "weights") -> int:
    """Number of listed chunk ids found in the corpus; an error when the table lists chunks and none matches."""
    listed = set(weights.chunks)
    found = len(listed & all_chunk_ids)
    if listed and not found:
        sample = ", ".join(sorted(listed)[:3])
        raise WeightsMismatch(
            f"{source}: none of its {len(listed)} chunk ids (e.g. {sample}) is in the corpus; it was made for other shards"
        )
    if not listed:
        raise WeightsMismatch(f"{source}: lists no chunk weights, so applying it would change nothing")
    if found < len(listed):
        log.warning("%s: %d of %d listed chunk ids are not in the corpus", source, len(listed) - found, len(listed))
    return found


DRAW_SCHEMA = pa.schema(
    [("chunk_id", pa.string()), ("own", pa.float64()), ("listed", pa.float64()), ("draw", pa.float64())],
    metadata={"scifolio.draw_weights": "1"},
)


@dataclass(frozen=True)
class DrawWeights:
    """The draw weight a training run used for every chunk: ``draw = own × listed`` (written by pre-training
    beside its metrics, so what a run sampled by can be checked after the fact)."""

    chunk_ids: Sequence[str]
    own: Sequence[float]
    listed: Sequence[float]

    @property
    def draw(self) -> list[float]:
        return [float(o) * float(w) for o, w in zip(self.own, self.listed)]

    def write(self, path: str | os.PathLike[str]) -> None:
        table = pa.table(
            {"chunk_id": list(self.chunk_ids), "own": list(self.own), "listed": list(self.listed), "draw": self.draw},
            schema=DRAW_SCHEMA,
        )
        with fs.open_output(path) as f:
            pq.write_table(table, f)

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> DrawWeights:
        with fs.open_input(path) as f:
            t = pq.read_table(f)
        return cls(t.column("chunk_id").to_pylist(), t.column("own").to_pylist(), t.column("listed").to_pylist())

    def by_chunk(self) -> dict[str, float]:
        return dict(zip(self.chunk_ids, self.draw))
