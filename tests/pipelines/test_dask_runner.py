"""The corpus job on a second distributed engine: Beam's DaskRunner (``pipelines.jobs.dask_runner``) against a
``dask.distributed`` cluster on 127.0.0.1 (a scheduler and two worker processes) writes the same shards as the
DirectRunner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pipelines.pdfs import write_paper

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _build(inputs: Path, out: Path, tokenizer: str, *runner: str) -> dict:
    args = ["build", str(inputs), "--out", str(out), "--tokenizer", tokenizer, "--backend", "pymupdf"]
    args += ["--max-tokens", "512", "--overlap", "32", "--no-progress", "--max-error-rate", "1", *runner]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "pipelines.cli", *args], cwd=ROOT, env=env, capture_output=True)
    assert proc.returncode == 0, proc.stdout.decode()[-3000:] + proc.stderr.decode()[-3000:]
    return json.loads((out / "manifest.json").read_text())


def test_the_dask_runner_builds_the_direct_runners_shards(tmp_path: Path, tiny_tokenizer: str):
    from distributed import LocalCluster

    inputs = tmp_path / "in"
    inputs.mkdir()
    write_paper(inputs / "a.pdf", n_pages=2, seed=1)
    write_paper(inputs / "b.pdf", n_pages=1, seed=2)
    (inputs / "broken.pdf").write_bytes(b"%PDF-1.7 not really")  # a dead letter, through a tagged output
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
    ) as cluster:
        dask = _build(
            inputs,
            tmp_path / "dask",
            tiny_tokenizer,
            "--runner",
            "DaskRunner",
            "--dask_client_address",
            cluster.scheduler_address,
        )
    direct = _build(inputs, tmp_path / "direct", tiny_tokenizer)
    assert dask["totals"]["documents_in_shards"] == direct["totals"]["documents_in_shards"] == 2
    assert [(e["rows"], e["tokens"], e["sha256"]) for e in dask["shards"]] == [
        (e["rows"], e["tokens"], e["sha256"]) for e in direct["shards"]
    ]
    assert dask["dropped_by_reason"] == direct["dropped_by_reason"] and sum(direct["dropped_by_reason"].values()) == 1
