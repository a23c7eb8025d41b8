"""Streaming, packed, resumable batches over the corpus shards (``formats/shards.py``).

    loader = ShardLoader(DataConfig(shards="out"), rank=0, world_size=1)      # out = `scifolio build --out`
    batch = next(loader); state = loader.state_dict()      # ... later: loader.load_state_dict(state)

The order is a pure function of (seed, epoch): each epoch permutes the shards, then the rows inside each shard,
after repeating every row by its draw weight (``formats/weights.py``: the row's own sample_weight × the
retrieval weights file's weight, 1 when unlisted). That global stream is dealt round-robin to the R = world_size ×
num_workers readers, so every rank computes the same plan without talking to the others. A reader's position is a
*cursor* — (epoch, index in its stream, token offset inside the sample) for the text pointer and the same for the
page pointer — attached to every batch it yields. Saving the cursor of the last consumed batch and restarting from
it continues exactly where training stopped: nothing repeated, nothing skipped.

Packing: a sample's segments flatten to token ids with image slots; rows of ``seq_len`` are filled sample after
sample (``seq_ids`` numbers the pieces so attention never crosses them); an image is atomic, so one that does not
fit in the rest of a row moves to the next row. Page renders feed the next-patch objective as their own stream.

Series rows (``scifolio build`` of series files) pack like images: a ``series`` segment takes
min(n_tokens, ``max_series_tokens``) slots, atomic, filled by the series encoder's tokens; the batch carries each
series' context (its last ``series_context`` points before the held-out tail) and the tail (``series_horizon``
points, the forecasting target). With ``data.series="auto"`` and no series in the shards nothing of this is read.

Memory: a pointer holds one shard's columns it needs at a time, never the corpus.
"""

from __future__ import annotations

import hashlib
import io
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from formats.shards import ChunkRow, ShardFile, list_shards
from formats.weights import DrawWeights, SampleWeights, check_coverage
from pretrain.config import DataConfig
from pretrain.model import foreground_mask
from pretrain.objective import IGNORE

TEXT_PARTS = ("segments", "images")
SERIES_PARTS = ("series",)
PAGE_PARTS = ("page_renders",)


# --- the plan: which rows, in which order, for which reader -------------------------------------------------------


@dataclass(frozen=True)
class ShardIndex:
    """Files and per-row sample weights, read once (cheap columns only)."""

    files: tuple[str, ...]
    weights: tuple[np.ndarray, ...]  # float64 per row, per file
    series: int = 0
    """Series records in the shards (from the parquet footers): the time-series lane is on when > 0."""

    @classmethod
    def open(cls, shards: str, weights_path: str | None = None, record: str | None = None) -> ShardIndex:
        """``shards``: a build output directory (``scifolio build --out``); ``weights_path``: a sample-weights
        table (``scifolio index weights``), applied as ``formats.weights`` defines. ``record``: write every
        chunk's (own, listed, draw) weight there (parquet), the provenance of what a run trained on."""
        files = list_shards(shards)
        listed = SampleWeights.read(weights_path) if weights_path else None
        per_file = [ShardFile(path).sample_weights() for path in files]
        if listed is not None:
            check_coverage(listed, {c for ids, _ in per_file for c in ids}, source=str(weights_path))
        weights = []
        for path, (ids, own) in zip(files, per_file):
            draw = listed.draw_weights(ids, own) if listed is not None else own
            w = np.asarray(draw, dtype=np.float64)
            if (w < 0).any() or not np.isfinite(w).all():
                raise ValueError(f"{path}: sample weights must be finite and ≥ 0")
            weights.append(w)
        if record:
            ids = [c for file_ids, _ in per_file for c in file_ids]
            own = [o for _, file_own in per_file for o in file_own]
            DrawWeights(ids, own, [listed.chunks.get(c, 1.0) if listed else 1.0 for c in ids]).write(record)
        return cls(tuple(files), tuple(weights), sum(ShardFile(path).series_count() for path in files))

    def plan(self, seed: int, epoch: int) -> np.ndarray:
        """The epoch's global stream as ``[n, 2]`` (file index, row index)."""
        rng = np.random.default_rng([seed, epoch])
        parts = []
        for f in rng.permutation(len(self.files)):
            w = self.weights[f]
            # A row is seen ⌊w⌋ times, plus once more with probability frac(w): E[count] = w, deterministic per epoch.
            counts = np.floor(w).astype(np.int64) + (rng.random(len(w)) < (w - np.floor(w)))
            rows = np.repeat(np.arange(len(w)), counts)
            rows = rows[rng.permutation(len(rows))]
            parts.append(np.stack([np.full(len(rows), f), rows], axis=1))
        return np.concatenate(parts) if parts else np.zeros((0, 2), dtype=np.int64)


