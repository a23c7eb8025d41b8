"""Shared fixtures: tiny random VLMs written once per session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from pipelines.tiny import write_area

    return write_area(Path(tmp_path_factory.mktemp("tiny_vlm")), "visual_gain")
