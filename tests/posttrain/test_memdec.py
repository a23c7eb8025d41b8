"""Memory Decoder stages on tiny models built from configs: fused decoding (Eq 3), memory checkpoint/resume,
kNN targets from real Milvus Lite search results, configs and the CLI's errors.

Run: python -m pytest tests/posttrain/test_memdec.py -q
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from formats.overrides import with_overrides
from formats.rundir import RunDir
from posttrain.memdec.config import debug
from posttrain.memdec.data import Example, collate, forward, gold, load_lm, shifted
from posttrain.memdec.datastore import (
    build_datastore,
    knn_from_neighbours,
    read_targets,
    write_knn_targets,
)
from posttrain.memdec.fused import fused_step, generate_base, generate_fused, generate_knn_lm
from posttrain.memdec.train import checkpoint_step, new_lm, targets_batch, train_memory
from posttrain.objectives.memory_decoder import Router, RouterConfig, fuse
from retrieval.vectors import ShardedVectorStore, VectorStoreConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")


V = 48


def _examples(n: int, seed: int = 1) -> list[Example]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        q = torch.randint(4, V, (2 + i % 3,), generator=g).tolist()
        a = torch.randint(4, V, (3 + i % 4,), generator=g).tolist()
        out.append(Example(index=i, ids=tuple([2, *q, *a, 3]), answer_start=1 + len(q)))
    return out


@pytest.fixture(scope="module")
def models():
    base = new_lm(V, 32, seed=0, pad_id=0).eval()
    memory = new_lm(V, 16, seed=1, pad_id=0).eval()
    torch.manual_seed(2)
    router = Router(RouterConfig(32, 16, width=8)).eval()
    return base, memory, router


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 5),
    vocab=st.integers(2, 300),
    scale=st.floats(0.01, 50.0),
)
def test_fused_probabilities_sum_to_one(seed: int, batch: int, vocab: int, scale: float) -> None:
    """Eq 3 with a router's λ ∈ (0, 1) is a convex mix of two distributions: ≥ 0 and sums to 1 for every token."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    router = Router(RouterConfig(6, 5, width=4))
    for p in router.parameters():  # large weights drive λ to the edges 0 and 1 as well
        p.data.mul_(scale)
    lb, lm = scale * torch.randn(batch, vocab, generator=g), scale * torch.randn(batch, vocab, generator=g)
    p, lam = fused_step(lb, lm, torch.randn(batch, 6, generator=g), torch.randn(batch, 5, generator=g), router)
    assert ((lam >= 0) & (lam <= 1)).all()
    assert (p >= 0).all()
    assert torch.allclose(p.sum(-1), torch.ones(batch), atol=1e-5)


def test_fused_generation_matches_full_recompute(models) -> None:
    """The KV-cached loop gives, at every step, the Eq 3 distribution a full forward of the prefix gives."""
    base, memory, router = models
    prompt = [2, 7, 9, 11]
    out = generate_fused(base, memory, router, prompt, max_new_tokens=6, greedy=False, seed=5)
    assert len(out.tokens) == 6 and all(0 < lam < 1 for lam in out.lambdas)
    seq = torch.tensor([prompt + out.tokens])
    with torch.no_grad():
        b = base(input_ids=seq, output_hidden_states=True)
        m = memory(input_ids=seq, output_hidden_states=True)
        for i, tok in enumerate(out.tokens):
            t = len(prompt) - 1 + i
            p, lam = fused_step(
                b.logits[:, t].float(), m.logits[:, t].float(), b.hidden_states[-1][:, t], m.hidden_states[-1][:, t],
                router,
            )  # fmt: skip
            assert p[0, tok].item() == pytest.approx(out.probs[i], rel=1e-4)
            assert lam.item() == pytest.approx(out.lambdas[i], rel=1e-4)
    greedy_base = generate_base(base, prompt, 4)
    assert greedy_base.tokens[0] == int(b.logits[0, len(prompt) - 1].argmax())