# --- one reader's view --------------------------------------------------------------------------------------------


class _Pointer:
    """Walks one reader's share of the stream across epochs; loads one shard's columns at a time."""

    def __init__(
        self,
        index: ShardIndex,
        seed: int,
        reader: int,
        n_readers: int,
        parts: tuple[str, ...],
        state: tuple[int, int, int] = (0, 0, 0),
    ) -> None:
        self.index, self.seed, self.reader, self.n_readers, self.parts = index, seed, reader, n_readers, parts
        self.epoch, self.pos, self.offset = state
        self._plans: dict[int, np.ndarray] = {}
        self._table: tuple[int, list[ChunkRow]] | None = None

    def state(self) -> tuple[int, int, int]:
        return (self.epoch, self.pos, self.offset)

    def mine(self, epoch: int) -> np.ndarray:
        if epoch not in self._plans:
            self._plans = {epoch: self.index.plan(self.seed, epoch)[self.reader :: self.n_readers]}
        return self._plans[epoch]

    def current(self) -> ChunkRow:
        """The row under the pointer (advancing past epoch ends)."""
        plan = self.mine(self.epoch)
        if len(plan) == 0:
            raise RuntimeError(
                f"reader {self.reader}/{self.n_readers} has no samples in epoch {self.epoch}: "
                "fewer (weighted) samples than ranks × workers"
            )
        while self.pos >= len(plan):
            self.epoch, self.pos, self.offset = self.epoch + 1, 0, 0
            plan = self.mine(self.epoch)
        f, r = (int(v) for v in plan[self.pos])
        if self._table is None or self._table[0] != f:
            self._table = (f, ShardFile(self.index.files[f]).read_chunks(self.parts))
        return self._table[1][r]

    def advance(self) -> None:
        self.pos, self.offset = self.pos + 1, 0


@dataclass
class _Sample:
    chunk_id: str
    tokens: np.ndarray  # int64, -1 marks an image or series slot
    images: list[tuple[int, int, bytes, str]]  # (start, length, png, sha256)
    series: list[tuple[int, int, np.ndarray, np.ndarray]] = field(default_factory=list)
    """(start, length, context [C, ≤ series_context], held-out tail [C, series_horizon] NaN-padded)"""

    def atomic(self) -> list[tuple[int, int]]:
        """(start, length) of every span a row boundary may not cut: images and series."""
        return [(a, n) for a, n, *_ in self.images] + [(a, n) for a, n, *_ in self.series]


