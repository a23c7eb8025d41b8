"""A hanging page or document is killed and quarantined with reason ``timeout`` (hang injected by a hook)."""

from __future__ import annotations

import pytest

from parsing import Document, Dropped, Page, ParseConfig
from parsing.api import TEST_HANG_ENV
from tests.parsing.fixtures import paper_pdf

FAST = dict(backend="pymupdf", page_window=2)


@pytest.mark.slow  # ≈ 20 s: a 2-page window times out, then each page is retried alone
def test_page_timeout_drops_only_that_page(parser, monkeypatch):
    monkeypatch.setenv(TEST_HANG_ENV, "page:1")
    recs = list(parser.iter_parse(paper_pdf(), "paper.pdf", ParseConfig(page_timeout_s=6, **FAST)))
    assert isinstance(recs[0], Document)
    doc_id = recs[0].doc_id
    assert [r.page_index for r in recs if isinstance(r, Page)] == [0]
    drops = [r for r in recs if isinstance(r, Dropped)]
    assert [(d.item_id, d.stage, d.reason) for d in drops] == [(f"{doc_id}:1", "parse", "timeout")]
    # the worker was replaced: the next document parses normally
    monkeypatch.delenv(TEST_HANG_ENV)
    again = list(parser.iter_parse(paper_pdf(), "paper.pdf", ParseConfig(**FAST)))
    assert [r.page_index for r in again if isinstance(r, Page)] == [0, 1]


def test_open_hang_is_an_open_timeout(parser, monkeypatch):
    monkeypatch.setenv(TEST_HANG_ENV, "open")
    recs = list(parser.iter_parse(paper_pdf(), "paper.pdf", ParseConfig(page_timeout_s=3, **FAST)))
    assert [(type(r), r.stage, r.reason) for r in recs] == [(Dropped, "open", "timeout")]


@pytest.mark.parametrize("window", [1, 2])
def test_document_timeout(parser, monkeypatch, window):
    monkeypatch.setenv(TEST_HANG_ENV, "page:1")
    cfg = ParseConfig(backend="pymupdf", page_window=window, page_timeout_s=60, doc_timeout_s=10)
    recs = list(parser.iter_parse(paper_pdf(), "paper.pdf", cfg))
    assert isinstance(recs[0], Document)
    last = recs[-1]
    assert isinstance(last, Dropped) and last.item_id == recs[0].doc_id and last.reason == "timeout"
    assert last.detail["pages_missing"] == [1] or last.detail["pages_missing"] == [0, 1]


def test_a_worker_killed_mid_document_is_retried_on_a_fresh_one(parser, monkeypatch, tmp_path):
    """SIGKILL (as the kernel's OOM killer deals it) when page 1's window starts: the pages in flight are parsed
    again, one at a time, on a fresh worker; nothing is lost. A page whose worker dies on it alone twice is
    quarantined as ``worker_killed``, apart from content crashes."""
    from parsing.api import TEST_KILL_ENV

    monkeypatch.setenv(TEST_KILL_ENV, f"1:{tmp_path / 'killed-once'}")
    recs = list(parser.iter_parse(paper_pdf(), "paper.pdf", ParseConfig(**FAST)))
    assert (tmp_path / "killed-once").exists()  # the worker did die
    assert [type(r) for r in recs] == [Document, Page, Page]
    assert [r.page_index for r in recs[1:]] == [0, 1]

    # dies every time page 1 is in flight: page 0 is kept, page 1 quarantined after its retry alone
    monkeypatch.setenv(TEST_KILL_ENV, "1:")
    recs = list(parser.iter_parse(paper_pdf(), "paper.pdf", ParseConfig(**FAST)))
    assert [r.page_index for r in recs if isinstance(r, Page)] == [0]
    drops = [r for r in recs if isinstance(r, Dropped)]
    assert [(d.item_id.rsplit(":", 1)[1], d.reason) for d in drops] == [("1", "worker_killed")]
    assert drops[0].detail["detail"] == "worker killed (signal 9, SIGKILL)"
