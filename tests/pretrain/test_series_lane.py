"""The time-series lane inside pre-training: series rows pack like images (atomic slots), the context/tail split,
the lane is off (nothing read, nothing built) without series, and the model's forecasting loss reaches the encoder.

    .venv/bin/python -m pytest tests/pretrain/test_series_lane.py -q
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from formats.series import SeriesRecord
from formats.shards import ChunkRow, Segment, shard_name, write_shard
from pretrain.config import DataConfig, ModelConfig, ObjectiveConfig, SeriesLaneConfig
from pretrain.data import Packer, ShardIndex, ShardLoader, model_inputs, split_series
from pretrain.model import VisualPretrainModel
from tests.pretrain.fixtures import make_rows


def series_rows(n: int, length: int = 80, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(n):
        t = np.arange(length)
        values = (np.sin(t / (3 + k)), np.cos(t / (3 + k)) + rng.normal(0, 0.01, length))
        rec = SeriesRecord(f"s{k}", tuple(tuple(v) for v in values), ("a", "b"), "gen.csv")
        doc_id = hashlib.sha256(f"series{seed}-{k}".encode()).hexdigest()
        segments = (
            Segment("text", 5, 0, token_ids=tuple(range(10 + k, 15 + k))),
            Segment("series", 40, 0, series_id=rec.series_id),
        )
        rows.append(ChunkRow(doc_id, 0, segments, series=(rec,)).to_row())
    return rows


def write_mixed(out: Path, vocab: int, with_series: bool = True) -> Path:
    rows = make_rows(6, vocab, pages=False) + (series_rows(6) if with_series else [])
    write_shard(out / "shards" / shard_name(0, 1), rows, row_group_size=4)
    return out


def test_split_series_holds_out_the_tail() -> None:
    v = np.arange(20.0).reshape(1, 20)
    ctx, tail = split_series(v, context=8, horizon=5)
    assert ctx.tolist() == [list(range(7, 15))] and tail.tolist() == [[15, 16, 17, 18, 19]]
    ctx, tail = split_series(np.arange(6.0).reshape(1, 6), context=8, horizon=5)  # short: the last half
    assert ctx.tolist() == [[0, 1, 2]] and tail[0, :3].tolist() == [3, 4, 5] and np.isnan(tail[0, 3:]).all()
    ctx, tail = split_series(np.ones((2, 1)), context=8, horizon=5)  # one point: no target at all
    assert ctx.shape == (2, 1) and np.isnan(tail).all()


def test_series_pack_atomically_with_context_and_tail(tmp_path: Path) -> None:
    out = write_mixed(tmp_path, vocab=64)
    index = ShardIndex.open(str(out))
    assert index.series == 6
    cfg = DataConfig(shards=str(out), seq_len=48, micro_batch=2, pages_per_batch=0, max_series_tokens=16, max_image_tokens=16,
                     series_context=30, series_horizon=6)  # fmt: skip
    packer = Packer(cfg, index, 0, 1)
    seen = 0
    for _ in range(12):
        b = packer.next_batch()
        slots, ctx, tgt = b["series_slots"], b["series_context"], b["series_target"]
        assert slots.shape[0] == ctx.shape[0] == tgt.shape[0]
        for k, (row, start, length) in enumerate(slots.tolist()):
            seen += 1
            assert length == 16 and start + length <= 48  # never cut by a row boundary
            assert (b["labels"][row, start : start + length] == -100).all()  # a series slot is never a text target
            assert ctx.shape[1:] == (2, 30) and tgt.shape[1:] == (2, 6)
            assert torch.isfinite(tgt[k]).all()
            # the context ends where the tail starts: the tail is never shown to the encoder
            n = int(torch.isfinite(ctx[k, 0]).sum())
            assert n == 30
    assert seen >= 6


def test_lane_off_without_series(tmp_path: Path) -> None:
    out = write_mixed(tmp_path, vocab=64, with_series=False)
    loader = ShardLoader(DataConfig(shards=str(out), seq_len=64, micro_batch=1, pages_per_batch=0))
    assert not loader.series and loader.index.series == 0
    batch = next(loader)
    assert "series_slots" not in batch and "series_slots" not in model_inputs(batch)
    off = ShardLoader(DataConfig(shards=str(write_mixed(tmp_path / "b", 64)), series="off", pages_per_batch=0))
    assert not off.series and "series_slots" not in next(off)  # series rows skipped on request


def test_model_forecasting_loss_reaches_encoder_and_llm(tiny_models: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(tiny_models / "pretrain-lm"))
    out = write_mixed(tmp_path, vocab=vocab)
    cfg = DataConfig(shards=str(out), seq_len=64, micro_batch=2, pages_per_batch=0, crop_size=32,
                     max_series_tokens=16, series_context=40, series_horizon=6)  # fmt: skip
    packer = Packer(cfg, ShardIndex.open(str(out)), 0, 1)
    batch = next(b for b in (packer.next_batch() for _ in range(10)) if b["series_slots"].shape[0])
    mcfg = ModelConfig(backbone=str(tiny_models / "pretrain-lm"), encoder=str(tiny_models / "pretrain-vision"))
    model = VisualPretrainModel.load(mcfg, ObjectiveConfig(lambda_vis=0.0), patch=8, series=SeriesLaneConfig())
    out_ = model(**model_inputs(batch))
    assert math.isfinite(float(out_["ts_loss"])) and float(out_["ts_values"]) > 0
    out_["loss"].backward()
    enc_grad = sum(float(p.grad.abs().sum()) for p in model.series.encoder.parameters() if p.grad is not None)
    llm_grad = model.backbone.get_input_embeddings().weight.grad
    assert enc_grad > 0 and llm_grad is not None and float(llm_grad.abs().sum()) > 0
    # without the lane the same model class builds none of it
    plain = VisualPretrainModel.load(mcfg, ObjectiveConfig(), patch=8)
    assert plain.series is None and "ts_loss" not in plain(**{k: v for k, v in model_inputs(batch).items()
                                                              if not k.startswith("series_")})  # fmt: skip


@pytest.mark.parametrize("length", [1, 7, 300, 5000])
def test_series_token_count_matches_the_encoder(length: int) -> None:
    from formats.series import series_token_count
    from pretrain.timeseries.encoder import token_count

    for budget in (32, 64, 1024):
        assert series_token_count(length, budget, 4) == token_count(length, budget, 4) <= budget
