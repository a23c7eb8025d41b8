"""Near-duplicate documents: the same paper in other bytes and layout is caught, papers that share only a
journal's template are not, and the kept document does not depend on the order of arrival (in memory and on
Beam's TestPipeline)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from pipelines.assembly.dedup import (
    Decontaminator,
    DedupConfig,
    document_words,
    find_near_duplicates,
    first_pages_text,
    signature,
    similarity,
)
from tests.pipelines.pdfs import hanging_pdf

VOCAB = (
    "sample film oxide layer grain boundary diffusion anneal temperature conductivity mobility carrier density "
    "substrate lattice strain phonon scattering measurement spectrum peak width fit model parameter energy "
    "activation barrier defect vacancy dopant concentration thickness deposition rate pressure flow gas surface "
    "roughness interface contact resistance voltage current hysteresis cycle stability degradation humidity "
    "exposure crystal phase transition order magnetic field susceptibility heat capacity entropy electron hole "
    "recombination lifetime photoluminescence absorption edge band gap refractive index ellipsometry microscopy"
).split()
TEMPLATE_HEADER = "Journal of Applied Conductivity · Vol. 12 (2024) · doi:10.5555/jac.2024.{page}"
TEMPLATE_FOOTER = "© 2024 Example Press. Distributed under the Creative Commons Attribution 4.0 licence. Page {page}"
LICENCE = (
    "This is an open access article distributed under the terms of the Creative Commons Attribution License, "
    "which permits unrestricted use, distribution, and reproduction in any medium, provided the original author "
    "and source are credited. The authors declare no competing interests. Data are available from the "
    "corresponding author upon reasonable request. Received 3 March 2024; accepted 9 May 2024."
)


def paper_pages(seed: int, n_pages: int = 3, words_per_page: int = 170) -> list[str]:
    """A paper's body text per page: sentences of words drawn with ``seed`` (different seeds: different papers)."""
    rng = random.Random(seed)
    pages = []
    for _ in range(n_pages):
        words = [rng.choice(VOCAB) for _ in range(words_per_page)]
        sentences = [" ".join(words[i : i + 14]).capitalize() + "." for i in range(0, len(words), 14)]
        pages.append(" ".join(sentences))
    return pages


def write_pdf(path: Path, pages: list[str], font: str = "helv", size: float = 10, margin: float = 72, template=False):
    import pymupdf

    doc = pymupdf.open()
    for k, body in enumerate(pages):
        page = doc.new_page(width=612, height=792)
        top = margin
        if template:
            page.insert_text((margin, 40), TEMPLATE_HEADER.format(page=k + 1), fontsize=8, fontname=font)
            page.insert_text((margin, 770), TEMPLATE_FOOTER.format(page=k + 1), fontsize=8, fontname=font)
            if k == 0:
                page.insert_textbox(pymupdf.Rect(margin, 560, 612 - margin, 740), LICENCE, fontsize=8, fontname=font)
        rc = page.insert_textbox(pymupdf.Rect(margin, top, 612 - margin, 550), body, fontsize=size, fontname=font)
        assert rc >= 0, "body text did not fit the page"
    doc.save(path, garbage=3, deflate=True)
    doc.close()
    return path.read_bytes()


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def test_same_text_other_fonts_margins_and_template_is_a_near_duplicate(tmp_path: Path):
    config = DedupConfig()
    body = paper_pages(seed=1)
    preprint = write_pdf(tmp_path / "preprint.pdf", body, font="helv", size=10, margin=72)
    publisher = write_pdf(tmp_path / "publisher.pdf", body, font="tiro", size=9, margin=54, template=True)
    assert preprint != publisher
    texts = {_sha(d): first_pages_text(d, config) for d in (preprint, publisher)}
    assert all(t is not None and len(t) == 3 for t in texts.values())
    assert texts[_sha(preprint)] != texts[_sha(publisher)]  # other line breaks, header, footer, licence
    kept, dropped = find_near_duplicates(texts.items(), config)
    keep, drop = sorted(texts)
    assert kept == [keep]
    assert [(d.item_id, d.stage, d.reason, d.detail["kept"]) for d in dropped] == [
        (drop, "dedup", "near_duplicate", keep)
    ]
    assert dropped[0].detail["similarity"] >= config.threshold


