"""The two-pass scorer on tiny random VLMs (Qwen2-VL and LLaVA families), offline."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from vg_helpers import make_page, png_bytes

from formats.records import Block, Crop, Page
from visual_gain.scorer import VisualGainConfig, VisualGainScorer, build_page_rows, plan_batches, resolve_dtype

FAMILIES = ["visual_gain_vlm", "visual_gain_vlm_qwen2_5", "visual_gain_vlm_llava"]
KEYS = {"ppl_text", "ppl_inter", "delta_h_nats", "delta_h_bits", "page_bits", "n_text_tokens", "n_images", "model"}


def _pages() -> list[Page]:
    red, blue = png_bytes((200, 30, 30)), png_bytes((30, 30, 200), size=(90, 40), stripe=True)
    return [
        make_page(["The protein binds the ligand.", red, "Figure 1 shows the binding site."], 0),
        make_page(["Table 2 lists the yield of the synthesis for each catalyst and solvent used here."] * 3, 1),
        make_page([blue, "The crystal lattice of the alloy.", red, "Grain boundaries.", blue], 2),
        make_page(["Short."], 3),
        make_page(["Gene expression in mice was measured with sequencing. " * 4, blue], 4),
    ]


def _scorer(path: str, **kw: object) -> tuple[VisualGainScorer, object]:
    scorer = VisualGainScorer(VisualGainConfig(model=path, **kw))  # type: ignore[arg-type]
    return scorer, scorer.load()


@pytest.mark.parametrize("family", FAMILIES)
def test_both_passes_score_identical_text_ids(tiny_dirs: dict[str, str], family: str) -> None:
    scorer, model = _scorer(tiny_dirs[family], max_text_tokens=12)
    image_ids = model.adapter.image_token_ids  # type: ignore[attr-defined]
    for pr in scorer.page_rows(_pages(), model):  # type: ignore[arg-type]
        by_window: dict[int, dict[bool, object]] = {}
        for r in pr.rows:
            by_window.setdefault(r.window, {})[r.interleaved] = r
            assert not image_ids.intersection(r.target_ids), "an image token is scored"
            assert all(r.input_ids[p] not in image_ids for p in r.scored)
        for rows in by_window.values():
            if True in rows:
                assert rows[True].target_ids == rows[False].target_ids
                assert image_ids.intersection(rows[True].input_ids), "interleaved row holds no image tokens"
        n_scored = sum(len(r.scored) for r in pr.rows if not r.interleaved)
        assert n_scored == pr.n_text_tokens


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_equals_one_page_at_a_time(tiny_dirs: dict[str, str], family: str) -> None:
    scorer, model = _scorer(tiny_dirs[family], batch_size=6)
    pages = _pages()
    batched = scorer.run_batch(pages, model)  # type: ignore[arg-type]
    # the batch really mixed rows of different pages and lengths into shared forward calls
    rows = [r for pr in scorer.page_rows(pages, model) for r in pr.rows]  # type: ignore[arg-type]
    assert any(len(b) > 1 for b in plan_batches(rows, 6, 16384))
    for page, got in zip(pages, batched):
        alone = scorer.run_batch([page], model)[0].scores["visual_gain"]  # type: ignore[arg-type]
        vg = got.scores["visual_gain"]
        assert KEYS <= set(vg)
        assert vg["n_text_tokens"] == alone["n_text_tokens"] > 0
        for k in ("ppl_text", "ppl_inter"):
            assert math.log(vg[k]) == pytest.approx(math.log(alone[k]), abs=1e-4)
        assert vg["delta_h_nats"] == pytest.approx(alone["delta_h_nats"], abs=1e-4)


def test_visuals_reach_the_model(tiny_dirs: dict[str, str]) -> None:
    scorer, model = _scorer(tiny_dirs["visual_gain_vlm"])
    text = ["The spectrum of the compound has peaks.", "Figure shows the spectrum."]
    a = make_page([text[0], png_bytes((250, 250, 250)), text[1]])
    b = make_page([text[0], png_bytes((10, 120, 10), stripe=True), text[1]])
    va, vb = (p.scores["visual_gain"] for p in scorer.run_batch([a, b], model))  # type: ignore[arg-type]
    assert va["ppl_text"] == pytest.approx(vb["ppl_text"], rel=1e-6)  # same text, same text-only pass
    assert va["ppl_inter"] != pytest.approx(vb["ppl_inter"], rel=1e-6)  # different pixels, different NLL
    assert va["delta_h_nats"] != 0.0


def test_long_page_is_windowed_not_truncated(tiny_dirs: dict[str, str]) -> None:
    long_text = "The enzyme catalyses the reaction of the substrate in the cell membrane. " * 12
    page = make_page([long_text, png_bytes((200, 30, 30)), long_text, png_bytes((30, 30, 200))])
    full_scorer, model = _scorer(tiny_dirs["visual_gain_vlm"], max_text_tokens=100_000)
    win_scorer = VisualGainScorer(VisualGainConfig(model=tiny_dirs["visual_gain_vlm"], max_text_tokens=37))
    full = full_scorer.run_batch([page], model)[0].scores["visual_gain"]  # type: ignore[arg-type]
    win = win_scorer.run_batch([page], model)[0].scores["visual_gain"]  # type: ignore[arg-type]
    n = full["n_text_tokens"]
    assert n > 2 * 37  # really several windows
    assert win["n_text_tokens"] == n  # every token scored, none dropped
    assert win["n_windows"] == math.ceil(n / 37) and full["n_windows"] == 1
    (pr,) = win_scorer.page_rows([page], model)  # type: ignore[arg-type]
    text_rows = sorted((r for r in pr.rows if not r.interleaved), key=lambda r: r.window)
    (full_pr,) = full_scorer.page_rows([page], model)  # type: ignore[arg-type]
    assert sum((r.target_ids for r in text_rows), ()) == full_pr.rows[0].target_ids  # windows tile the text
    assert sum(len(r.images) for r in pr.rows if r.interleaved) == 2  # each image in exactly one window
    assert all(len(r.scored) <= 37 for r in pr.rows)
    assert math.isfinite(win["delta_h_nats"])


def test_page_without_visuals_runs_one_pass(tiny_dirs: dict[str, str]) -> None:
    scorer, model = _scorer(tiny_dirs["visual_gain_vlm"], max_text_tokens=10)
    page = make_page(["Only text on this page about the alloy and its grain boundaries."])
    (pr,) = scorer.page_rows([page], model)  # type: ignore[arg-type]
    assert pr.n_images == 0 and all(not r.interleaved for r in pr.rows) and len(pr.rows) == pr.n_windows
    vg = scorer.run_batch([page], model)[0].scores["visual_gain"]  # type: ignore[arg-type]
    assert vg["delta_h_nats"] == 0.0 and vg["page_bits"] == 0.0
    assert vg["ppl_text"] == vg["ppl_inter"] and vg["ppl_text"] > 1.0


def test_page_with_images_but_no_text(tiny_dirs: dict[str, str]) -> None:
    scorer, model = _scorer(tiny_dirs["visual_gain_vlm"])
    page = make_page([png_bytes((1, 2, 3))])
    (pr,) = scorer.page_rows([page], model)  # type: ignore[arg-type]
    assert pr.rows == ()
    vg = scorer.run_batch([page], model)[0].scores["visual_gain"]  # type: ignore[arg-type]
    assert vg["n_images"] == 1 and vg["n_text_tokens"] == 0 and vg["ppl_text"] is None


def test_literal_marker_text_stays_text(tiny_dirs: dict[str, str]) -> None:
    scorer, model = _scorer(tiny_dirs["visual_gain_vlm"])
    page = make_page(["A PDF that mentions <|image_pad|> and <|vision_start|> in its text.", png_bytes((9, 9, 9))])
    (pr,) = scorer.page_rows([page], model)  # type: ignore[arg-type]
    image_ids = model.adapter.image_token_ids  # type: ignore[attr-defined]
    assert not any(image_ids.intersection(r.target_ids) for r in pr.rows)


def test_row_builder_rejects_marker_ids_and_checks_window_size() -> None:
    page = make_page(["abc"])
    with pytest.raises(ValueError, match="image-marker"):
        build_page_rows(0, page, lambda s: [7, 8], lambda b: None, 0, 10, reserved_ids=frozenset({8}))  # type: ignore[arg-type,return-value]
    with pytest.raises(ValueError):
        build_page_rows(0, page, lambda s: [7], lambda b: None, 0, 0)  # type: ignore[arg-type,return-value]


def test_run_batch_keeps_other_scores_and_input_untouched(tiny_dirs: dict[str, str]) -> None:
    scorer, model = _scorer(tiny_dirs["visual_gain_vlm"])
    page = replace(_pages()[0], scores={"parse": {"ok": True}})
    (out,) = scorer.run_batch([page], model)  # type: ignore[arg-type]
    assert out.scores["parse"] == {"ok": True} and "visual_gain" in out.scores
    assert "visual_gain" not in page.scores
    assert out.scores["visual_gain"]["model"] == tiny_dirs["visual_gain_vlm"]


def test_dtype_resolution_and_bf16_run(tiny_dirs: dict[str, str]) -> None:
    import torch

    assert resolve_dtype("auto", torch.device("cpu")) is torch.float32
    assert resolve_dtype("bfloat16", torch.device("cpu")) is torch.bfloat16
    scorer, model = _scorer(tiny_dirs["visual_gain_vlm"], dtype="bfloat16")
    assert model.model.dtype is torch.bfloat16  # type: ignore[attr-defined]
    vg = scorer.run_batch(_pages()[:1], model)[0].scores["visual_gain"]  # type: ignore[arg-type]
    assert math.isfinite(vg["delta_h_nats"])


def test_scores_pages_from_a_real_pdf(tiny_dirs: dict[str, str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A PDF written with PyMuPDF → Page records (text blocks + a cropped raster figure) → scores."""
    import pymupdf

    doc = pymupdf.open()
    pg = doc.new_page(width=612, height=792)
    pg.insert_text((72, 80), "Results: the catalyst raised the yield of the reaction.", fontsize=11)
    pg.insert_image(pymupdf.Rect(72, 100, 272, 250), stream=png_bytes((40, 90, 160), size=(200, 150), stripe=True))
    pg.insert_text((72, 280), "Figure 1: yield versus temperature for each catalyst.", fontsize=11)
    path = tmp_path / "tiny.pdf"
    doc.save(path)
    doc.close()

    doc = pymupdf.open(path)
    pg = doc[0]
    blocks = []
    for order, b in enumerate(sorted(pg.get_text("dict")["blocks"], key=lambda b: b["bbox"][1])):
        bbox = tuple(b["bbox"])
        if b["type"] == 1:
            pix = pg.get_pixmap(clip=pymupdf.Rect(bbox), dpi=72)
            crop = Crop.from_png(pix.tobytes("png"), pix.width, pix.height, 72)
            blocks.append(Block("figure", bbox, "", reading_order=order, crop=crop))
        else:
            text = " ".join(s["text"] for line in b["lines"] for s in line["spans"])
            blocks.append(Block("text", bbox, text, reading_order=order))
    page = Page("pdfdoc", 0, pg.rect.width, pg.rect.height, tuple(blocks), parser="pymupdf-test")
    doc.close()
    assert [k for k, _ in page.content()] == ["text", "image", "text"]
    scorer, model = _scorer(tiny_dirs["visual_gain_vlm"])
    vg = scorer.run_batch([page], model)[0].scores["visual_gain"]  # type: ignore[arg-type]
    assert vg["n_images"] == 1 and vg["n_text_tokens"] > 10 and math.isfinite(vg["delta_h_nats"])


def test_unsupported_family_is_a_clear_error() -> None:
    from types import SimpleNamespace

    from visual_gain.adapters import adapter_for

    with pytest.raises(ValueError, match="no adapter for model_type='idefics3'"):
        adapter_for(SimpleNamespace(model_type="idefics3"), None)
