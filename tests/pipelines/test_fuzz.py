"""A short run of ``benchmarks/fuzz_pdfs.py`` (the full one's figures are in benchmarks/RESULTS.md): mutants of two
generated papers through one real `scifolio build`; every mutant is accounted for, no crash, no hang."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _bench():
    spec = importlib.util.spec_from_file_location("fuzz_pdfs", ROOT / "benchmarks" / "fuzz_pdfs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_mutations_change_the_bytes_deterministically():
    from tests.pipelines.pdfs import write_paper

    fuzz = _bench()
    data = write_paper(Path(__import__("tempfile").mkdtemp()) / "p.pdf", n_pages=1).read_bytes()
    for kind in fuzz.MUTATIONS:
        a = fuzz.mutate(data, kind, __import__("random").Random(3))
        assert a != data, kind
        assert a == fuzz.mutate(data, kind, __import__("random").Random(3))


def test_short_pdf_fuzz_run_has_no_crash_hang_or_loss(tmp_path, tiny_tokenizer, capsys):
    fuzz = _bench()
    figures = tmp_path / "fuzz.json"
    rc = fuzz.main(
        ["--generated", "--mutants", "8", "--page-timeout", "5", "--tokenizer", tiny_tokenizer, "--backend", "pymupdf"]
        + ["--json", str(figures)]
    )
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1] == "crashes: 0, hangs: 0, losses: 0", out
    assert rc == 0
