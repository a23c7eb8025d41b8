"""The worker's pipelined path (backend lanes + finisher helpers) gives the records of the in-process path."""

from __future__ import annotations

import pytest

from parsing import Document, Page, ParseConfig, Parser
from tests.parsing.fixtures import paper_pdf


def _in_process(data: bytes, config: ParseConfig, tmp_path) -> list[Page]:
    from parsing.core import BackendSet, parse_window
    from parsing.validate import open_pdf

    opened = open_pdf(data, "paper.pdf", config.limits)
    assert not isinstance(opened, Exception) and isinstance(opened, tuple)
    document, doc = opened
    path = tmp_path / "doc.pdf"
    path.write_bytes(data)
    return list(parse_window(doc, str(path), document, range(document.n_pages), config, BackendSet()))


@pytest.mark.parametrize("lanes", [0, 1])
def test_pipelined_worker_equals_in_process_parse(lanes, tmp_path):
    """One-page windows: with a lane, page 1 is parsed by the lane process while the worker parses page 0;
    clean-up and crops run in the finisher processes. Pages (boxes, text, crop PNGs) are the same."""
    data = paper_pdf()
    config = ParseConfig(backend="pymupdf", page_window=1, backend_lanes=lanes)
    with Parser() as parser:
        parser.warm(config)  # loads the backend and starts the finishers; the job queues behind the warm-up
        recs = list(parser.iter_parse(data, "paper.pdf", config))
    assert isinstance(recs[0], Document)
    pages = recs[1:]
    assert [type(p) for p in pages] == [Page, Page] and [p.page_index for p in pages] == [0, 1]
    assert pages == _in_process(data, config, tmp_path)
    assert any(b.crop is not None for p in pages for b in p.blocks)


def test_parser_removes_its_files_on_close_and_when_dropped():
    import gc
    from pathlib import Path

    from parsing.api import Parser

    p = Parser()
    log, workdir = Path(p._log.name), Path(p._workdir)
    assert log.exists() and workdir.is_dir()
    p.close()
    assert not log.exists() and not workdir.exists()
    p.close()  # idempotent

    p = Parser()  # never closed, e.g. a Beam DoFn whose teardown is not called
    log, workdir = Path(p._log.name), Path(p._workdir)
    del p
    gc.collect()
    assert not log.exists() and not workdir.exists()
