"""Benchmark Memory Decoder decoding: fused (base + memory + router, Eq 3, two KV caches) vs base-only vs kNN-LM
(base + a live datastore search per generated token, Eq 1) on the same tiny models, CPU, batch 1, greedy.

The datastore is real: ``--keys`` rows of (the base's hidden state of a prefix, the next token) over generated
token sequences, upserted into sharded Milvus Lite collections (``retrieval.vectors``, metric L2 → squared L2
distances) and searched through the same fan-out/merge the Memory Decoder build uses. Building it is timed and
reported (insert rate, index load); ``--db`` keeps it for reruns (``--reuse``).

    python benchmarks/memdec.py --keys 1000000 --db /tmp/memdec-bench.db        # the recorded run
    python benchmarks/memdec.py --keys 20000 --tokens 16                         # quick look
    python benchmarks/memdec.py --keys 1000000 --db /tmp/memdec-bench.db --reuse # decode only
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from posttrain.memdec.datastore import InMemoryStore  # noqa: E402
from posttrain.memdec.fused import generate_base, generate_fused, generate_knn_lm  # noqa: E402
from posttrain.memdec.train import new_lm  # noqa: E402
from posttrain.objectives.memory_decoder import Router, RouterConfig  # noqa: E402
from retrieval.vectors import ShardedVectorStore, VectorStoreConfig  # noqa: E402


def models(vocab: int, hidden: int, work_dir: str | None):
    """Trained models of a ``scifolio memdec`` run when given, else tiny random ones of the same shape."""
    if work_dir:
        from posttrain.memdec.config import debug
        from posttrain.memdec.run import load_all

        _, base, memory, router = load_all(debug(work_dir))
        return base, memory, router
    base = new_lm(vocab, hidden, seed=0, pad_id=0).eval()
    memory = new_lm(vocab, hidden, seed=1, pad_id=0).eval()
    torch.manual_seed(2)
    return base, memory, Router(RouterConfig(hidden, hidden, width=64)).eval()


@torch.no_grad()
def key_chunks(base, n: int, seq: int = 128, batch: int = 64):
    """Deterministic (keys, values) chunks for n rows: the base's hidden states over random token sequences and
    the next tokens (seeded, so --exact-baseline rebuilds exactly the rows stored in Milvus)."""
    vocab, dim = base.config.vocab_size, base.config.hidden_size
    g = torch.Generator().manual_seed(0)
    done = 0
    while done < n:
        ids = torch.randint(1, vocab, (batch, seq + 1), generator=g)
        h = base(input_ids=ids[:, :-1], output_hidden_states=True).hidden_states[-1]
        k, v = h.reshape(-1, dim).numpy()[: n - done], ids[:, 1:].reshape(-1).numpy()[: n - done]
        yield k, v
        done += len(k)


def fill(store: ShardedVectorStore, base, n: int, chunk: int = 50_000) -> dict:
    """Upsert n rows from ``key_chunks``; returns timings."""
    store.ensure(base.config.hidden_size)
    t_enc = t_ins = 0.0
    done = 0
    buf_k, buf_v = [], []
    it = key_chunks(base, n)
    while done < n:
        t0 = time.perf_counter()
        k, v = next(it)
        buf_k.append(k)
        buf_v.append(v)
        t_enc += time.perf_counter() - t0
        if sum(len(x) for x in buf_k) >= chunk or done + sum(len(x) for x in buf_k) >= n:
            k, v = np.concatenate(buf_k), np.concatenate(buf_v)
            buf_k, buf_v = [], []
            t0 = time.perf_counter()
            store.upsert(np.arange(done, done + len(k), dtype=np.int64), k, v)
            t_ins += time.perf_counter() - t0
            done += len(k)
            print(f"  upserted {done:,}/{n:,} keys ({done / max(t_ins, 1e-9):,.0f}/s)", flush=True)
    t0 = time.perf_counter()
    store.reload()  # flush + release + load: Lite builds the ANN index of sealed segments here
    t_load = time.perf_counter() - t0
    return {"encode_s": t_enc, "insert_s": t_ins, "insert_per_s": n / t_ins, "index_load_s": t_load}


def timed(fn, repeats: int) -> tuple[float, int]:
    """Median seconds per generated token over ``repeats`` runs, and tokens per run."""
    per_tok, n = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
        n = len(out.tokens)
        per_tok.append(dt / n)
    return statistics.median(per_tok), n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000, help="datastore size (rows)")
    ap.add_argument("--db", default=None, help="Milvus Lite path (default: a temp dir, removed at the end)")
    ap.add_argument("--reuse", action="store_true", help="reuse --db if it holds --keys rows")
    ap.add_argument("--index", default="HNSW", help="index type: HNSW (default), FLAT, IVF_FLAT …")
    ap.add_argument("--shards", type=int, default=2, help="collections the keys are spread over")
    ap.add_argument("--hidden", type=int, default=64, help="hidden size of the tiny random models")
    ap.add_argument("--vocab", type=int, default=1024, help="vocabulary of the tiny random models")
    ap.add_argument("--work-dir", default=None, help="use the trained models of a `scifolio memdec` run instead")
    ap.add_argument("--tokens", type=int, default=32, help="new tokens per generation")
    ap.add_argument("--repeats", type=int, default=3, help="generations per method (median reported)")
    ap.add_argument("--k", type=int, default=16, help="neighbours per kNN-LM lookup")
    ap.add_argument("--lookups", type=int, default=50, help="single-query searches for the latency percentiles")
    ap.add_argument("--exact-baseline", action="store_true", help="also kNN-LM on exact in-memory search")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (tiny models: 1; 0 = one per core)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads or max(1, os.cpu_count() or 1))

    base, memory, router = models(args.vocab, args.hidden, args.work_dir)
    tmp = None
    db = args.db
    if db is None:
        import tempfile

        tmp = tempfile.mkdtemp(prefix="memdec-bench-")
        db = os.path.join(tmp, "bench.db")
    cfg = VectorStoreConfig(uri=db, name="bench", n_shards=args.shards, index_type=args.index, metric="L2")
    store = ShardedVectorStore(cfg)
    try:
        build = None
        if args.reuse and store.exists() and store.count() == args.keys:
            print(f"reusing {db}: {args.keys:,} keys")
        else:
            store.drop()
            print(f"building a {args.keys:,}-key datastore ({args.index}, {args.shards} shards) at {db}")
            build = fill(store, base, args.keys)
        n_stored = store.count()
        if n_stored != args.keys:
            raise SystemExit(f"datastore holds {n_stored:,} rows, expected {args.keys:,}")
        dim = base.config.hidden_size
        q = np.random.default_rng(1).standard_normal((args.lookups, dim)).astype(np.float32)
        store.search(q[:1], args.k)  # warm
        lat = []
        for i in range(args.lookups):
            t0 = time.perf_counter()
            store.search(q[i : i + 1], args.k)
            lat.append(time.perf_counter() - t0)
        lat_ms = np.array(lat) * 1000

        prompt = [1, 5, 9, 13, 17, 21, 25, 29]
        gens = {
            "base only": lambda: generate_base(base, prompt, args.tokens),
            "fused (Memory Decoder)": lambda: generate_fused(base, memory, router, prompt, args.tokens),
            "kNN-LM (live lookup)": lambda: generate_knn_lm(base, store, prompt, args.tokens, args.k, 1.0, 0.25),
        }
        if args.exact_baseline:
            t0 = time.perf_counter()
            parts = list(key_chunks(base, args.keys))
            keys = np.concatenate([p[0] for p in parts])
            exact = InMemoryStore()  # every key in process memory, exact squared-L2 top-k by one matmul
            exact.upsert(np.arange(len(keys)), keys, np.concatenate([p[1] for p in parts]))
            exact.flush()
            print(f"exact in-memory keys rebuilt in {time.perf_counter() - t0:.1f} s")
            gens["kNN-LM (exact, in memory)"] = lambda: generate_knn_lm(
                base, exact, prompt, args.tokens, args.k, 1.0, 0.25
            )
        res = {name: timed(fn, args.repeats) for name, fn in gens.items()}

        print(f"\n{args.keys:,} keys × {dim}-d, {args.index}, {args.shards} shards, metric L2 (squared), k={args.k}")
        print(f"torch threads {torch.get_num_threads()}, cores {os.cpu_count()}, batch 1, greedy, {args.tokens} tokens")
        if build:
            print(
                f"build: encode {build['encode_s']:.1f} s, upsert {build['insert_s']:.1f} s "
                f"({build['insert_per_s']:,.0f} keys/s), index load {build['index_load_s']:.1f} s"
            )
        print(
            f"single-query lookup latency: p50 {np.percentile(lat_ms, 50):.2f} ms, "
            f"p99 {np.percentile(lat_ms, 99):.2f} ms"
        )
        for name, (sec, n) in res.items():
            print(f"{name:26s} {1 / sec:9.1f} tokens/s   {sec * 1000:8.2f} ms/token   ({n} tokens/run)")
        plain, fused, knn = (res[k][0] for k in list(gens)[:3])
        print(f"fused / base-only time per token = {fused / plain:.2f}x  (the attachment's cost)")
        print(f"fused vs kNN-LM (Milvus) speed = {knn / fused:.2f}x  (target >= 3x)")
        if args.exact_baseline:
            print(f"fused vs kNN-LM (exact, in memory) speed = {res['kNN-LM (exact, in memory)'][0] / fused:.2f}x")
    finally:
        store.close()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
