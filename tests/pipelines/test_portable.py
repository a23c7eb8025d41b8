"""The corpus job through Beam's PortableRunner (embedded job service) gives the DirectRunner's shards, with
the SDK harness in the driver (LOOPBACK) and in separate worker processes started by a worker pool
(EXTERNAL, ``apache_beam.runners.worker.worker_pool_main``: how Flink and Dataflow run Python workers).

The job service and the worker pool listen on every interface, so this runs only inside a loopback-only
network namespace:  unshare -n sh -c 'ip link set lo up && exec python -m pytest tests/pipelines/test_portable.py'
What this does not prove: a worker that shares no disk with the driver (here both see /tmp); see issue 11's
filesystem layer and the S3 tests for that.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import in_loopback_namespace
from tests.pipelines.pdfs import write_paper

pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.skipif(not in_loopback_namespace(), reason="Beam's job service binds every interface"),
]
ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    # The worker pool starts SDK workers as `python -c ...`: the venv's python must come first on PATH.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PYTHONPATH": str(ROOT), "PATH": path}


def _build(pdfs: Path, out: Path, tokenizer: str, *beam: str) -> dict:
    args = ["build", str(pdfs), "--out", str(out), "--tokenizer", tokenizer, "--backend", "pymupdf"]
    args += ["--max-tokens", "512", "--overlap", "32", "--no-progress", "--max-error-rate", "1", *beam]
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args], cwd=ROOT, env=_env(), capture_output=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout.decode()[-3000:] + proc.stderr.decode()[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    quarantine = {p.name: p.read_text() for p in sorted((out / "quarantine").glob("*.jsonl"))}
    return {"shards": manifest["shards"], "totals": manifest["totals"], "quarantine": quarantine}


def test_portable_runner_gives_the_direct_runners_shards(tmp_path: Path, tiny_tokenizer: str):
    pdfs = tmp_path / "pdfs"
    pdfs.mkdir()
    write_paper(pdfs / "a.pdf", n_pages=2, seed=1)
    write_paper(pdfs / "b.pdf", n_pages=1, seed=2)
    (pdfs / "empty.pdf").write_bytes(b"")
    portable = ["--runner=PortableRunner", "--job_endpoint=embed"]

    direct = _build(pdfs, tmp_path / "direct", tiny_tokenizer)
    assert direct["totals"]["documents_in_shards"] == 2 and direct["quarantine"]
    loopback = _build(pdfs, tmp_path / "loopback", tiny_tokenizer, *portable, "--environment_type=LOOPBACK")
    assert loopback == direct

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pool = subprocess.Popen(
        [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main", f"--service_port={port}"],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:  # wait for the pool to listen
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the worker pool did not start"
                time.sleep(0.5)
        external = _build(
            pdfs,
            tmp_path / "external",
            tiny_tokenizer,
            *portable,
            "--environment_type=EXTERNAL",
            f"--environment_config=localhost:{port}",
        )
    finally:
        os.killpg(pool.pid, 9)
        pool.wait()
    assert external == direct