def test_papers_sharing_only_a_journal_template_are_kept(tmp_path: Path):
    config = DedupConfig()
    a = write_pdf(tmp_path / "a.pdf", paper_pages(seed=2), template=True)
    b = write_pdf(tmp_path / "b.pdf", paper_pages(seed=3), template=True)
    ta, tb = first_pages_text(a, config), first_pages_text(b, config)
    sa, sb = signature(ta, config), signature(tb, config)
    assert sa is not None and sb is not None
    assert similarity(sa, sb) < 0.2
    # the template is what strip_repeated_lines removes: header and footer are not among the words compared
    assert "journal" not in document_words(ta) and "example" not in document_words(ta)
    kept, dropped = find_near_duplicates([(_sha(a), ta), (_sha(b), tb)], config)
    assert kept == sorted([_sha(a), _sha(b)]) and dropped == []


def _corpus() -> list[tuple[str, list[str] | None]]:
    """Three clusters of variants (a paper, with a word changed, with a page dropped), singletons, a doc
    without text."""
    docs = []
    for seed in (10, 11, 12):
        base = paper_pages(seed)
        variant = [base[0].replace("film", "films", 1), *base[1:]]
        docs += [(f"{seed:02d}-a", base), (f"{seed:02d}-b", variant), (f"{seed:02d}-c", [*base, "Appendix A."])]
    docs += [(f"single-{s}", paper_pages(s)) for s in (20, 21, 22)]
    docs.append(("scan", None))
    return docs


def test_kept_document_is_the_same_whatever_the_order():
    config = DedupConfig()
    docs = _corpus()
    kept, dropped = find_near_duplicates(docs, config)
    assert kept == ["10-a", "11-a", "12-a", "scan", "single-20", "single-21", "single-22"]
    assert sorted((d.item_id, d.detail["kept"]) for d in dropped) == [
        (f"{s}-{v}", f"{s}-a") for s in ("10", "11", "12") for v in ("b", "c")
    ]
    rng = random.Random(0)
    for _ in range(5):
        rng.shuffle(docs)
        assert find_near_duplicates(docs, config) == (kept, dropped)


def test_beam_transform_matches_and_ignores_order(tmp_path: Path):
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from pipelines.jobs.dedup import NearDuplicates

    config = DedupConfig()
    docs = _corpus()
    kept, dropped = find_near_duplicates(docs, config)
    for order in (docs, list(reversed(docs))):
        with TestPipeline(options=beam.options.pipeline_options.PipelineOptions(["--runner=DirectRunner"])) as p:
            out = p | beam.Create(order) | NearDuplicates(config)
            assert_that(out["kept"], equal_to(kept), label="kept")
            assert_that(out["dropped"], equal_to([d.to_row() for d in dropped]), label="dropped")
            dup = {d.item_id: (d.detail["kept"], d.detail["similarity"]) for d in dropped}
            rounded = out["duplicates"] | beam.Map(lambda m: {k: (v[0], round(v[1], 4)) for k, v in m.items()})
            assert_that(rounded, equal_to([dup]), label="duplicates")


def test_first_pages_text_gives_up_on_a_hanging_pdf():
    import time

    config = DedupConfig(text_timeout_s=2)
    t0 = time.monotonic()
    assert first_pages_text(hanging_pdf(1, (0,)), config) is None
    assert time.monotonic() - t0 < 6
    assert first_pages_text(b"%PDF-1.7 not really", config) is None


