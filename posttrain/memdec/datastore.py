"""Token datastore (SPEC §C9): key = the frozen base's last hidden state of a prefix, value = the next token.

The keys live in any store that satisfies :class:`KeyValueStore` (``retrieval.vectors.ShardedVectorStore`` — a
family of sharded Milvus collections — is the real one; the CLI wires it in, posttrain never imports retrieval).

Resumable: a row's id is ``example index << 20 | position`` (the same on every run), upserts are idempotent,
and ``<work_dir>/datastore_cursor.json`` records the next example only after its batch is flushed. A run killed
anywhere re-encodes at most one batch and upserts it again: nothing lost, nothing duplicated.

Then :func:`write_knn_targets` turns real search results into Eq 1 distributions, top-k sparse, in parquet.

    scifolio memdec build-datastore --config debug --work-dir out/memdec
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from formats import fs
from posttrain.memdec.data import POSITION_BITS, Example, collate, forward, shifted
from posttrain.objectives.memory_decoder import knn_distribution


class Neighbours(Protocol):
    distances: np.ndarray  # [B, k] what the store's metric returns (squared L2: Eq 1's d)
    values: np.ndarray  # [B, k] next-token ids; −1 pads
    ids: np.ndarray  # [B, k] row ids; −1 pads


class KeyValueStore(Protocol):
    """What the builder needs from a vector store (``retrieval.vectors.ShardedVectorStore`` implements it)."""

    def ensure(self, dim: int) -> None: ...
    def upsert(self, ids: np.ndarray, keys: np.ndarray, values: np.ndarray) -> int: ...
    def flush(self) -> None: ...
    def search(self, queries: np.ndarray, k: int) -> Neighbours: ...
    def count(self) -> int: ...


def row_ids(example: Example) -> np.ndarray:
    """Deterministic ids of an example's answer-side positions."""
    return np.array([(example.index << POSITION_BITS) | t for t in example.positions()], dtype=np.int64)


