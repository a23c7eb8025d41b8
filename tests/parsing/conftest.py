from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def parser():
    """One parse worker per test module (backends load once; tests stay fast)."""
    from parsing import Parser

    p = Parser()
    yield p
    p.close()
