"""Eq 5–6: foreground mask, raster order, the frozen encoder and where gradient flows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pretrain.config import DataConfig, ModelConfig, ObjectiveConfig
from pretrain.data import Packer, ShardIndex, load_pixels, model_inputs
from pretrain.model import VisualPretrainModel, attention_cost, block_causal_mask, foreground_mask, raster
from tests.pretrain.fixtures import blank_page, png_bytes, text_page


def test_blank_page_masks_everything_filled_page_nothing() -> None:
    blank = load_pixels(png_bytes(blank_page()), (96, 72))
    assert foreground_mask(blank, 8, 0.02).sum().item() == 0
    noise = torch.rand(3, 96, 72, generator=torch.Generator().manual_seed(0))
    mask = foreground_mask(noise, 8, 0.02)
    assert mask.shape == (12 * 9,) and bool(mask.all())


def test_text_page_keeps_only_inked_patches_in_raster_order() -> None:
    page = torch.ones(3, 32, 48)
    page[:, 8:16, 40:48] = 0.0  # solid ink fills a whole patch: uniform, so blank by the rule...
    page[:, 17:19, 2:14] = 0.0  # ...while a stroke crossing patches (row 2, cols 0 and 1) is foreground
    page[:, 26, 30] = 0.0  # one dark pixel in patch (row 3, col 3)
    mask = foreground_mask(page, 8, 0.02)
    cols = 48 // 8
    assert mask.nonzero().flatten().tolist() == [2 * cols + 0, 2 * cols + 1, 3 * cols + 3]
    # threshold is configurable: a faint mark survives a low threshold and not a high one
    faint = torch.ones(1, 8, 8)
    faint[0, 0, 0] = 0.8
    assert foreground_mask(faint, 8, 0.01).item() and not foreground_mask(faint, 8, 0.05).item()


def test_raster_keeps_row_major_order_of_survivors() -> None:
    z = torch.arange(12.0).reshape(12, 1)  # feature = grid index, grid 3 rows × 4 cols
    mask = torch.zeros(12, dtype=torch.bool)
    mask[[9, 2, 4, 11]] = True
    assert raster(z, mask).flatten().tolist() == [2.0, 4.0, 9.0, 11.0]


def test_attention_cost_worked_example() -> None:
    assert attention_cost(1123, 1728) == pytest.approx(0.4224, abs=1e-4)  # 48×36 patches, 35% blank


def test_block_causal_mask_separates_samples() -> None:
    m = block_causal_mask(torch.tensor([[1, 1, 2, 2, 0]]))[0, 0]
    expected = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 0, 1]])
    assert torch.equal(m, expected.bool())


@pytest.fixture(scope="module")
def model(tiny_models: Path) -> VisualPretrainModel:
    cfg = ModelConfig(backbone=str(tiny_models / "pretrain-lm"), encoder=str(tiny_models / "pretrain-vision"))
    return VisualPretrainModel.load(cfg, ObjectiveConfig(), patch=8)


def test_packed_samples_match_separate_forwards(model: VisualPretrainModel) -> None:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randint(3, 500, (1, 7), generator=g), torch.randint(3, 500, (1, 5), generator=g)
    emb = model.backbone.get_input_embeddings()
    with torch.no_grad():
        sep_a = model._backbone_hidden(
            emb(a), block_causal_mask(torch.ones(1, 7, dtype=torch.long)), torch.arange(7)[None]
        )
        sep_b = model._backbone_hidden(
            emb(b), block_causal_mask(torch.ones(1, 5, dtype=torch.long)), torch.arange(5)[None]
        )
        seq = torch.tensor([[1] * 7 + [2] * 5])
        pos = torch.cat([torch.arange(7), torch.arange(5)])[None]
        packed = model._backbone_hidden(emb(torch.cat([a, b], 1)), block_causal_mask(seq), pos)
    assert torch.allclose(packed[:, :7], sep_a, atol=1e-5) and torch.allclose(packed[:, 7:], sep_b, atol=1e-5)


def test_gradient_reaches_backbone_w_in_psi_not_encoder(model: VisualPretrainModel, corpus: Path) -> None:
    model.train()
    assert not model.encoder.training  # frozen tower stays in eval mode
    assert all(not p.requires_grad for p in model.encoder.parameters())
    trainable = {id(p) for p in model.trainable_parameters()}
    assert not trainable & {id(p) for p in model.encoder.parameters()}
    cfg = DataConfig(shards=str(corpus), seq_len=96, micro_batch=2, pages_per_batch=2)
    batch = Packer(cfg, ShardIndex.open(cfg.shards), 0, 1).next_batch()
    assert batch["image_slots"].shape[0] > 0 and batch["page_pixels"].shape[0] == 2
    model.zero_grad(set_to_none=True)
    out = model(**model_inputs(batch))
    out["loss"].backward()
    assert out["l_text"] > 0 and out["l_vp"] > 0 and out["vp_positions"] > 0
    for name in (
        "w_in.weight",
        "psi.0.weight",
        "psi.2.weight",
        "backbone.model.layers.0.self_attn.q_proj.weight",
        "backbone.model.embed_tokens.weight",
    ):
        grad = dict(model.named_parameters())[name].grad
        assert grad is not None and grad.abs().sum() > 0, name
    assert all(p.grad is None for p in model.encoder.parameters())


def test_vp_loss_alone_trains_w_in_and_psi(model: VisualPretrainModel, corpus: Path) -> None:
    cfg = DataConfig(shards=str(corpus), pages_per_batch=2)
    batch = Packer(cfg, ShardIndex.open(cfg.shards), 0, 1).next_batch()
    model.zero_grad(set_to_none=True)
    loss, acc, m = model.visual_forward(batch["page_pixels"], batch["page_mask"])
    loss.backward()
    kept = int(batch["page_mask"].sum())
    assert m.item() == kept - batch["page_pixels"].shape[0]  # each page predicts all but its first patch
    assert model.w_in.weight.grad.abs().sum() > 0 and model.psi[2].weight.grad.abs().sum() > 0
    assert 0.0 <= acc.item() <= 1.0


def test_feature_cache_is_exact_and_persists(tiny_models: Path, tmp_path: Path) -> None:
    cfg = ModelConfig(
        backbone=str(tiny_models / "pretrain-lm"),
        encoder=str(tiny_models / "pretrain-vision"),
        feature_cache=str(tmp_path / "feats"),
    )
    m = VisualPretrainModel.load(cfg)
    px = load_pixels(png_bytes(text_page(np.random.default_rng(0))), (96, 72))[None]
    first = m.encode(px, ["abc"])
    assert first.shape == (1, 108, 32)
    assert len(list((tmp_path / "feats").iterdir())) == 1
    fresh = VisualPretrainModel.load(cfg)  # new process-equivalent: reads the disk cache
    assert torch.equal(fresh.encode(px, ["abc"]), first)
    assert torch.allclose(fresh.encode(px), first, atol=1e-6)  # uncached path agrees


def test_vocab_mismatch_is_an_error(model: VisualPretrainModel) -> None:
    ids = torch.full((1, 4), model.vocab_size + 5)
    with pytest.raises(ValueError, match="different tokenizer"):
        model.text_forward(
            ids,
            ids,
            torch.arange(4)[None],
            torch.ones(1, 4, dtype=torch.long),
            torch.zeros(0, 3, 64, 64),
            torch.zeros(0, 3, dtype=torch.long),
        )


# --- lockstep (ZeRO-3): the same module calls on every rank, whatever its batch holds ---


def _without_images_and_pages(batch: dict) -> dict:
    """The text of ``batch`` alone: what a rank whose micro-batch drew no crops and no pages holds."""
    out = dict(batch)
    out["image_pixels"] = batch["image_pixels"][:0]
    out["image_slots"] = batch["image_slots"][:0]
    out["page_pixels"], out["page_mask"] = batch["page_pixels"][:0], batch["page_mask"][:0]
    out["image_keys"], out["page_keys"] = [], []
    return out


def _trace(model: VisualPretrainModel, inputs: dict) -> tuple[list[str], list[str], dict]:
    """(modules called in forward order, parameters whose gradient is ready in backward order, the outputs)."""
    calls: list[str] = []
    ready: list[str] = []
    handles = [m.register_forward_pre_hook(lambda m, a, n=n: calls.append(n)) for n, m in model.named_modules()]
    handles += [
        p.register_post_accumulate_grad_hook(lambda p, n=n: ready.append(n))
        for n, p in model.named_parameters()
        if p.requires_grad
    ]
    model.zero_grad(set_to_none=True)
    try:
        out = model(**inputs)
        out["loss"].backward()
    finally:
        for h in handles:
            h.remove()
    return calls, ready, out


@pytest.fixture(scope="module")
def twins(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory):
    """The same weights twice: as ZeRO-0/1/2 run it and in lockstep (ZeRO-3), both with a warm feature cache."""
    cfg = ModelConfig(
        backbone=str(tiny_models / "pretrain-lm"),
        encoder=str(tiny_models / "pretrain-vision"),
        feature_cache=str(tmp_path_factory.mktemp("feats")),
    )
    plain = VisualPretrainModel.load(cfg, ObjectiveConfig(), patch=8).train()
    lock = VisualPretrainModel.load(cfg, ObjectiveConfig(), patch=8, lockstep=True).train()
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), lock.state_dict().values()))
    return plain, lock


@pytest.fixture(scope="module")
def full_batch(corpus: Path) -> dict:
    cfg = DataConfig(shards=str(corpus), seq_len=96, micro_batch=2, pages_per_batch=2)
    batch = Packer(cfg, ShardIndex.open(cfg.shards), 0, 1).next_batch()
    assert batch["image_slots"].shape[0] > 0 and batch["page_pixels"].shape[0] == 2
    return model_inputs(batch)


def test_lockstep_makes_the_same_module_calls_whatever_the_batch(twins, full_batch) -> None:
    plain, lock = twins
    plain._cache.clear()  # start cold: the first plain pass below must miss the cache
    for f in Path(plain.cfg.feature_cache).iterdir():
        f.unlink()
    empty = _without_images_and_pages(full_batch)
    first, again, bare = _trace(lock, full_batch), _trace(lock, full_batch), _trace(lock, empty)
    # Forward: a second pass over the same images (cache hits elsewhere) and a batch with no images or pages call
    # exactly the modules of the first pass, in its order, E_v included, each once per call site.
    assert first[0] == again[0] == bare[0]
    assert first[0].count("encoder") == 2 and first[0].count("w_in") == 2 and first[0].count("psi") == 1
    # Backward: every trainable parameter gets its gradient, in the same order (ZeRO-3 reduce-scatters by it).
    trainable = {n for n, p in lock.named_parameters() if p.requires_grad}
    assert set(first[1]) == trainable and first[1] == again[1] == bare[1]
    # Without lockstep the cached pass skips E_v and the bare batch skips the visual forward: what broke ZeRO-3.
    plain_first, plain_again, plain_bare = _trace(plain, full_batch), _trace(plain, full_batch), _trace(plain, empty)
    assert plain_first[0].count("encoder") == 2 and "encoder" not in plain_again[0]
    assert "psi" not in plain_bare[0] and set(plain_bare[1]) != trainable


def test_lockstep_dummies_add_nothing_to_loss_or_gradient(twins, full_batch) -> None:
    plain, lock = twins

    def grads(model: VisualPretrainModel) -> dict[str, torch.Tensor]:
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    # Real data: the same losses (W_in projects all slots in one call, so equal up to float rounding).
    out_p, out_l = _trace(plain, full_batch)[2], _trace(lock, full_batch)[2]
    for key in ("loss", "l_text", "l_vp"):
        assert torch.allclose(out_p[key], out_l[key], rtol=0, atol=1e-5), key
    assert out_p["vp_positions"] == out_l["vp_positions"] > 0
    # No images, no pages: the dummies change no bit of the loss, and every gradient they reach is exactly zero.
    empty = _without_images_and_pages(full_batch)
    out_p = _trace(plain, empty)[2]
    g_plain = grads(plain)
    out_l = _trace(lock, empty)[2]
    g_lock = grads(lock)
    assert torch.equal(out_l["loss"], out_p["loss"]) and torch.equal(out_l["l_text"], out_p["l_text"])
    assert out_l["l_vp"].item() == 0.0 and out_l["vp_positions"].item() == 0
    visual = [n for n in g_lock if n.startswith(("w_in.", "psi."))]
    assert len(visual) == 6 and all(not g_lock[n].any() for n in visual)
    backbone = [n for n in g_lock if n.startswith("backbone.")]
    assert backbone and all(torch.equal(g_lock[n], g_plain[n]) for n in backbone)
    assert g_lock["backbone.model.embed_tokens.weight"].abs().sum() > 0
