"""Hostile PDFs cost seconds: a page that never finishes drawing is quarantined after one page timeout.

The hanging PDF is generated (``tests.pipelines.pdfs.hanging_pdf``: form XObjects nested 40 deep, each drawing
the next twice), so MuPDF really spins on it; no test hook is set. ``benchmarks/hostile_inputs.py`` measures
the same over the sample PDFs plus a set of hostile files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.pipelines.pdfs import hanging_pdf, write_paper

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
PAGE_TIMEOUT = 5.0
SLACK = 10.0  # the acceptance bound: page timeout + 10 s


def test_parser_gives_up_on_a_hanging_page_after_one_page_timeout(tmp_path: Path):
    from parsing import Document, Dropped, Page, ParseConfig, Parser
    from parsing.api import TEST_HANG_ENV

    assert TEST_HANG_ENV not in os.environ
    config = ParseConfig(backend="pymupdf", page_timeout_s=PAGE_TIMEOUT)
    paper = write_paper(tmp_path / "paper.pdf", n_pages=1).read_bytes()
    with Parser() as parser:
        assert [type(r) for r in parser.iter_parse(paper, "paper.pdf", config)] == [Document, Page]  # started

        t0 = time.monotonic()
        recs = list(parser.iter_parse(hanging_pdf(1, (0,)), "hang.pdf", config))
        elapsed = time.monotonic() - t0
        assert [type(r) for r in recs] == [Document, Dropped]
        assert (recs[1].item_id, recs[1].reason) == (f"{recs[0].doc_id}:0", "timeout")
        assert elapsed <= PAGE_TIMEOUT + SLACK, f"the hanging page held the parser {elapsed:.1f} s"

        # The middle page of three hangs: the other two are parsed, by the restarted worker.
        recs = list(parser.iter_parse(hanging_pdf(3, (1,)), "hang3.pdf", config))
        assert [r.page_index for r in recs if isinstance(r, Page)] == [0, 2]
        assert [(r.item_id.rsplit(":", 1)[1], r.reason) for r in recs if isinstance(r, Dropped)] == [("1", "timeout")]


def _build(inputs: Path, out: Path, tokenizer: str, **extra_env: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **extra_env}
    env.pop("SCIFOLIO_PARSE_TEST_HANG", None)
    args = ["build", str(inputs), "--out", str(out), "--tokenizer", tokenizer, "--backend", "pymupdf"]
    args += ["--page-timeout", str(PAGE_TIMEOUT), "--max-tokens", "512", "--overlap", "32", "--no-progress"]
    args += ["--max-error-rate", "1"]  # the hanging file is a content failure on purpose
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pipelines.cli", *args], cwd=ROOT, env=env, capture_output=True)
    assert proc.returncode == 0, proc.stdout.decode()[-3000:] + proc.stderr.decode()[-3000:]
    return time.monotonic() - t0


def test_build_quarantines_a_hanging_pdf_within_the_page_timeout(tmp_path: Path, tiny_tokenizer: str):
    normal, both = tmp_path / "normal", tmp_path / "both"
    normal.mkdir()
    write_paper(normal / "paper.pdf", n_pages=2, seed=5)
    both.mkdir()
    write_paper(both / "paper.pdf", n_pages=2, seed=5)
    (both / "hang.pdf").write_bytes(hanging_pdf(1, (0,)))

    t_normal = _build(normal, tmp_path / "out-normal", tiny_tokenizer)
    t_both = _build(both, tmp_path / "out-both", tiny_tokenizer)

    manifest = json.loads((tmp_path / "out-both" / "manifest.json").read_text())
    assert manifest["totals"]["documents_in_shards"] == 1  # the paper is built
    assert manifest["dropped_by_reason"]["parse.timeout"] == 1  # the hanging page is quarantined
    rows = [
        json.loads(line) for line in (tmp_path / "out-both" / "quarantine" / "parse.jsonl").read_text().splitlines()
    ]
    assert [(r["reason"], json.loads(r["detail"])["source"].endswith("hang.pdf")) for r in rows] == [("timeout", True)]
    ref = json.loads((tmp_path / "out-normal" / "manifest.json").read_text())
    # the paper's chunks are those of a build without the hostile file (the shards differ only in its path)
    assert [(e["rows"], e["tokens"]) for e in manifest["shards"]] == [(e["rows"], e["tokens"]) for e in ref["shards"]]
    extra = t_both - t_normal
    print(f"builds: {t_normal:.1f} s without, {t_both:.1f} s with the hanging PDF")
    assert extra <= PAGE_TIMEOUT + SLACK, (
        f"the hanging PDF added {extra:.1f} s (builds: {t_normal:.1f} s, {t_both:.1f} s)"
    )


def test_pages_that_hang_the_renderer_cost_their_pages_not_the_document(tmp_path: Path):
    """The default parser (MinerU + the fused layout, whose detector renders every page) on a 15-page PDF whose
    pages 3, 7 and 8 take minutes to render (``hanging_render_pdf``; their text reads at once): those pages are
    quarantined after the page timeout, the other 12 are parsed, within 1.5 × quarantined pages × timeout + 30 s."""
    from parsing import Document, Dropped, Page, ParseConfig, Parser
    from tests.pipelines.pdfs import hanging_render_pdf

    timeout = 15.0  # MinerU's first call after start-up takes seconds on a busy machine
    config = ParseConfig(page_timeout_s=timeout)
    assert (config.backend, config.layout) == ("mineru", "fused")  # the default parser
    paper = write_paper(tmp_path / "paper.pdf", n_pages=1).read_bytes()
    hanging = (3, 7, 8)
    data = hanging_render_pdf(15, hanging)
    with Parser() as parser:
        assert [type(r) for r in parser.iter_parse(paper, "paper.pdf", config)] == [Document, Page]  # started

        t0 = time.monotonic()
        recs = list(parser.iter_parse(data, "hang-render.pdf", config))
        elapsed = time.monotonic() - t0
    assert isinstance(recs[0], Document)
    assert [r.page_index for r in recs if isinstance(r, Page)] == [i for i in range(15) if i not in hanging]
    dropped = sorted((int(r.item_id.rsplit(":", 1)[1]), r.reason) for r in recs if isinstance(r, Dropped))
    assert dropped == [(i, "timeout") for i in hanging]
    bound = 1.5 * len(hanging) * timeout + 30
    print(f"15 pages, {len(hanging)} hanging the renderer: {elapsed:.1f} s (bound {bound:.1f} s)")
    assert elapsed <= bound, f"{elapsed:.1f} s > {bound:.1f} s"


def test_build_retries_a_document_whose_worker_is_killed(tmp_path: Path, tiny_tokenizer: str):
    """The parse worker is SIGKILLed (as by the OOM killer) when the window holding page 1 starts: the build
    parses those pages again on a fresh worker and the document lands in the shards whole, as without the kill."""
    from parsing.api import TEST_KILL_ENV

    inputs = tmp_path / "in"
    inputs.mkdir()
    write_paper(inputs / "paper.pdf", n_pages=3, seed=5)
    marker = tmp_path / "killed-once"
    _build(inputs, tmp_path / "out", tiny_tokenizer, **{TEST_KILL_ENV: f"1:{marker}"})
    assert marker.exists()  # the worker did die
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert (manifest["totals"]["documents_in_shards"], manifest["totals"]["pages"]) == (1, 3)
    assert manifest["dropped_by_reason"] == {}  # no page lost, nothing quarantined
