"""retrieval.vectors against real Milvus Lite: metric, fan-out merge, idempotent upserts.

Run: python -m pytest tests/retrieval/test_vectors.py -q
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from retrieval.vectors import ShardedVectorStore, VectorStoreConfig, shard_of_ids


@pytest.fixture
def store(tmp_path):
    with ShardedVectorStore(VectorStoreConfig(uri=str(tmp_path / "kv.db"), n_shards=3, index_type="FLAT")) as s:
        yield s


def test_l2_returns_squared_distance_and_merges_shards_exactly(store) -> None:
    rng = np.random.default_rng(0)
    keys = rng.standard_normal((300, 8)).astype(np.float32)
    ids = np.arange(300, dtype=np.int64) * 7 + 1
    store.ensure(8)
    assert store.upsert(ids, keys, ids % 11) == 300
    assert store.counts() == [int((shard_of_ids(ids, 3) == s).sum()) for s in range(3)]
    assert min(store.counts()) > 50  # structured ids still spread over the shards
    q = rng.standard_normal((4, 8)).astype(np.float32)
    nb = store.search(q, k=5)
    exact = ((q[:, None, :] - keys[None]) ** 2).sum(-1)  # squared L2, what Milvus' "L2" returns
    order = np.argsort(exact, axis=1)[:, :5]
    assert (nb.ids == ids[order]).all()
    assert np.allclose(nb.distances, np.take_along_axis(exact, order, 1), rtol=1e-4, atol=1e-4)
    assert (nb.values == ids[order] % 11).all()


def test_upsert_is_idempotent_and_pads_short_results(store) -> None:
    store.ensure(4)
    ids = np.array([5, 9, 1 << 40], dtype=np.int64)
    keys = np.eye(4, dtype=np.float32)[:3]
    store.upsert(ids, keys, np.array([1, 2, 3]))
    store.upsert(ids, keys, np.array([1, 2, 3]))  # a replayed batch after a crash
    assert store.count() == 3
    got_ids, got_vals = store.rows()
    assert got_ids.tolist() == sorted(ids.tolist()) and got_vals.tolist() == [1, 2, 3]
    assert store.existing(np.array([5, 6, 1 << 40])).tolist() == [5, 1 << 40]
    nb = store.search(np.zeros(4, dtype=np.float32), k=5)
    assert nb.ids[0, 3:].tolist() == [-1, -1] and np.isinf(nb.distances[0, 3:]).all()
    with pytest.raises(ValueError, match="4-d"):
        store.ensure(6)
    with pytest.raises(ValueError, match="duplicate"):
        store.upsert(np.array([1, 1]), np.zeros((2, 4)), np.array([0, 0]))


def _in_fresh_process(code: str) -> subprocess.CompletedProcess:
    repo = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": repo}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_lite_recovers_from_a_truncated_index_sidecar(tmp_path) -> None:
    """A kill while Milvus Lite writes an index sidecar leaves a truncated ``.idx``; a new process must still load.
    (Each step in its own process: a Lite server lives as long as the process that opened the file, and locks it.)"""
    head = (
        "import numpy as np\n"
        "from retrieval.vectors import ShardedVectorStore, VectorStoreConfig\n"
        f"cfg = VectorStoreConfig(uri={str(tmp_path / 'kv.db')!r}, n_shards=1, index_type='FLAT')\n"
        "keys = np.random.default_rng(1).standard_normal((20, 4)).astype(np.float32)\n"
    )
    write = head + (
        "with ShardedVectorStore(cfg) as s:\n"
        "    s.ensure(4); s.upsert(np.arange(20), keys, np.arange(20)); s.reload()\n"
    )
    assert _in_fresh_process(write).returncode == 0
    sidecars = sorted((tmp_path / "kv.db").rglob("*.idx"))
    assert sidecars
    sidecars[0].write_bytes(sidecars[0].read_bytes()[:128])  # header only, as a SIGKILL mid-write leaves it
    read = head + (
        "with ShardedVectorStore(cfg) as s:\n"
        "    nb = s.search(keys[3], k=1)\n"
        "    print('RESULT', nb.ids[0, 0], s.count())\n"
    )
    out = _in_fresh_process(read)
    assert "RESULT 3 20" in out.stdout, out.stderr[-2000:]
    assert "rebuilding 1 index sidecars" in out.stderr
