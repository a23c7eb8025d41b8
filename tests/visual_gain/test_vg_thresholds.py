"""Thresholds file, domain classifier, keep/drop decision and the threshold fit."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from vg_helpers import make_page, png_bytes

from formats.records import Dropped, Page
from visual_gain.perplexity import VisualGain
from visual_gain.thresholds import DOMAINS, Thresholds, classify_text, domain_of, fit_threshold, page_domain


def _scored(ppl_text: float, ppl_inter: float, n_images: int = 1, n_tokens: int = 700) -> Page:
    page = make_page(["Some text.", png_bytes((1, 2, 3))])
    vg = {**VisualGain.from_ppl(ppl_text, ppl_inter, n_tokens, n_images).to_dict(), "model": "m"}
    return replace(page, scores={"visual_gain": vg})


def test_packaged_defaults_cover_every_domain() -> None:
    t = Thresholds.load()
    assert set(DOMAINS) <= set(t.by_domain)
    assert t.threshold_for("astrophysics") == t.threshold_for("default")


def test_worked_pages_keep_and_drop() -> None:
    t = Thresholds({"default": 0.05, "chemistry": 0.4})
    kept = t.decide(_scored(12.4, 9.1), "default")
    assert isinstance(kept, Page)
    vg = kept.scores["visual_gain"]
    assert vg["kept"] is True and vg["threshold"] == 0.05 and vg["domain"] == "default"
    dropped = t.decide(_scored(11.0, 10.9), "default")
    assert isinstance(dropped, Dropped)
    assert (dropped.stage, dropped.reason, dropped.item_id) == ("visual_gain", "below_threshold", "doc:0")
    assert dropped.detail["delta_h_nats"] == pytest.approx(0.0091, abs=5e-5)
    assert dropped.detail["threshold"] == 0.05 and dropped.detail["domain"] == "default"
    # the same informative page falls below chemistry's stricter threshold
    assert isinstance(t.decide(_scored(12.4, 9.1), "chemistry"), Dropped)


def test_text_only_and_text_free_pages() -> None:
    t = Thresholds({"default": 0.0})
    text_only = _scored(5.0, 5.0, n_images=0)
    d = t.decide(text_only, "default")
    assert isinstance(d, Dropped) and d.reason == "no_visuals"
    assert isinstance(replace(t, keep_text_only=True).decide(text_only, "default"), Page)
    no_text = replace(text_only, scores={"visual_gain": {"delta_h_nats": 0.0, "n_images": 2, "n_text_tokens": 0}})
    d = t.decide(no_text, "default")
    assert isinstance(d, Dropped) and d.reason == "no_text"
    with pytest.raises(ValueError, match="no visual_gain"):
        t.decide(make_page(["x"]), "default")


def test_save_load_round_trip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    t = Thresholds({"default": 0.1, "chemistry": 0.2}, keep_text_only=True, fit={"chemistry": {"n": 3}})
    assert Thresholds.load(t.save(tmp_path / "t.json")) == t
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="not a thresholds file"):
        Thresholds.load(tmp_path / "bad.json")


@pytest.mark.parametrize(
    ("meta", "expected"),
    [
        ({"domain": "chemistry"}, "chemistry"),
        ({"subject": "Materials Science"}, "materials_science"),
        ({"categories": ["q-bio.GN", "cs.LG"]}, "life_sciences"),
        ({"arxiv_category": "cond-mat.mtrl-sci"}, "materials_science"),
        ({"journal": "Journal of Organic Chemistry"}, "chemistry"),
        ({"keywords": ["perovskite", "thin film"]}, "materials_science"),
        ({}, "default"),
    ],
)
def test_domain_from_metadata(meta: dict, expected: str) -> None:
    assert domain_of(meta) == expected


def test_domain_from_text() -> None:
    bio = "We measured gene expression in mice; the protein binds a receptor on the cell membrane of neurons."
    assert classify_text(bio) == "life_sciences"
    assert classify_text("The alloy lattice and grain microstructure after annealing; XRD diffraction.") == (
        "materials_science"
    )
    assert classify_text("We prove the theorem for all finite groups.") == "default"
    page = make_page(["The synthesis of the compound: reaction yield, solvent and catalyst, NMR spectra."])
    assert page_domain(page) == "chemistry"
    assert page_domain(page, {"domain": "life_sciences"}) == "life_sciences"  # metadata wins over text


def test_fit_recovers_a_known_threshold() -> None:
    rng = random.Random(1)
    true_t = 0.07
    dh = [rng.uniform(-0.05, 0.25) for _ in range(600)]
    clean = [x >= true_t for x in dh]
    fit = fit_threshold(dh, clean)
    assert fit.agreement == 1.0 and fit.n == 600
    below, above = max(x for x in dh if x < true_t), min(x for x in dh if x >= true_t)
    assert below < fit.threshold <= above
    noisy = [(not a) if rng.random() < 0.08 else a for a in clean]  # 8 % reviewer disagreement
    fit = fit_threshold(dh, noisy)
    assert fit.threshold == pytest.approx(true_t, abs=0.015)
    assert 0.85 < fit.agreement < 1.0


def test_fit_degenerate_labels() -> None:
    assert fit_threshold([0.1, 0.2, 0.3], [True, True, True]).threshold < 0.1
    assert fit_threshold([0.1, 0.2, 0.3], [False, False, False]).threshold > 0.3
    with pytest.raises(ValueError):
        fit_threshold([], [])
