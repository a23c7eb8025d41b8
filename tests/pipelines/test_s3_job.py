"""The corpus job with its inputs and its output on an S3-compatible object store (moto's server on 127.0.0.1,
found through AWS_ENDPOINT_URL): a run killed with SIGKILL and rerun writes the same shard bytes as an
uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.pipelines.pdfs import write_paper
from tests.s3 import s3_server  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[2]


def _cli(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the AWS_* variables the fixture set are inherited
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@pytest.mark.slow
def test_s3_inputs_and_output_kill_and_resume_is_byte_identical(s3_server, tmp_path: Path, tiny_tokenizer):  # noqa: F811
    import fsspec

    from formats.manifest import Manifest
    from formats.shards import ShardFile, list_shards

    s3 = fsspec.filesystem("s3", skip_instance_cache=True)
    for i in range(4):
        s3.pipe(
            f"{s3_server.bucket}/pdfs/paper{i}.pdf", write_paper(tmp_path / f"p{i}.pdf", n_pages=2, seed=i).read_bytes()
        )
    s3.pipe(f"{s3_server.bucket}/pdfs/notes.txt", b"not below a PDF name: a directory input takes PDFs only")

    def args(out: str) -> list[str]:
        return [
            "build", s3_server.url("pdfs/"), "--out", out, "--tokenizer", tiny_tokenizer, "--backend", "pymupdf",
            "--max-tokens", "512", "--overlap", "32", "--docs-per-shard", "2", "--no-progress",
            "--direct_running_mode=in_memory", "--direct_num_workers=1",
        ]  # fmt: skip

    ref, killed = s3_server.url("ref"), s3_server.url("killed")
    proc = _cli(args(ref))
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out.decode()[-4000:]

    proc = _cli(args(killed))
    deadline = time.monotonic() + 600
    while not s3.glob(f"{s3_server.bucket}/killed/_work/*/*/*.done") and proc.poll() is None:
        assert time.monotonic() < deadline
        s3.invalidate_cache()
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    s3.invalidate_cache()
    assert not s3.exists(f"{s3_server.bucket}/killed/manifest.json")
    proc = _cli(args(killed))
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out.decode()[-4000:]

    s3.invalidate_cache()
    a, b = Manifest.read(ref), Manifest.read(killed)
    assert a.shards == b.shards and a.totals == b.totals and a.totals.documents_in_shards == 4
    assert b.metrics.get("documents_resumed", 0) >= 1
    for x, y in zip(list_shards(ref), list_shards(killed), strict=True):
        assert s3.cat(x) == s3.cat(y)  # byte-identical
    assert sum(ShardFile(p).num_rows for p in list_shards(killed)) == b.totals.chunks