def test_knn_targets_are_eq1_of_real_neighbours_and_knn_lm_decodes(models, tmp_path) -> None:
    base, _, _ = models
    examples = _examples(12)
    cfg = VectorStoreConfig(uri=str(tmp_path / "ds.db"), name="t", n_shards=2, index_type="FLAT")
    with ShardedVectorStore(cfg) as store:
        stats = build_datastore(base, examples, store, tmp_path / "cursor.json", 0, batch_examples=5, source="x")
        assert store.count() == stats["keys"] == sum(len(e.positions()) for e in examples)
        out = tmp_path / "targets.parquet"
        write_knn_targets(base, examples, store, out, 0, V, k=4, tau=2.0, exclude_self=True, batch_examples=5)
        rows = list(read_targets(out))
        assert [r["index"] for r in rows] == [e.index for e in examples]
        # Recompute one position by hand: search k+1, drop the query's own row, Eq 1 over the other 4.
        e = examples[7]
        t = e.answer_start + 1
        with torch.no_grad():
            _, h = forward(base, collate([e], 0))
        nb = store.search(h[0, t - 1].numpy(), k=5)
        self_id = (e.index << 20) | t
        assert self_id in nb.ids[0].tolist() and nb.distances[0, nb.ids[0].tolist().index(self_id)] < 1e-6
        keep = nb.ids[0] != self_id
        d, v = nb.distances[0][keep][:4].astype(np.float64), nb.values[0][keep][:4]
        w = np.exp(-d / 2.0)
        want = np.zeros(V)
        np.add.at(want, v, w / w.sum())
        got = np.zeros(V)
        j = t - e.answer_start
        np.add.at(got, rows[7]["knn_tokens"][j], rows[7]["knn_probs"][j])
        assert got == pytest.approx(want, abs=1e-6)
        b, toks, probs = targets_batch(rows[:3], 0)
        assert toks.shape[0] == gold(b).shape[0] == sum(len(x.positions()) for x in examples[:3])
        # kNN-LM decoding: one live search per token, Eq 1 from what Milvus returned, mixed at λ.
        knn = generate_knn_lm(base, store, [2, 5, 6], max_new_tokens=3, k=4, tau=2.0, lam=0.5)
        assert len(knn.tokens) == 3 and all(0 < p <= 1 for p in knn.probs)
        p = knn_from_neighbours(store.search(np.zeros((2, 32), np.float32), 4), V, 2.0)
        assert torch.allclose(p.sum(-1), torch.ones(2, dtype=p.dtype))


def test_memory_resume_ends_where_an_uninterrupted_run_ends(models, tmp_path) -> None:
    base, _, _ = models
    examples = _examples(16)
    cfg = VectorStoreConfig(uri=str(tmp_path / "ds.db"), name="t", n_shards=1, index_type="FLAT")
    with ShardedVectorStore(cfg) as store:
        build_datastore(base, examples, store, tmp_path / "cursor.json", 0, batch_examples=8, source="x")
        targets = tmp_path / "targets.parquet"
        write_knn_targets(base, examples, store, targets, 0, V, k=4, tau=1.0)

    def run(out: Path, steps: int, resume: bool):
        return train_memory(
            new_lm(V, 16, seed=1, pad_id=0), targets, out, 0, steps, batch=3, lr=1e-2, beta=0.5, save_every=2,
            resume=resume,
        )  # fmt: skip

    straight = run(tmp_path / "a", 6, False)
    # Interrupted after step 5 (checkpoints at steps 2 and 4), then resumed from step 4 up to 6.
    with pytest.raises(_Stop):
        train_memory(
            new_lm(V, 16, seed=1, pad_id=0), targets, tmp_path / "e", 0, 6, batch=3, lr=1e-2, beta=0.5, save_every=2,
            progress=_stop_at(5),
        )  # fmt: skip
    assert checkpoint_step(tmp_path / "e") == 4
    assert [r["step"] for r in RunDir(tmp_path / "e", resume=True).rows()] == [1, 2, 3, 4, 5]
    resumed = run(tmp_path / "e", 6, True)
    # The redone step 5 is not duplicated; the policy is the Hugging Face export of the final weights.
    assert [r["step"] for r in RunDir(tmp_path / "e", resume=True).rows()] == [1, 2, 3, 4, 5, 6]
    exported = load_lm(str(tmp_path / "e" / "policy"))
    assert all(torch.equal(x, y) for x, y in zip(resumed.parameters(), exported.parameters()))
    assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(straight.parameters(), resumed.parameters()))
    assert not all(torch.equal(x, y) for x, y in zip(straight.parameters(), new_lm(V, 16, 1, 0).parameters()))
    with pytest.raises(FileNotFoundError):
        run(tmp_path / "nothing", 6, True)


class _Stop(Exception):
    pass


def _stop_at(step: int):
    def cb(s: int, loss: float) -> None:
        assert np.isfinite(loss)
        if s == step:
            raise _Stop

    return cb


