"""The shard stream: partitioning, packing, weights and the exact-resume cursor."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch

from formats.shards import ShardFile, list_shards
from formats.weights import SampleWeights, WeightsMismatch
from pretrain.config import DataConfig
from pretrain.data import Packer, ShardIndex, ShardLoader, flatten
from pretrain.objective import IGNORE
from tests.pretrain.fixtures import write_corpus


def _lengths(corpus: Path, max_image_tokens: int = 64) -> dict[str, int]:
    out = {}
    for f in list_shards(str(corpus)):
        for row in ShardFile(f).iter_chunks():
            out[row.chunk_id] = len(flatten(row, max_image_tokens).tokens)
    return out


def test_manifest_order_and_glob(corpus: Path, tmp_path: Path) -> None:
    assert [Path(f).name for f in list_shards(str(corpus))] == [
        "shard-00000-of-00002.parquet",
        "shard-00001-of-00002.parquet",
    ]
    with pytest.raises(FileNotFoundError):
        list_shards(str(tmp_path))


def test_readers_partition_one_epoch_exactly(corpus: Path) -> None:
    """Two ranks × two workers: together they pack every token of every sample exactly once per epoch."""
    cfg = DataConfig(shards=str(corpus), seq_len=64, micro_batch=2, pages_per_batch=0)
    index = ShardIndex.open(cfg.shards)
    lengths = _lengths(corpus)
    spans: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for reader in range(4):
        packer = Packer(cfg, index, reader, 4)
        assert len(index.plan(cfg.seed, 0)[reader::4]) == 6
        while packer.text.state()[:2] < (0, 6):
            for cid, epoch, s, e in packer.next_batch()["spans"]:
                if epoch == 0:
                    spans[cid].append((s, e))
    assert set(spans) == set(lengths)
    for cid, n in lengths.items():
        got = sorted(spans[cid])
        assert got[0][0] == 0 and got[-1][1] == n, cid
        assert all(a[1] == b[0] for a, b in zip(got, got[1:])), cid  # contiguous, no overlap, no gap


def test_packing_boundaries_labels_and_atomic_images(corpus: Path) -> None:
    cfg = DataConfig(shards=str(corpus), seq_len=48, micro_batch=4, pages_per_batch=0, max_image_tokens=16)
    packer = Packer(cfg, ShardIndex.open(cfg.shards), 0, 1)
    for _ in range(6):
        b = packer.next_batch()
        ids, labels, seq, pos = b["input_ids"], b["labels"], b["seq_ids"], b["position_ids"]
        assert ids.shape == (4, 48)
        for row, start, n in b["image_slots"].tolist():
            assert start + n <= 48  # never cut across rows
            assert (labels[row, start : start + n - 1] == IGNORE).all()  # image slots are never targets
            assert len(set(seq[row, start : start + n].tolist())) == 1
        for r in range(4):
            for t in range(47):
                if labels[r, t] != IGNORE:  # a target is the next position's token inside the same piece
                    assert seq[r, t] == seq[r, t + 1] and labels[r, t] == ids[r, t + 1]
                if seq[r, t + 1] != seq[r, t] and seq[r, t + 1] > 0:
                    assert pos[r, t + 1] == 0 and labels[r, t] == IGNORE
        assert b["image_pixels"].shape[0] == b["image_slots"].shape[0] == len(b["image_keys"])


def test_resume_from_cursor_continues_exactly(corpus: Path) -> None:
    cfg = DataConfig(shards=str(corpus), seq_len=64, micro_batch=2, pages_per_batch=3)
    index = ShardIndex.open(cfg.shards)
    straight = Packer(cfg, index, 0, 1)
    batches = [straight.next_batch() for _ in range(12)]
    resumed = Packer(cfg, index, 0, 1, cursor=batches[6]["cursor"])
    for want in batches[7:]:
        got = resumed.next_batch()
        assert got["spans"] == want["spans"] and got["page_keys"] == want["page_keys"]
        assert torch.equal(got["input_ids"], want["input_ids"]) and torch.equal(got["page_mask"], want["page_mask"])
    # blank pages never reach the objective
    assert all(int(b["page_mask"].sum(1).min()) >= 2 for b in batches)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_state_dict_resume(corpus: Path, num_workers: int) -> None:
    cfg = DataConfig(shards=str(corpus), seq_len=64, micro_batch=2, pages_per_batch=1, num_workers=num_workers)
    loader = ShardLoader(cfg)
    batches = [next(loader) for _ in range(9)]
    loader2 = ShardLoader(cfg)
    for _ in range(5):  # odd count: the resumed loader must continue with the right worker
        next(loader2)
    state = loader2.state_dict()
    resumed = ShardLoader(cfg)
    resumed.load_state_dict(state)
    assert [next(resumed)["spans"] for _ in range(4)] == [b["spans"] for b in batches[5:]]
    with pytest.raises(ValueError, match="num_workers"):
        ShardLoader(DataConfig(shards=str(corpus), num_workers=num_workers + 1)).load_state_dict(state)


def test_resume_at_another_world_size_continues_every_reader(corpus: Path) -> None:
    cfg = DataConfig(shards=str(corpus), seq_len=64, micro_batch=2, pages_per_batch=1)
    index = ShardIndex.open(cfg.shards)
    packers = {r: Packer(cfg, index, r, 2) for r in (0, 1)}  # what readers 0 and 1 of a world of 2 yield, in order
    stream = {r: [packers[r].next_batch()["spans"] for _ in range(6)] for r in (0, 1)}
    two = [ShardLoader(cfg, r, 2, index=index) for r in (0, 1)]
    assert [[next(loader)["spans"] for _ in range(3)] for loader in two] == [stream[0][:3], stream[1][:3]]
    # World size 1 takes both readers and reads them in turn, each from its own cursor: nothing repeated or skipped.
    one = ShardLoader(cfg, 0, 1, index=index)
    one.resume([loader.state_dict() for loader in two])
    assert [next(one)["spans"] for _ in range(3)] == [stream[0][3], stream[1][3], stream[0][4]]
    # Its save resumes at world size 1 in the same turn, and at 2 with each rank back on its own reader.
    again = ShardLoader(cfg, 0, 1, index=index)
    again.resume([one.state_dict()])
    assert [next(again)["spans"] for _ in range(2)] == [stream[1][4], stream[0][5]]
    back = [ShardLoader(cfg, r, 2, index=index) for r in (0, 1)]
    for loader in back:
        loader.resume([one.state_dict()])
    assert [next(loader)["spans"] for loader in back] == [stream[0][5], stream[1][4]]
    with pytest.raises(ValueError, match="divide"):  # 2 readers cannot be dealt to 3 ranks
        ShardLoader(cfg, 0, 3, index=index).resume([loader.state_dict() for loader in two])


def test_sample_weights_file(corpus: Path, tmp_path: Path) -> None:
    ids = list(_lengths(corpus))
    weights = tmp_path / "weights.parquet"
    SampleWeights(chunks={ids[0]: 3.0, ids[1]: 0.0, ids[2]: 0.5}).write(weights)
    index = ShardIndex.open(str(corpus), str(weights))
    names = {}
    for f, path in enumerate(index.files):
        for r, cid in enumerate(ShardFile(path).sample_weights()[0]):
            names[(f, r)] = cid
    seen_half = 0
    for epoch in range(40):
        counts = defaultdict(int)
        for f, r in index.plan(0, epoch).tolist():
            counts[names[(f, r)]] += 1
        assert counts[ids[0]] == 3 and counts[ids[1]] == 0 and counts[ids[3]] == 1
        seen_half += counts[ids[2]]
    assert 10 <= seen_half <= 30  # weight 0.5: about every other epoch
    assert not np.array_equal(index.plan(0, 0), index.plan(0, 1))  # reshuffled each epoch
    assert np.array_equal(index.plan(0, 3), ShardIndex.open(str(corpus), str(weights)).plan(0, 3))  # deterministic


def test_weights_for_another_corpus_is_an_error(corpus: Path, tmp_path: Path) -> None:
    weights = tmp_path / "weights.parquet"
    SampleWeights(chunks={"0" * 64 + ":0": 2.0}).write(weights)
    with pytest.raises(WeightsMismatch, match="none of its 1 chunk ids"):
        ShardIndex.open(str(corpus), str(weights))


def test_missing_page_renders_is_a_clear_error(tmp_path: Path) -> None:
    shards = write_corpus(tmp_path / "s", n_docs=4, n_shards=1, vocab=700, pages=False)
    packer = Packer(DataConfig(shards=str(shards), pages_per_batch=2), ShardIndex.open(str(shards)), 0, 1)
    with pytest.raises(RuntimeError, match="--page-renders"):
        packer.next_batch()
    text_only = Packer(DataConfig(shards=str(shards), pages_per_batch=0), ShardIndex.open(str(shards)), 0, 1)
    assert text_only.next_batch()["page_pixels"].shape[0] == 0


def test_more_readers_than_samples_is_an_error(tmp_path: Path) -> None:
    shards = write_corpus(tmp_path / "s", n_docs=2, n_shards=1, vocab=700)
    packer = Packer(DataConfig(shards=str(shards)), ShardIndex.open(str(shards)), 3, 4)
    with pytest.raises(RuntimeError, match="fewer"):
        packer.next_batch()