@torch.no_grad()
def encode_keys(base, examples: Sequence[Example], pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ids, keys, values)`` for every answer-side position of ``examples``."""
    batch = collate(examples, pad_id)
    _, hidden = forward(base, batch)
    keys = shifted(hidden, batch).float().numpy()
    values = batch.ids[batch.predict].numpy()
    ids = np.concatenate([row_ids(e) for e in examples])
    return ids, keys, values


def build_datastore(
    base,
    examples: Sequence[Example],
    store: KeyValueStore,
    cursor_path: Path,
    pad_id: int,
    batch_examples: int = 32,
    source: str = "",
    progress: Callable[[int], None] | None = None,
    after_upsert: Callable[[int], None] | None = None,
) -> dict:
    """Encode and store every example from the cursor on; returns ``{"examples", "keys", "resumed_from"}``.

    ``source`` names the input (e.g. its path); a cursor written for another source is refused.
    ``after_upsert(batch_no)`` runs between a batch's upsert and its cursor commit (tests kill the process there).
    """
    cursor = {"next": 0, "keys": 0, "source": source}
    if cursor_path.exists():
        cursor = json.loads(cursor_path.read_text())
        if cursor.get("source") != source:
            raise ValueError(f"cursor {cursor_path} belongs to {cursor.get('source')!r}, not {source!r}")
    resumed_from = cursor["next"]
    store.ensure(base.config.hidden_size)
    for batch_no, start in enumerate(range(resumed_from, len(examples), batch_examples)):
        part = examples[start : start + batch_examples]
        ids, keys, values = encode_keys(base, part, pad_id)
        store.upsert(ids, keys, values)
        store.flush()
        if after_upsert is not None:
            after_upsert(batch_no)
        cursor = {"next": start + len(part), "keys": cursor["keys"] + len(ids), "source": source}
        fs.write_text(cursor_path, json.dumps(cursor))  # atomic: a reader sees the old cursor or the new one
        if progress is not None:
            progress(len(part))
    return {"examples": len(examples), "keys": cursor["keys"], "resumed_from": resumed_from}


class InMemoryStore:
    """Exact squared-L2 search over keys held in process memory (one matmul + top-k per query block): the
    kNN-LM reference at datastore sizes that fit in RAM, and a :class:`KeyValueStore` for tests and benchmarks.
    Upserting an id that is already stored replaces its row, as Milvus does."""

    def __init__(self, query_block: int = 1024) -> None:
        self.query_block = query_block
        self._keys: list[np.ndarray] = []
        self._values: list[np.ndarray] = []
        self._ids: list[np.ndarray] = []
        self._packed: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.dim: int | None = None

    def ensure(self, dim: int) -> None:
        if self.dim is not None and self.dim != dim:
            raise ValueError(f"store holds {self.dim}-d keys, not {dim}-d")
        self.dim = dim

    def upsert(self, ids: np.ndarray, keys: np.ndarray, values: np.ndarray) -> int:
        ids = np.asarray(ids, dtype=np.int64)
        keys = np.asarray(keys, dtype=np.float32).reshape(len(ids), -1)
        self.ensure(keys.shape[1])
        self._keys.append(keys)
        self._values.append(np.asarray(values, dtype=np.int64))
        self._ids.append(ids)
        self._packed = None
        return len(ids)

    def flush(self) -> None:
        self._pack()

    def count(self) -> int:
        return len(self._pack()[0])

    def _pack(self):
        if self._packed is None:
            keys = np.concatenate(self._keys) if self._keys else np.zeros((0, self.dim or 0), np.float32)
            values = np.concatenate(self._values) if self._values else np.zeros(0, np.int64)
            ids = np.concatenate(self._ids) if self._ids else np.zeros(0, np.int64)
            last = {int(i): r for r, i in enumerate(ids)}  # a re-upserted id keeps its newest row
            rows = np.array(sorted(last.values()), dtype=np.int64)
            keys, values, ids = keys[rows], values[rows], ids[rows]
            self._keys, self._values, self._ids = [keys], [values], [ids]
            k = torch.from_numpy(keys)
            self._packed = (torch.from_numpy(ids), k, (k * k).sum(-1), torch.from_numpy(values))
        return self._packed

    def search(self, queries: np.ndarray, k: int) -> _Arrays:
        ids, keys, sq, values = self._pack()
        q = torch.from_numpy(np.asarray(queries, dtype=np.float32)).reshape(-1, keys.shape[1])
        kk = min(k, len(ids))
        out_d, out_i = [], []
        for start in range(0, len(q), self.query_block):
            qb = q[start : start + self.query_block]
            d = (qb * qb).sum(-1, keepdim=True) - 2 * qb @ keys.T + sq  # ‖q − k‖², exact up to fp32 rounding
            dist, idx = d.topk(kk, dim=-1, largest=False)
            out_d.append(dist.clamp(min=0))
            out_i.append(idx)
        dist = torch.cat(out_d) if out_d else torch.zeros(0, kk)
        idx = torch.cat(out_i) if out_i else torch.zeros(0, kk, dtype=torch.int64)
        pad = k - kk  # fewer rows than k: pad as Milvus does (id −1)
        d_np, v_np, i_np = dist.numpy(), values[idx].numpy(), ids[idx].numpy()
        if pad:
            d_np = np.pad(d_np, ((0, 0), (0, pad)), constant_values=np.inf)
            v_np = np.pad(v_np, ((0, 0), (0, pad)), constant_values=-1)
            i_np = np.pad(i_np, ((0, 0), (0, pad)), constant_values=-1)
        return _Arrays(d_np, v_np, i_np)


def knn_from_neighbours(nb: Neighbours, vocab_size: int, tau: float):
    """Eq 1 from a store's search result: ``[B, V]`` probabilities (float64). Pads (id −1) get no vote. The distance
    is used exactly as the store returned it."""
    d = torch.from_numpy(np.asarray(nb.distances, dtype=np.float64))
    mask = torch.from_numpy(np.asarray(nb.ids)) >= 0
    d = torch.where(mask, d, torch.zeros_like(d))  # +inf pads would poison softmax even when masked
    values = torch.from_numpy(np.asarray(nb.values)).clamp(min=0)
    return knn_distribution(d, values, vocab_size, tau=tau, mask=mask)


def sparse_top(p: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ≤ k tokens with mass in each row of ``p`` (``[B, V]``): ``(tokens [B, k] int32, probs [B, k] float32)``,
    zero-probability slots padded with token 0 / prob 0. Exact: Eq 1 puts mass on at most k distinct tokens."""
    probs, tokens = p.topk(min(k, p.shape[-1]), dim=-1)
    tokens = torch.where(probs > 0, tokens, torch.zeros_like(tokens))
    return tokens.to(torch.int32).numpy(), probs.to(torch.float32).numpy()


