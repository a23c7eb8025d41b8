"""The retrieval models have Beam ``ModelHandler``'s shape: ``model = h.load()``, then ``h.run_batch(items, model)``
gives what the underlying library computes when called directly on the same tiny checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
from retrieval_fakes import COLORS, draw_png

from retrieval.caption import CaptionConfig, Captioner, CaptionModel
from retrieval.embed import EmbedConfig, LoadedEmbedder, STEmbedder, to_pil
from retrieval.rerank import RerankConfig, Reranker, RerankItem


def test_embedder_handler_matches_sentence_transformers(tiny_models):
    from sentence_transformers import SentenceTransformer

    path = tiny_models["retrieval-clip"]
    h = STEmbedder(EmbedConfig(path, batch_size=4))
    model = h.load()
    assert isinstance(model, SentenceTransformer)
    pngs = [draw_png(c, "square") for c in COLORS.values()]
    texts = ["a red circle", "a blue square plot", "a table of results"]

    ref = SentenceTransformer(path, device="cpu").eval()
    raw_img = ref.encode([to_pil(p) for p in pngs], convert_to_numpy=True)
    raw_txt = ref.encode(texts, convert_to_numpy=True)
    want_img = raw_img / np.linalg.norm(raw_img, axis=1, keepdims=True)
    want_txt = raw_txt / np.linalg.norm(raw_txt, axis=1, keepdims=True)

    got_img = h.run_batch(pngs, model)
    got_txt = h.run_batch_texts(texts, model)
    assert got_img.dtype == np.float32 and got_img.shape == (6, 16) and got_txt.shape == (3, 16)
    assert np.allclose(got_img, want_img, atol=1e-5) and np.allclose(got_txt, want_txt, atol=1e-5)
    # The one adapter for callers wanting dim + encode_* computes exactly the handler's results.
    bound = LoadedEmbedder(h, model)
    assert bound.dim == ref.get_embedding_dimension() == 16
    assert np.array_equal(bound.encode_images(pngs), got_img) and np.array_equal(bound.encode_texts(texts), got_txt)


def test_captioner_handler_matches_direct_generate(tiny_models):
    import torch
    from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

    path = tiny_models["retrieval-captioner"]
    h = Captioner(CaptionConfig(path, max_new_tokens=6, batch_size=2))
    model = h.load()
    assert isinstance(model, CaptionModel)
    pngs = [draw_png(c) for c in list(COLORS.values())[:3]]

    ref = AutoModelForImageTextToText.from_pretrained(path).eval()
    proc, tok = AutoImageProcessor.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    want = []
    for png in pngs:  # one image at a time: the handler's batches of 2 must not change the captions
        with torch.inference_mode():
            out = ref.generate(**proc(images=[to_pil(png)], return_tensors="pt"), max_new_tokens=6, do_sample=False)
        want.append(tok.batch_decode(out, skip_special_tokens=True)[0].strip())

    got = h.run_batch(pngs, model)
    assert got == want and all(got)


def test_reranker_handler_matches_cross_encoder_and_splits_items(tiny_models):
    import torch
    from sentence_transformers import CrossEncoder

    path = tiny_models["retrieval-reranker"]
    h = Reranker(RerankConfig(path, batch_size=2))
    model = h.load()
    assert isinstance(model, CrossEncoder)
    items = [
        RerankItem("a red circle", ("a red circle", "a table of results", "")),
        RerankItem("q", ()),
        ("a blue square plot", ["the blue square shows the result", "author photo"]),
    ]

    ref = CrossEncoder(path, device="cpu")
    want = []
    for query, texts in items:
        if not texts:
            want.append([])
            continue
        logits = ref.predict([(query, t) for t in texts], activation_fn=torch.nn.Identity(), convert_to_numpy=True)
        want.append(1.0 / (1.0 + np.exp(-np.asarray(logits, dtype=np.float64))))

    got = h.run_batch(items, model)
    assert [g.shape for g in got] == [(3,), (0,), (2,)]
    for g, w in zip(got, want):
        assert g.dtype == np.float64 and list(g) == pytest.approx(list(w), abs=1e-6)
    assert all(np.all((g > 0) & (g < 1)) for g in got)
    assert h.run_batch([], model) == []
