"""MinerU tiers beyond flash need models; without them the error names the tier (no silent fallback)."""

from __future__ import annotations

import pytest

from parsing import BackendUnavailable, ParseConfig
from tests.parsing.fixtures import one_line_pdf


def test_missing_models_raise_naming_the_tier(parser, monkeypatch, tmp_path):
    monkeypatch.setenv("MINERU_MODEL_SOURCE", "local")  # never download inside tests
    with pytest.raises(BackendUnavailable, match="tier 'basic'"):
        list(parser.iter_parse(one_line_pdf(), "x.pdf", ParseConfig(tier="basic")))


def test_available_backends_reports_versions():
    from parsing import PARSER_VERSION, available_backends

    versions = available_backends()
    assert {"mineru", "pymupdf", "rapidocr", "rapid-layout"} <= set(versions)
    assert all(v[0].isdigit() for v in versions.values())
    assert PARSER_VERSION