def test_config_overrides() -> None:
    cfg = with_overrides(debug("w"), {"memory.steps": "7", "store.uri": "http://127.0.0.1:19530", "datastore.tau": 2})
    assert cfg.memory.steps == 7 and cfg.store.uri == "http://127.0.0.1:19530" and cfg.datastore.tau == 2.0
    assert cfg.path("base") == str(Path("w") / "base") and cfg.store_uri == "http://127.0.0.1:19530"
    with pytest.raises(KeyError, match="has no field .stepz."):
        with_overrides(cfg, {"memory.stepz": 1})
    with pytest.raises(ValueError, match="memory.steps"):
        with_overrides(cfg, {"memory.steps": "'many'"})


def test_cli_errors_are_clear(tmp_path, capsys) -> None:
    from pipelines.cli import main

    with pytest.raises(SystemExit) as e:
        main(["memdec", "train", "--work-dir", str(tmp_path), "--set", "memory.nope=1"])
    assert e.value.code == 2 and "MemoryConfig has no field 'nope'" in capsys.readouterr().err
    assert main(["memdec", "build-datastore", "--work-dir", str(tmp_path), "--quiet"]) == 2
    assert "scifolio memdec prepare" in capsys.readouterr().err


def test_collate_alignment() -> None:
    ex = _examples(3)
    b = collate(ex, 0)
    g = gold(b)
    assert g.tolist() == [t for e in ex for t in e.ids[e.answer_start :]]
    x = torch.arange(b.ids.numel()).view(b.ids.shape).unsqueeze(-1)
    rows = shifted(x, b).squeeze(-1)
    T = b.ids.shape[1]
    assert rows.tolist() == [bi * T + t - 1 for bi, e in enumerate(ex) for t in e.positions()]
    assert fuse(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]]), 0.25).tolist() == [[0.75, 0.25]]


def test_corpus_shards_are_a_second_datastore_source(tmp_path) -> None:
    from formats.shards import ChunkRow, Segment, write_shard
    from posttrain.memdec import run
    from posttrain.memdec.data import SHARD_SOURCE_OFFSET, shard_examples
    from posttrain.memdec.synthetic import SyntheticConfig, vocabulary, write_jsonl, write_tokenizer

    work = tmp_path / "w"
    tok = write_tokenizer(work / "tokenizer", vocabulary(SyntheticConfig(n_genes=4)))
    new_lm(len(tok), 16, seed=0, pad_id=tok.pad_token_id).save_pretrained(str(work / "base"))
    write_jsonl(work / "data" / "domain_train.jsonl", [{"question": "where is g001 expressed ?", "answer": "g001 is expressed in the liver ."}])  # fmt: skip
    text = "g002 encodes a kinase that acts in the brain . the old cat sees the dog ."
    rows = [
        ChunkRow(doc_id="d" * 64, chunk_index=i, segments=(Segment(kind="text", n_tokens=17, page_index=0, text=text),))
        for i in range(2)
    ]
    write_shard(tmp_path / "out" / "shards" / "shard-00000-of-00001.parquet", rows)
    exs = shard_examples(tmp_path / "out", tok, max_len=8)  # 17 tokens per chunk → windows of 6
    assert [e.index - SHARD_SOURCE_OFFSET for e in exs] == list(range(6))
    assert [len(e.ids) - 1 for e in exs] == [6, 6, 6, 6, 6, 6] and all(e.answer_start == 1 for e in exs)
    # EOS only where the chunk's text ends, never inside it
    assert [e.ids[-1] == tok.eos_token_id for e in exs] == [False, False, True, False, False, True]
    cfg = with_overrides(debug(str(work)), {"shards": str(tmp_path / "out"), "datastore.max_len": 8})
    with ShardedVectorStore(VectorStoreConfig(uri=str(work / "ds.db"), n_shards=2, index_type="FLAT")) as store:
        stats = run.build(cfg, store, quiet=True)
        ids, _ = store.rows()
    n_sft = 8 - (1 + 5)  # max_len 8 cuts [BOS] + 5 question tokens + answer: 2 answer-side positions remain
    n_shard = sum(len(e.positions()) for e in exs)
    assert stats["resumed_from"] == {"sft": 0, "shards": 0} and stats["keys"] == stats["stored"] == n_sft + n_shard
    assert int((ids >= SHARD_SOURCE_OFFSET << 20).sum()) == n_shard  # the shard source's ids never meet the SFT's
    assert stats["target_positions"] == n_sft + n_shard


def test_config_paths_default_under_work_dir_and_refuse_unknown_names() -> None:
    cfg = debug()
    assert cfg.path("base") == str(Path(cfg.work_dir) / "base")
    assert cfg.path("domain_eval") == str(Path(cfg.work_dir) / "data" / "domain_eval.jsonl")
    with pytest.raises(ValueError, match="unknown path 'seed'"):
        cfg.path("seed")  # a field, but not a path: before, getattr returned 0 and the default was made up
