"""The exact in-memory ``KeyValueStore`` (the kNN-LM reference of ``benchmarks/memdec_real.py``) and the ``encode``
hook of ``write_knn_targets`` (targets from cached keys equal targets from the base's forward).

Run: python -m pytest tests/posttrain/test_memdec_memory_store.py -q
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posttrain.memdec.data import Example
from posttrain.memdec.datastore import InMemoryStore, encode_keys, read_targets, write_knn_targets
from posttrain.memdec.train import new_lm

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_exact_search_matches_brute_force_and_pads_like_milvus() -> None:
    rng = np.random.default_rng(0)
    keys, queries = rng.standard_normal((50, 8)).astype(np.float32), rng.standard_normal((7, 8)).astype(np.float32)
    store = InMemoryStore(query_block=3)  # several query blocks
    store.ensure(8)
    store.upsert(np.arange(100, 150), keys, np.arange(50) % 5)
    store.flush()
    assert store.count() == 50
    nb = store.search(queries, 4)
    want = torch.cdist(torch.from_numpy(queries).double(), torch.from_numpy(keys).double()).pow(2)
    d, idx = want.topk(4, dim=-1, largest=False)
    assert nb.ids.tolist() == (idx + 100).tolist()
    assert nb.values.tolist() == (idx % 5).tolist()
    assert nb.distances == pytest.approx(d.numpy(), abs=1e-4)
    # Upserting an id again replaces its row; asking for more than the store holds pads with id −1.
    small = InMemoryStore()
    small.upsert(np.array([1, 2]), keys[:2], np.array([3, 4]))
    small.upsert(np.array([2]), keys[:1], np.array([9]))
    nb = small.search(keys[:1], 3)
    assert small.count() == 2
    assert sorted(nb.ids[0, :2].tolist()) == [1, 2] and nb.ids[0, 2] == -1 and nb.values[0, 2] == -1
    assert nb.distances[0, :2] == pytest.approx([0.0, 0.0], abs=1e-5)  # id 2 now holds key 0 too
    with pytest.raises(ValueError, match="8-d"):
        small.ensure(4)


def test_targets_from_cached_keys_equal_targets_from_the_base(tmp_path) -> None:
    base = new_lm(32, 16, seed=0, pad_id=0).eval()
    g = torch.Generator().manual_seed(1)
    examples = [
        Example(index=i, ids=tuple([2, *torch.randint(4, 32, (5 + i % 3,), generator=g).tolist(), 3]), answer_start=1)
        for i in range(6)
    ]
    ids, keys, values = encode_keys(base, examples, 0)
    store = InMemoryStore()
    store.upsert(ids, keys, values)
    rows = {i: (ids[ids >> 20 == i], keys[ids >> 20 == i], values[ids >> 20 == i]) for i in range(6)}

    def cached(part):
        return tuple(np.concatenate([rows[e.index][j] for e in part]) for j in range(3))

    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    write_knn_targets(base, examples, store, a, 0, 32, k=3, tau=1.0, batch_examples=4)
    write_knn_targets(None, examples, store, b, 0, 32, k=3, tau=1.0, batch_examples=4, encode=cached)
    ra, rb = list(read_targets(a)), list(read_targets(b))
    assert [r["knn_tokens"] for r in ra] == [r["knn_tokens"] for r in rb]
    assert np.allclose(np.concatenate([np.ravel(r["knn_probs"]) for r in ra]),
                       np.concatenate([np.ravel(r["knn_probs"]) for r in rb]), atol=1e-6)  # fmt: skip
    assert any(p > 0 for r in ra for row in r["knn_probs"] for p in row)
