"""A short run of ``benchmarks/fuzz_gateway.py`` (hypothesis over the three protocols, streaming and not, plus
oversized and truncated bodies; the full run's figures are in benchmarks/RESULTS.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_short_gateway_fuzz_run_has_no_5xx_stall_or_leak(capsys):
    spec = importlib.util.spec_from_file_location("fuzz_gateway", ROOT / "benchmarks" / "fuzz_gateway.py")
    fuzz = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fuzz)
    rc = fuzz.main(["--examples", "25", "--raw", "6", "--seed", "1"])
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1] == "crashes: 0, hangs: 0, losses: 0", out
    assert rc == 0
