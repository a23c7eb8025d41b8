"""The tiny random models load through the same code paths a real hub model would use."""

from __future__ import annotations

import numpy as np
import pytest
from retrieval_fakes import COLORS, draw_png

from retrieval.caption import CaptionConfig, Captioner
from retrieval.embed import EmbedConfig, STEmbedder, l2_normalize
from retrieval.rerank import RerankConfig, Reranker


def test_l2_normalize():
    x = l2_normalize(np.array([[3.0, 4.0], [0.0, 0.0]]))
    assert x.dtype == np.float32 and x[0].tolist() == pytest.approx([0.6, 0.8]) and x[1].tolist() == [0.0, 0.0]


def test_embedder_reads_dim_and_normalises(tiny_models):
    emb = STEmbedder(EmbedConfig(tiny_models["retrieval-clip"], batch_size=2))
    model = emb.load()
    assert emb.dim(model) == 16  # projection_dim of the tiny CLIP, read from the model
    pngs = [draw_png(c, "circle") for c in COLORS.values()]
    v = emb.run_batch(pngs, model)  # 6 images in batches of 2
    t = emb.run_batch_texts(["a red circle", "a table of results"], model)
    assert v.shape == (6, 16) and t.shape == (2, 16) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert not np.allclose(t[0], t[1])  # texts are actually encoded (not one pooled constant)
    assert np.allclose(emb.run_batch(pngs[:1], model), v[:1], atol=1e-5)  # batching does not change results
    assert emb.run_batch_texts([], model).shape == (0, 16)


def test_captioner_generates_text(tiny_models):
    cap = Captioner(CaptionConfig(tiny_models["retrieval-captioner"], max_new_tokens=5))
    out = cap.run_batch([draw_png(c) for c in list(COLORS.values())[:3]], cap.load())
    assert len(out) == 3 and all(isinstance(c, str) and c for c in out)


def test_cross_encoder_scores_in_unit_interval(tiny_models):
    r = Reranker(RerankConfig(tiny_models["retrieval-reranker"]))
    model = r.load()
    (s,) = r.run_batch([("a red circle", ["a red circle", "a table of results", ""])], model)
    assert s.shape == (3,) and np.all((s > 0) & (s < 1))
    assert r.run_batch([("q", [])], model)[0].shape == (0,)


def test_unloaded_models_fail_loudly():
    with pytest.raises(RuntimeError):
        STEmbedder(EmbedConfig("x")).run_batch_texts(["a"], None)
    with pytest.raises(RuntimeError):
        Captioner(CaptionConfig("x")).run_batch([b""], None)
    with pytest.raises(RuntimeError):
        Reranker(RerankConfig("x")).run_batch([("q", ["a"])], None)
