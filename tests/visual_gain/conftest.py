"""Shared fixtures: tiny random VLMs written once per session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from visual_gain.tiny import write_tiny_visual_gain

    return write_tiny_visual_gain(Path(tmp_path_factory.mktemp("tiny_vlm")))
