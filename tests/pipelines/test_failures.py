"""Failures are classified, never silent: content failures are final dead letters and count against
``--max-error-rate``; infrastructure failures are retried, then left retryable (not marked done) so the next
run builds them."""

from __future__ import annotations

from pathlib import Path

import pytest

from formats.manifest import Manifest
from formats.quarantine import iter_quarantine
from formats.records import Document, Page
from pipelines.assembly.build import (
    BuildConfig,
    DocumentBuilder,
    RetryableError,
    is_infrastructure_error,
)
from pipelines.cli import main
from tests.pipelines.pdfs import write_corpus, write_paper


@pytest.mark.parametrize(
    ("exc", "infra"),
    [
        (MemoryError(), True),
        (OSError("connection reset by peer"), True),
        (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (TimeoutError(), True),
        (ValueError("an image of 9000 tokens cannot fit a chunk"), False),
        (KeyError("page"), False),
    ],
)
def test_classification(exc, infra):
    assert is_infrastructure_error(exc) is infra


def test_builder_raises_retryable_and_keeps_content_errors_final(tiny_tokenizer):
    data = b"%PDF-fake"
    doc = Document("d" * 64, "x.pdf", 1)
    page = Page(doc.doc_id, 0, 100.0, 100.0, (), parser="t")

    def oom(document, pages):
        raise RuntimeError("CUDA out of memory")

    with pytest.raises(RetryableError):
        DocumentBuilder(BuildConfig(tokenizer=tiny_tokenizer), page_filter=oom).build(data, "x.pdf", [doc, page])

    def bug(document, pages):
        raise ValueError("bad page")

    result = DocumentBuilder(BuildConfig(tokenizer=tiny_tokenizer), page_filter=bug).build(data, "x.pdf", [doc, page])
    assert not result.retryable and [(d.stage, d.reason) for d in result.dropped] == [("build", "error")]


def _build(pdfs: Path, out: Path, tokenizer: str, *extra: str) -> int:
    return main(
        ["build", str(pdfs), "--out", str(out), "--tokenizer", tokenizer, "--backend", "pymupdf", "--no-progress"]
        + ["--direct_running_mode=in_memory", "--direct_num_workers=1", *extra]
    )


def test_max_error_rate_exit_codes(tmp_path: Path, tiny_tokenizer: str, capsys):
    pdfs = write_corpus(tmp_path / "pdfs")  # 6 inputs: 3 papers, a duplicate, an empty file, a non-PDF
    assert _build(pdfs, tmp_path / "out", tiny_tokenizer) == 1  # 2 of 6 failed > 5 %
    printed = capsys.readouterr()
    assert "33.3% of documents" in printed.out and "open.not_pdf" in printed.out
    assert "above --max-error-rate 5.0%" in printed.err
    assert _build(pdfs, tmp_path / "out", tiny_tokenizer, "--max-error-rate", "0.34") == 0  # resumed, same result
    t = Manifest.read(tmp_path / "out").totals
    assert (t.documents_in_shards, t.documents_failed, t.documents_quarantined, t.documents_retryable) == (3, 2, 3, 0)


@pytest.mark.slow
def test_out_of_memory_in_the_scorer_leaves_the_document_retryable(tmp_path: Path, tiny_tokenizer: str, monkeypatch):
    from pipelines.tiny import write_area
    from visual_gain.scorer import VisualGainScorer
    from visual_gain.thresholds import Thresholds

    pdfs = tmp_path / "pdfs"
    pdfs.mkdir()
    write_paper(pdfs / "a.pdf", n_pages=2, seed=1)
    write_paper(pdfs / "b.pdf", n_pages=1, seed=2)
    vlm = write_area(tmp_path / "models", "visual_gain")["visual_gain_vlm"]
    thresholds = tmp_path / "thresholds.json"
    Thresholds(by_domain={d: -10.0 for d in Thresholds.load(None).by_domain}).save(thresholds)
    out = tmp_path / "out"
    args = ["--visual-gain-model", vlm, "--thresholds", str(thresholds), "--retries", "1", "--retry-backoff", "0.01"]
    real = VisualGainScorer.run_batch
    calls = []

    def out_of_memory(self, pages, model):
        calls.append(pages[0].doc_id)
        raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(VisualGainScorer, "run_batch", out_of_memory)
    assert _build(pdfs, out, tiny_tokenizer, *args) == 1
    m = Manifest.read(out)
    assert m.totals.documents_retryable == 2 and m.totals.documents_in_shards == 0 and m.totals.documents_failed == 0
    assert len(calls) == 4  # two documents × (first try + one retry)
    retry = [d for d in iter_quarantine(out / "quarantine") if d.reason == "retryable"]
    assert len(retry) == 2 and all("out of memory" in d.detail["error"] for d in retry)
    assert not list((out / "_work").rglob("*.done"))  # nothing marked done

    monkeypatch.setattr(VisualGainScorer, "run_batch", real)  # the scorer is fixed
    assert _build(pdfs, out, tiny_tokenizer, *args) == 0
    m = Manifest.read(out)
    assert m.totals.documents_in_shards == 2 and m.totals.documents_retryable == 0
    assert not [d for d in iter_quarantine(out / "quarantine") if d.reason == "retryable"]


def test_scoring_failures_belong_to_their_document_in_a_batch(tiny_tokenizer, monkeypatch):
    """The visual-gain ModelHandler scores each document of a Beam batch on its own: a content error fails only
    its document (a final build/error), an out-of-memory is retried and then leaves only its document retryable,
    and the other document of the same batch is scored and built."""
    from formats.scores import VisualGainScore
    from pipelines.assembly.build import PendingDocument, RetryPolicy
    from pipelines.jobs.corpus import FinishDocument
    from pipelines.jobs.scoring import VisualGainScoring
    from pipelines.jobs.stages import VisualGainSlot
    from visual_gain.scorer import VisualGainConfig, VisualGainScorer

    def pending(name: str) -> PendingDocument:
        doc_id = name * 64
        page = Page(doc_id, 0, 100.0, 100.0, (), parser="t")
        return PendingDocument(doc_id, f"{name}.pdf", Document(doc_id, f"{name}.pdf", 1), [page], [], {"documents": 1})

    calls = []

    def run_batch(self, pages, model):
        calls.append(pages[0].doc_id[0])
        if pages[0].doc_id[0] == "a":
            raise ValueError("page text tokenises to image-marker ids")
        if pages[0].doc_id[0] == "b":
            raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return [VisualGainScore(0.0, n_text_tokens=0, n_images=0).on(p) for p in pages]

    monkeypatch.setattr(VisualGainScorer, "run_batch", run_batch)
    slot = VisualGainSlot(VisualGainConfig(model="unused"))
    handler = VisualGainScoring(slot, RetryPolicy(attempts=3, backoff_s=0.0))
    results = list(handler.run_inference([pending("a"), pending("b"), pending("c")], model=None))
    assert calls == ["a", "b", "b", "b", "c"]  # a content error is not retried; out of memory is, per document
    outcomes = {r.example.doc_id[0]: r.inference for r in results}
    assert outcomes["a"].pages is None and not outcomes["a"].infrastructure and "image-marker" in outcomes["a"].error
    assert outcomes["b"].pages is None and outcomes["b"].infrastructure and outcomes["b"].attempts == 3
    assert outcomes["c"].pages is not None

    finish = FinishDocument(BuildConfig(tokenizer=tiny_tokenizer, visual_gain=slot), "unused")
    finish.setup()
    built = {r.example.doc_id[0]: finish._result(r.example, r.inference) for r in results}
    assert [(d.stage, d.reason) for d in built["a"].dropped] == [("build", "error")] and not built["a"].retryable
    assert [(d.stage, d.reason) for d in built["b"].dropped] == [("build", "retryable")] and built["b"].retryable
    assert "out of memory" in built["b"].dropped[0].detail["error"] and built["b"].dropped[0].detail["attempts"] == 3
    # c's page has no visuals: the default thresholds drop it (no_visuals), a policy outcome, not a failure
    assert [(d.stage, d.reason) for d in built["c"].dropped] == [
        ("visual_gain", "no_visuals"),
        ("visual_gain", "no_page_kept"),
    ]


def test_a_parse_worker_that_cannot_start_is_an_infrastructure_failure(tiny_tokenizer):
    from formats.records import Dropped

    data = b"%PDF-fake-2"
    doc_id = __import__("hashlib").sha256(data).hexdigest()
    builder = DocumentBuilder(BuildConfig(tokenizer=tiny_tokenizer))
    with pytest.raises(RetryableError):
        builder.build(data, "x.pdf", [Dropped(doc_id, "open", "worker_start", {"source": "x.pdf"})])
    final = builder.build(data, "x.pdf", [Dropped(doc_id, "open", "corrupt", {"source": "x.pdf"})])
    assert [(d.stage, d.reason) for d in final.dropped] == [("open", "corrupt")] and not final.retryable


def _shard_hashes(out: Path) -> list[tuple[str, str]]:
    return [(e.file, e.sha256) for e in Manifest.read(out).shards]


def test_a_page_out_of_memory_leaves_the_document_retryable_and_a_rerun_equals_a_clean_run(
    tmp_path: Path, tiny_tokenizer: str, monkeypatch
):
    """The backend raises MemoryError on page 1 of a.pdf: not a page drop but an infrastructure failure, retried
    in a fresh worker, then the document is ``build/retryable`` and not done; the rerun builds it, and its
    shards equal those of a clean run."""
    from parsing.api import TEST_RAISE_ENV

    pdfs = tmp_path / "pdfs"
    pdfs.mkdir()
    write_paper(pdfs / "a.pdf", n_pages=2, seed=1)
    write_paper(pdfs / "b.pdf", n_pages=1, seed=2)
    retry = ["--retries", "1", "--retry-backoff", "0.01"]
    monkeypatch.setenv(TEST_RAISE_ENV, "MemoryError:page:1")
    assert _build(pdfs, tmp_path / "out", tiny_tokenizer, *retry) == 1
    t = Manifest.read(tmp_path / "out").totals
    assert (t.documents_in_shards, t.documents_retryable, t.documents_failed, t.pages_failed) == (1, 1, 0, 0)
    dropped = list(iter_quarantine(tmp_path / "out" / "quarantine"))
    assert [(d.stage, d.reason) for d in dropped] == [("build", "retryable")]
    assert "infrastructure" in dropped[0].detail["error"] and dropped[0].detail["attempts"] == 2
    monkeypatch.delenv(TEST_RAISE_ENV)
    assert _build(pdfs, tmp_path / "out", tiny_tokenizer, *retry) == 0  # the machine is fine again
    assert _build(pdfs, tmp_path / "clean", tiny_tokenizer) == 0
    assert _shard_hashes(tmp_path / "out") == _shard_hashes(tmp_path / "clean")
    t = Manifest.read(tmp_path / "out").totals
    assert (t.documents_in_shards, t.documents_retryable, t.pages, t.pages_failed) == (2, 0, 3, 0)
    assert not list(iter_quarantine(tmp_path / "out" / "quarantine"))


def test_a_page_content_error_is_dropped_with_its_reason_and_counts_toward_the_page_rate(
    tmp_path: Path, tiny_tokenizer: str, monkeypatch
):
    from parsing.api import TEST_RAISE_ENV

    pdfs = tmp_path / "pdfs"
    pdfs.mkdir()
    write_paper(pdfs / "a.pdf", n_pages=2, seed=1)
    write_paper(pdfs / "b.pdf", n_pages=1, seed=2)
    monkeypatch.setenv(TEST_RAISE_ENV, "ValueError:page:1")
    assert _build(pdfs, tmp_path / "out", tiny_tokenizer) == 0  # documents: 0 % failed; pages unlimited
    t = Manifest.read(tmp_path / "out").totals
    assert (t.documents_in_shards, t.documents_retryable, t.pages, t.pages_failed) == (2, 0, 3, 1)
    (d,) = iter_quarantine(tmp_path / "out" / "quarantine")
    assert (d.stage, d.reason, d.item_id.rsplit(":", 1)[1]) == ("parse", "backend_error", "1")
    assert "ValueError: test hook: page 1" in d.detail["detail"]
    assert _build(pdfs, tmp_path / "out", tiny_tokenizer, "--max-error-rate", "0.05,pages=0.2") == 1  # 33 % > 20 %
    assert _build(pdfs, tmp_path / "out", tiny_tokenizer, "--max-error-rate", "pages=0.5") == 0


def test_a_filter_that_keeps_no_page_is_an_outcome_not_a_failure(tiny_tokenizer, capsys):
    from formats.manifest import Totals
    from formats.outcomes import is_filtered
    from formats.records import Dropped
    from pipelines.cli.build import ErrorRates, error_rates, exit_status

    data = b"%PDF-filtered"
    doc = Document(__import__("hashlib").sha256(data).hexdigest(), "x.pdf", 1)
    page = Page(doc.doc_id, 0, 100.0, 100.0, (), parser="t")

    def below_threshold(document, pages):
        return [], [Dropped(p.page_id, "visual_gain", "below_threshold", {}) for p in pages]

    r = DocumentBuilder(BuildConfig(tokenizer=tiny_tokenizer), page_filter=below_threshold).build(
        data, "x.pdf", [doc, page]
    )
    assert [(d.stage, d.reason) for d in r.dropped] == [
        ("visual_gain", "below_threshold"),
        ("visual_gain", "no_page_kept"),
    ]
    assert all(is_filtered(d.stage, d.reason) for d in r.dropped) and not r.retryable

    class M:  # a build where visual gain kept no page of any document
        totals = Totals(2, 0, 2, 0, 0, documents_filtered=2, pages=2, pages_filtered=2)
        dropped_by_reason = {"visual_gain.below_threshold": 2, "visual_gain.no_page_kept": 2}

    assert exit_status(M, error_rates("0")) == 0
    assert "filtered (policy)" in capsys.readouterr().out
    assert error_rates("0.1,pages=0.02") == ErrorRates(0.1, 0.02) and error_rates("pages=0") == ErrorRates(0.05, 0.0)