def test_decontamination_reports_each_benchmark_hit():
    bench = {
        "quiz-1": "What is the activation energy of vacancy diffusion in the oxide layer when the anneal "
        "temperature is raised above the phase transition of the crystal",
        "quiz-2": "Name the three scattering mechanisms that limit electron mobility in a doped film at room "
        "temperature and explain how each depends on carrier density",
    }
    deco = Decontaminator(bench, n=13)
    leaked = paper_pages(5)[0] + " " + bench["quiz-2"] + " " + paper_pages(6)[0]
    hits = deco.check("doc-1", leaked)
    assert [(h.doc_id, h.benchmark, h.fraction) for h in hits] == [("doc-1", "quiz-2", 1.0)]
    assert hits[0].shared_ngrams == len(bench["quiz-2"].split()) - 13 + 1
    assert deco.check("doc-2", paper_pages(5)[0]) == []


@pytest.mark.parametrize("threshold", [0.5, 0.75, 0.9])
def test_lsh_bands_fit_the_threshold(threshold):
    b, r = DedupConfig(threshold=threshold).bands
    assert b * r <= 128 and abs((1 / b) ** (1 / r) - threshold) < 0.08


def test_the_corpus_job_drops_the_near_duplicate_and_keeps_other_papers(tmp_path: Path, tiny_tokenizer: str):
    """Through ``scifolio build``: a preprint and its publisher PDF (same text, other fonts/margins/template)
    become one document, a different paper in the same template stays."""
    from formats.manifest import Manifest
    from formats.quarantine import iter_quarantine
    from pipelines.cli import main

    pdfs = tmp_path / "pdfs"
    pdfs.mkdir()
    preprint = write_pdf(pdfs / "preprint.pdf", paper_pages(seed=1), font="helv", size=10, margin=72)
    published = write_pdf(pdfs / "published.pdf", paper_pages(seed=1), font="tiro", size=9, margin=60, template=True)
    other = write_pdf(pdfs / "other.pdf", paper_pages(seed=2), font="tiro", size=9, margin=60, template=True)
    out = tmp_path / "out"
    argv = ["build", str(pdfs), "--out", str(out), "--tokenizer", tiny_tokenizer, "--backend", "pymupdf"]
    assert main([*argv, "--no-progress", "--direct_running_mode=in_memory", "--direct_num_workers=1"]) == 0
    m = Manifest.read(out)
    assert m.totals.documents_in_shards == 2 and m.totals.documents_failed == 0
    dropped = [d for d in iter_quarantine(out / "quarantine") if d.reason == "near_duplicate"]
    kept = min(_sha(preprint), _sha(published))
    assert [(d.item_id, d.detail["kept"]) for d in dropped] == [(max(_sha(preprint), _sha(published)), kept)]
    assert _sha(other) not in {d.item_id for d in dropped}


def test_the_corpus_job_drops_a_document_that_contains_a_benchmark_text(tmp_path: Path, tiny_tokenizer: str):
    import json

    from formats.manifest import Manifest
    from formats.quarantine import iter_quarantine
    from pipelines.cli import main

    bench_text = " ".join(paper_pages(seed=7, n_pages=1, words_per_page=60))
    pdfs = tmp_path / "pdfs"
    pdfs.mkdir()
    leaked = write_pdf(pdfs / "leaked.pdf", [paper_pages(seed=3, n_pages=1)[0][:300] + " " + bench_text])
    clean = write_pdf(pdfs / "clean.pdf", paper_pages(seed=4, n_pages=1))
    benchmarks = tmp_path / "bench.jsonl"
    benchmarks.write_text(json.dumps({"name": "toy-bench/q17", "text": bench_text}) + "\n")
    out = tmp_path / "out"
    argv = ["build", str(pdfs), "--out", str(out), "--tokenizer", tiny_tokenizer, "--backend", "pymupdf"]
    argv += ["--decontaminate", str(benchmarks), "--no-progress", "--direct_running_mode=in_memory"]
    assert main([*argv, "--direct_num_workers=1"]) == 0  # removal on purpose is not a failure
    assert Manifest.read(out).totals.documents_in_shards == 1
    (hit,) = [d for d in iter_quarantine(out / "quarantine") if d.stage == "decontam"]
    assert hit.item_id == _sha(leaked) != _sha(clean) and hit.reason == "benchmark_overlap"
    assert hit.detail["hits"][0]["benchmark"] == "toy-bench/q17" and hit.detail["hits"][0]["fraction"] > 0.9
