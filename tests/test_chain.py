"""The mission's chain through the CLI only: PDFs → ``scifolio build`` → ``scifolio index build`` →
``scifolio index weights`` → ``scifolio pretrain --weights``, checking that the weights the CLI wrote are the
ones pre-training sampled by (``formats/weights.py``: draw = own sample_weight × listed weight, 1 unlisted)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def scifolio(*args: str, timeout: int = 900) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert r.returncode == 0, f"scifolio {' '.join(args)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return r.stdout


@pytest.mark.slow
@pytest.mark.integration  # the deepspeed launcher
def test_build_index_weights_pretrain_chain(tmp_path: Path, tiny_build: tuple[Path, Path]):
    from formats.shards import ShardFile, list_shards
    from formats.weights import DrawWeights, SampleWeights
    from pretrain.data import ShardIndex

    tiny, out = tiny_build  # models tiny → build, through the CLI (tests/conftest.py)
    clip = str(tiny / "retrieval" / "clip")
    uri = str(tmp_path / "index.db")
    scifolio("index", "build", "--shards", str(out), "--uri", uri, "--collections", "2", "--embed-model", clip)
    queries = tmp_path / "queries.txt"
    queries.write_text("a bar chart of conductivity\n")
    weights = tmp_path / "weights.parquet"
    summary = json.loads(
        scifolio(
            "index", "weights", "--queries", str(queries), "--shards", str(out), "--out", str(weights),
            "--uri", uri, "--embed-model", clip, "--reranker", str(tiny / "retrieval" / "reranker"),
            "--min-score", "0.0", "--max-weight", "3.0", "--k", "2",
        ).strip().splitlines()[-1]
    )  # fmt: skip
    run = tmp_path / "pretrain"
    scifolio(
        "pretrain", "--config", "debug", "--shards", str(out), "--models", str(tiny), "--weights", str(weights),
        "--max-steps", "2", "--out", str(run),
    )  # fmt: skip
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]

    # what the CLI wrote, read back through formats/
    listed = SampleWeights.read(weights).chunks
    own: dict[str, float] = {}
    for path in list_shards(out):
        ids, own_w = ShardFile(path).sample_weights()
        own.update(zip(ids, own_w))
    assert summary["weighted_chunks"] == len(listed) >= 1
    assert any(w != 1.0 for w in listed.values())  # at least one weight differs from 1
    unlisted = set(own) - set(listed)
    assert unlisted  # text-only chunks carry no weighted image

    # what pre-training sampled by (recorded by the run itself) is exactly own × listed, 1 when unlisted
    used = DrawWeights.read(run / "draw_weights.parquet").by_chunk()
    assert set(used) == set(own)
    for cid, draw in used.items():
        assert math.isclose(draw, own[cid] * listed.get(cid, 1.0), rel_tol=1e-6)
    for cid in unlisted:
        assert used[cid] == own[cid]

    # and over an epoch plan each chunk is drawn ⌊w⌋ or ⌈w⌉ times (⌊w⌋ + Bernoulli(frac w)), w = its draw weight
    index = ShardIndex.open(str(out), str(weights))
    names = [cid for f in index.files for cid in ShardFile(f).sample_weights()[0]]
    offsets = [0]
    for f in index.files:
        offsets.append(offsets[-1] + ShardFile(f).num_rows)
    for epoch in range(3):
        counts = Counter(names[offsets[f] + r] for f, r in index.plan(seed=0, epoch=epoch).tolist())
        for cid, w in used.items():
            assert math.floor(w) <= counts[cid] <= math.ceil(w), (cid, w, counts[cid])