@torch.no_grad()
def write_knn_targets(
    base,
    examples: Sequence[Example],
    store: KeyValueStore,
    out_path: Path,
    pad_id: int,
    vocab_size: int,
    k: int,
    tau: float,
    exclude_self: bool = True,
    batch_examples: int = 32,
    progress: Callable[[int], None] | None = None,
    encode: Callable[[Sequence[Example]], tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None,
) -> dict:
    """Precompute Eq 1 once for every answer-side position and write it top-k sparse to parquet (one row per
    example: ``index, ids, answer_start, knn_tokens list<list<int32>>, knn_probs list<list<float32>>``).

    ``encode(examples) -> (ids, keys, values)`` replaces the base's forward when the keys are already at hand
    (cached hidden states); it must return what :func:`encode_keys` would.
    Written to a temporary file and renamed, so a crash leaves no half file (the stage simply reruns)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            ("index", pa.int64()),
            ("ids", pa.list_(pa.int32())),
            ("answer_start", pa.int32()),
            ("knn_tokens", pa.list_(pa.list_(pa.int32()))),
            ("knn_probs", pa.list_(pa.list_(pa.float32()))),
        ]
    )
    tmp = out_path.with_suffix(".tmp.parquet")
    n_pos = 0
    with pq.ParquetWriter(tmp, schema) as writer:
        for start in range(0, len(examples), batch_examples):
            part = examples[start : start + batch_examples]
            ids, keys, _ = encode_keys(base, part, pad_id) if encode is None else encode(part)
            nb = store.search(keys, k + 1 if exclude_self else k)
            # with exclude_self the query's own key is among the results; the remaining top k vote
            p = knn_from_neighbours(_drop_self(nb, ids, k) if exclude_self else nb, vocab_size, tau)
            tokens, probs = sparse_top(p, k)
            rows = {"index": [], "ids": [], "answer_start": [], "knn_tokens": [], "knn_probs": []}
            off = 0
            for e in part:
                n = len(e.positions())
                rows["index"].append(e.index)
                rows["ids"].append(list(e.ids))
                rows["answer_start"].append(e.answer_start)
                rows["knn_tokens"].append(tokens[off : off + n].tolist())
                rows["knn_probs"].append(probs[off : off + n].tolist())
                off += n
            writer.write_table(pa.table(rows, schema=schema))
            n_pos += off
            if progress is not None:
                progress(len(part))
    fs.commit(tmp, out_path)
    return {"examples": len(examples), "positions": n_pos}


class _Arrays:
    def __init__(self, distances: np.ndarray, values: np.ndarray, ids: np.ndarray):
        self.distances, self.values, self.ids = distances, values, ids


def _drop_self(nb: Neighbours, self_ids: np.ndarray, k: int) -> _Arrays:
    """Remove each row's own id (if returned) and keep the first k of the rest, order preserved."""
    keep = np.asarray(nb.ids) != self_ids[:, None]
    # Stable sort moves the dropped column to the end of the row; then cut to k.
    order = np.argsort(~keep, axis=1, kind="stable")[:, :k]
    take = lambda a: np.take_along_axis(np.asarray(a), order, axis=1)  # noqa: E731
    return _Arrays(take(nb.distances), take(nb.values), take(nb.ids))


def read_targets(path: Path, batch_rows: int = 64):
    """Stream target rows from parquet in row batches (never the whole file in memory)."""
    import pyarrow.parquet as pq

    f = pq.ParquetFile(path)
    for rb in f.iter_batches(batch_size=batch_rows):
        yield from rb.to_pylist()