def split_series(values: np.ndarray, context: int, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """``[C, T]`` → (context ``[C, ≤ context]``: the points before the tail; tail ``[C, horizon]``: the last
    min(horizon, T // 2) points, NaN-padded). A series of one point has no tail (all NaN: no forecasting target)."""
    t = values.shape[1]
    h = min(horizon, t // 2)
    tail = np.full((values.shape[0], horizon), np.nan)
    tail[:, :h] = values[:, t - h :]
    return values[:, max(0, t - h - context) : t - h], tail


def flatten(row: ChunkRow, max_image_tokens: int, cfg: DataConfig | None = None, series: bool = False) -> _Sample:
    """Segments → one token array with image and series slots (``-1``); an image takes min(n_tokens,
    max_image_tokens) slots, a series (when ``series``; else it is skipped) min(n_tokens, cfg.max_series_tokens)."""
    pngs = {im.sha256: im.png for im in row.images}
    records = {r.series_id: r for r in row.series}
    pieces, images, spans, at = [], [], [], 0
    for seg in row.segments:
        if seg.kind == "series":
            if not series or cfg is None:
                continue
            rec = records.get(seg.series_id or "")
            if rec is None:
                raise ValueError(f"{row.chunk_id}: series segment {seg.series_id} has no record in the row's series")
            n = max(1, min(seg.n_tokens, cfg.max_series_tokens))
            values = np.asarray(rec.values, dtype=np.float64).reshape(len(rec.values), -1)
            ctx, tail = split_series(values, cfg.series_context, cfg.series_horizon)
            spans.append((at, n, ctx, tail))
            pieces.append(np.full(n, -1, dtype=np.int64))
            at += n
        elif seg.kind == "image":
            sha = seg.image_sha256
            if sha not in pngs:
                raise ValueError(f"{row.chunk_id}: image segment {sha} has no bytes in the row's images")
            n = max(1, min(seg.n_tokens, max_image_tokens))
            images.append((at, n, pngs[sha], sha))
            pieces.append(np.full(n, -1, dtype=np.int64))
            at += n
        else:
            ids = np.asarray(seg.token_ids, dtype=np.int64)
            pieces.append(ids)
            at += len(ids)
    tokens = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    return _Sample(row.chunk_id, tokens, images, spans)


def load_pixels(png: bytes, size: tuple[int, int]) -> torch.Tensor:
    """PNG → ``[3, H, W]`` float in [0, 1], resized to ``size`` = (H, W)."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        rgb = im.convert("RGB").resize((size[1], size[0]), Image.BILINEAR)
        arr = np.asarray(rgb, dtype=np.float32) / 255.0
    return torch.from_numpy(arr).permute(2, 0, 1).contiguous()


class Packer:
    """One reader: yields packed micro-batches forever, each carrying the cursor after it."""

    def __init__(
        self, cfg: DataConfig, index: ShardIndex, reader: int, n_readers: int, cursor: dict[str, Any] | None = None
    ) -> None:
        if cfg.max_image_tokens > cfg.seq_len:
            raise ValueError("max_image_tokens must be ≤ seq_len (an image is never split across rows)")
        self.series = series_lane(cfg, index)
        if self.series and cfg.max_series_tokens > cfg.seq_len:
            raise ValueError("max_series_tokens must be ≤ seq_len (a series is never split across rows)")
        self.cfg, self.reader = cfg, reader
        cursor = cursor or {}
        parts = TEXT_PARTS + (SERIES_PARTS if self.series else ())
        self.text = _Pointer(index, cfg.seed, reader, n_readers, parts, tuple(cursor.get("text", (0, 0, 0))))
        self.pages = _Pointer(index, cfg.seed, reader, n_readers, PAGE_PARTS, tuple(cursor.get("pages", (0, 0, 0))))
        self._sample: tuple[tuple[int, int], _Sample] | None = None

    def cursor(self) -> dict[str, Any]:
        return {"reader": self.reader, "text": list(self.text.state()), "pages": list(self.pages.state())}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            yield self.next_batch()

    def next_batch(self) -> dict[str, Any]:
        b, t = self.cfg.micro_batch, self.cfg.seq_len
        input_ids = np.zeros((b, t), dtype=np.int64)
        labels = np.full((b, t), IGNORE, dtype=np.int64)
        positions = np.zeros((b, t), dtype=np.int64)
        seq_ids = np.zeros((b, t), dtype=np.int64)
        slots, crops, crop_keys, spans, finished = [], [], [], [], 0
        series_slots, series_ctx, series_tail = [], [], []
        for row in range(b):
            fill, piece = 0, 0
            while fill < t:
                sample = self._current_sample()
                o = self.text.offset
                take = min(t - fill, len(sample.tokens) - o)
                for start, n in sample.atomic():  # never cut an image or a series: stop before it
                    if start < o + take < start + n:
                        take = start - o
                if take <= 0 and len(sample.tokens) > o:
                    break  # the next image does not fit in what is left of this row
                piece += 1
                ids = sample.tokens[o : o + take]
                input_ids[row, fill : fill + take] = np.where(ids >= 0, ids, 0)
                positions[row, fill : fill + take] = np.arange(take)
                seq_ids[row, fill : fill + take] = piece
                # label[t] = the next token, when it is text and inside this piece (image slots are never targets)
                nxt = ids[1:]
                labels[row, fill : fill + take - 1] = np.where(nxt >= 0, nxt, IGNORE)
                for start, n, png, sha in sample.images:
                    if o <= start < o + take:
                        slots.append((row, fill + start - o, n))
                        crops.append(load_pixels(png, (self.cfg.crop_size, self.cfg.crop_size)))
                        crop_keys.append(sha)
                for start, n, ctx, tail in sample.series:
                    if o <= start < o + take:
                        series_slots.append((row, fill + start - o, n))
                        series_ctx.append(ctx)
                        series_tail.append(tail)
                spans.append((sample.chunk_id, self.text.epoch, o, o + take))
                fill += take
                self.text.offset = o + take
                if self.text.offset >= len(sample.tokens):
                    self.text.advance()
                    finished += 1
        page_pixels, page_mask, page_keys = self._pages()
        size = self.cfg.crop_size
        return {
            "input_ids": torch.from_numpy(input_ids),
            "labels": torch.from_numpy(labels),
            "position_ids": torch.from_numpy(positions),
            "seq_ids": torch.from_numpy(seq_ids),
            "image_pixels": torch.stack(crops) if crops else torch.zeros(0, 3, size, size),
            "image_slots": torch.tensor(slots, dtype=torch.long).reshape(-1, 3),
            "image_keys": crop_keys,
            "page_pixels": page_pixels,
            "page_mask": page_mask,
            "page_keys": page_keys,
            **self._series_batch(series_slots, series_ctx, series_tail),
            "spans": spans,
            "samples_finished": finished,
            "cursor": self.cursor(),
        }

    def _current_sample(self) -> _Sample:
        key = (self.text.epoch, self.text.pos)
        while True:
            row = self.text.current()
            key = (self.text.epoch, self.text.pos)
            if self._sample is None or self._sample[0] != key:
                self._sample = (key, flatten(row, self.cfg.max_image_tokens, self.cfg, self.series))
            if len(self._sample[1].tokens) > self.text.offset:
                return self._sample[1]
            self.text.advance()  # an empty sample: nothing to pack

    def _series_batch(self, slots: list, ctx: list[np.ndarray], tail: list[np.ndarray]) -> dict[str, Any]:
        """Series slots ``[K, 3]`` (row, start, length), contexts ``[K, C, T]`` (NaN-padded at the start: aligned at
        their end, as the encoder wants) and tails ``[K, C, H]`` (NaN where missing). Empty when the lane is off."""
        if not self.series:
            return {}
        k, h = len(slots), self.cfg.series_horizon
        c = max((a.shape[0] for a in ctx), default=1)
        t = max((a.shape[1] for a in ctx), default=1) or 1
        x, y = np.full((k, c, t), np.nan), np.full((k, c, h), np.nan)
        for i, (a, b) in enumerate(zip(ctx, tail)):
            if a.shape[1]:
                x[i, : a.shape[0], t - a.shape[1] :] = a
            y[i, : b.shape[0]] = b
        return {
            "series_slots": torch.tensor(slots, dtype=torch.long).reshape(-1, 3),
            "series_context": torch.from_numpy(x),
            "series_target": torch.from_numpy(y),
        }

    def _pages(self) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
        """Up to ``pages_per_batch`` renders with ≥ 2 foreground patches (fewer predict nothing; skipped)."""
        h, w = self.cfg.page_size
        n = (h // self.cfg.patch) * (w // self.cfg.patch)
        pixels, masks, keys = [], [], []
        scanned_without_pages = 0
        while len(pixels) < self.cfg.pages_per_batch:
            row = self.pages.current()
            renders = row.page_renders
            if self.pages.offset >= len(renders):
                self.pages.advance()
                scanned_without_pages += 1
                if scanned_without_pages > 2 * max(1, len(self.pages.mine(self.pages.epoch))) + 1:
                    raise RuntimeError(
                        "the shards carry no usable page renders: build with "
                        "`scifolio build --page-renders` or set pages_per_batch=0 / lambda_vis=0"
                    )
                continue
            render = renders[self.pages.offset]
            self.pages.offset += 1
            px = load_pixels(render.png, (h, w))
            mask = foreground_mask(px, self.cfg.patch, self.cfg.blank_std)
            if int(mask.sum()) < 2:
                continue
            scanned_without_pages = 0
            pixels.append(px)
            masks.append(mask)
            keys.append(hashlib.sha256(render.png).hexdigest())
        if not pixels:
            return torch.zeros(0, 3, h, w), torch.zeros(0, n, dtype=torch.bool), []
        return torch.stack(pixels), torch.stack(masks), keys


# --- per-rank loader with DataLoader workers -----------------------------------------------------------------------


class _Readers(torch.utils.data.IterableDataset):
    """This rank's readers: each DataLoader worker is one, or (no workers) the process takes them in turn.
    ``rotate`` keeps the round-robin order across a resume."""

    def __init__(
        self,
        cfg: DataConfig,
        index: ShardIndex,
        readers: list[int],
        n_readers: int,
        cursors: dict[int, dict[str, Any]],
        rotate: int,
    ) -> None:
        self.cfg, self.index, self.readers, self.n_readers = cfg, index, readers, n_readers
        self.cursors, self.rotate = cursors, rotate

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        k = len(self.readers)
        if info is not None:
            reader = self.readers[(info.id + self.rotate) % k]
            return iter(Packer(self.cfg, self.index, reader, self.n_readers, self.cursors.get(reader)))
        packers = [
            Packer(self.cfg, self.index, r, self.n_readers, self.cursors.get(r))
            for r in (self.readers[(i + self.rotate) % k] for i in range(k))
        ]
        return (p.next_batch() for _ in itertools.count() for p in packers)


class ShardLoader:
    """This rank's micro-batches; ``state_dict()`` is the cursor of every reader after the last batch taken.

    The stream is dealt to ``n_readers`` readers, world_size × max(1, num_workers) on a fresh run; rank r owns the
    contiguous block of ``n_readers / world_size`` of them. A resume at another world size keeps the saved run's
    readers and deals them anew (:meth:`resume`), so every reader continues from its own cursor."""

    def __init__(
        self,
        cfg: DataConfig,
        rank: int = 0,
        world_size: int = 1,
        index: ShardIndex | None = None,
        record_weights: str | None = None,
    ) -> None:
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.n_readers = world_size * max(1, cfg.num_workers)
        self.index = index or ShardIndex.open(cfg.shards, cfg.weights, record_weights)
        self.series = series_lane(cfg, self.index)
        """Whether batches carry series (the model then needs its time-series lane)."""
        self.cursors: dict[int, dict[str, Any]] = {}
        self.batches = 0
        self._it: Iterator[dict[str, Any]] | None = None

    def __iter__(self) -> ShardLoader:
        return self

    def __next__(self) -> dict[str, Any]:
        if self._it is None:
            self._it = self._start()
        batch = next(self._it)
        self.cursors[batch["cursor"]["reader"]] = batch["cursor"]
        self.batches += 1
        return batch

    @property
    def readers(self) -> list[int]:
        k = self.n_readers // self.world_size
        return list(range(self.rank * k, (self.rank + 1) * k))

    def _start(self) -> Iterator[dict[str, Any]]:
        readers = self.readers
        rotate = self.batches % len(readers)
        dataset = _Readers(self.cfg, self.index, readers, self.n_readers, dict(self.cursors), rotate)
        if self.cfg.num_workers == 0:
            return iter(dataset)
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=None, num_workers=self.cfg.num_workers, in_order=True, persistent_workers=False
        )
        return iter(loader)

    def state_dict(self) -> dict[str, Any]:
        return {
            "cursors": {str(k): v for k, v in self.cursors.items()},
            "batches": self.batches,
            "num_workers": self.cfg.num_workers,
            "world_size": self.world_size,
            "n_readers": self.n_readers,
            "seed": self.cfg.seed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("num_workers", "world_size", "seed"):
            mine = {"num_workers": self.cfg.num_workers, "world_size": self.world_size, "seed": self.cfg.seed}[key]
            if state[key] != mine:
                raise ValueError(
                    f"data cursor was saved with {key}={state[key]}, this run has {mine}: "
                    "the reader partition would differ, so resuming could repeat or skip samples"
                )
        self.cursors = {int(k): v for k, v in state["cursors"].items()}
        self.batches = int(state["batches"])
        self.n_readers = int(state.get("n_readers", self.n_readers))
        self._it = None

    def resume(self, saved: list[dict[str, Any]]) -> None:
        """Continue from every saved rank's ``state_dict()`` (``saved[r]`` = rank r's), at any world size.

        The same world size takes its own state back (:meth:`load_state_dict`). Another one keeps the saved
        readers, nothing re-dealt inside a stream, so nothing repeats or is skipped: rank r takes the block
        ``n_readers / world_size`` of them (which must divide) with all their cursors, and reads them in turn
        (``num_workers`` 0) or one per DataLoader worker (``num_workers`` = that block)."""
        if len(saved) == self.world_size:
            self.load_state_dict(saved[self.rank])
            return
        if {s["seed"] for s in saved} != {self.cfg.seed}:
            raise ValueError(f"data cursor was saved with seed {saved[0]['seed']}, this run has {self.cfg.seed}")
        first = saved[0]
        n = int(first.get("n_readers", first["world_size"] * max(1, first["num_workers"])))
        k, left = divmod(n, self.world_size)
        if left or self.cfg.num_workers not in (0, k):
            raise ValueError(
                f"the saved run dealt its stream to {n} readers: world size {self.world_size} needs to divide it "
                f"and num_workers to be 0 or {n // self.world_size or 1} (it is {self.cfg.num_workers})"
            )
        self.n_readers = n
        mine = set(self.readers)
        self.cursors = {int(r): c for s in saved for r, c in s["cursors"].items() if int(r) in mine}
        self.batches = 0
        self._it = None


def model_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    """The keys of a batch the model's forward takes (spans, cursor and counters are bookkeeping)."""
    keys = (
        "input_ids",
        "labels",
        "position_ids",
        "seq_ids",
        "image_pixels",
        "image_slots",
        "page_pixels",
        "page_mask",
        "image_keys",
        "page_keys",
        "series_slots",
        "series_context",
        "series_target",
    )
    return {k: batch[k] for k in keys if k in batch}


def series_lane(cfg: DataConfig, index: ShardIndex) -> bool:
    """Whether the time-series lane runs: ``data.series`` is ``auto`` and the shards hold series records."""
    if cfg.series not in ("auto", "off"):
        raise ValueError(f"data.series must be auto or off, not {cfg.series!r}")
    return cfg.series == "auto" and index.series > 0


def n_text_tokens(batch: dict[str, Any]) -> int:
    return int((batch["seq_ids"] > 0).sum())


__all__ = [
    "ShardIndex",
    "ShardLoader",
    "Packer",
    "flatten",
    "load_pixels",
    "model_inputs",
    "n_text_tokens",
]
