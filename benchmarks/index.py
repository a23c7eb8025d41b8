"""Benchmark the sharded image index on synthetic clustered 1024-d vectors (Milvus Lite, CPU).

Ours: ``retrieval.index.ShardedIndex`` with 1 collection vs N=4 shard collections (HNSW), concurrent fan-out
and merge. Baseline: exact brute force in numpy (float32 matmul, the ground truth for recall@10).
Prints recall@10, batched QPS, p50/p99 single-query latency, insert rate, and the ratios.

    python benchmarks/index.py --n 200000 --dim 1024 --queries 1000
    python benchmarks/index.py --n 20000 --queries 200          # quick look
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import tempfile
import time

import numpy as np


def clustered(n: int, dim: int, n_clusters: int, spread: float, rng: np.random.Generator) -> np.ndarray:
    """Unit vectors around random unit centres (images of one kind of figure cluster in embedding space)."""
    centres = rng.standard_normal((n_clusters, dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    out = np.empty((n, dim), dtype=np.float32)
    step = 50_000
    for s in range(0, n, step):
        m = min(step, n - s)
        x = centres[rng.integers(0, n_clusters, m)] + spread * rng.standard_normal((m, dim)).astype(
            np.float32
        ) / np.sqrt(dim)
        out[s : s + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def brute_force(x: np.ndarray, q: np.ndarray, k: int) -> tuple[np.ndarray, float]:
    """Exact top-k by inner product; returns ids and seconds."""
    t = time.perf_counter()
    out = np.empty((len(q), k), dtype=np.int64)
    for s in range(0, len(q), 100):
        sims = q[s : s + 100] @ x.T
        part = np.argpartition(-sims, k, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(sims, part, axis=1), axis=1)
        out[s : s + 100] = np.take_along_axis(part, order, axis=1)
    return out, time.perf_counter() - t


def ids_for(n: int) -> list[str]:
    return [hashlib.sha256(i.to_bytes(8, "little")).hexdigest() for i in range(n)]


def recall_at_k(found: list[list[str]], truth: np.ndarray, ids: list[str], k: int) -> float:
    hit = 0
    for f, t in zip(found, truth):
        hit += len(set(f[:k]) & {ids[j] for j in t[:k]})
    return hit / (k * len(found))


def bench_index(x, q, ids, truth, n_shards, uri, args):
    """Load ``x`` into a ShardedIndex at ``uri``, then measure recall@10, batched QPS and single-query latency."""
    from retrieval.index import IndexConfig, IndexRow, ShardedIndex

    results = {}
    cfg = IndexConfig(
        uri=uri,
        name=f"bench{n_shards}",
        n_shards=n_shards,
        index_type="HNSW",
        build_params={"M": args.M, "efConstruction": args.ef_construction},
    )
    ix = ShardedIndex(cfg)
    if args.reuse and ix.exists() and ix.count() == len(x):
        # Same seed → same vectors and ids: measure search again without re-inserting.
        results["insert_s"], results["insert_rate"] = float("nan"), float("nan")
    else:
        ix.drop()
        ix.ensure(x.shape[1])
        t = time.perf_counter()
        for s in range(0, len(x), args.insert_batch):
            rows = [IndexRow(sha256=ids[i], vector=x[i]) for i in range(s, min(s + args.insert_batch, len(x)))]
            ix.upsert(rows)
        ix.flush()
        results["insert_s"] = time.perf_counter() - t
        results["insert_rate"] = len(x) / results["insert_s"]
    t = time.perf_counter()
    ix.reload()  # Milvus Lite builds the HNSW graph of sealed data at load time
    ix.search(q[:1], k=10)
    results["first_search_s"] = time.perf_counter() - t
    assert ix.count() == len(x), ix.count()
    for ef in args.ef:
        ixe = ShardedIndex(IndexConfig(**{**cfg.__dict__, "search_params": {"ef": ef}}))
        ixe.search(q[:1], k=10)  # connect + load outside the timed loop
        t = time.perf_counter()
        found = []
        for s in range(0, len(q), args.query_batch):
            found += [[h.sha256 for h in hits] for hits in ixe.search(q[s : s + args.query_batch], k=10)]
        qps = len(q) / (time.perf_counter() - t)
        lat = []
        for i in range(args.single):
            t = time.perf_counter()
            ixe.search(q[i], k=10)
            lat.append((time.perf_counter() - t) * 1000)
        results[ef] = {
            "recall": recall_at_k(found, truth, ids, 10),
            "qps": qps,
            "p50": float(np.percentile(lat, 50)),
            "p99": float(np.percentile(lat, 99)),
        }
        ixe.close()
    ix.close()
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200_000, help="vectors in the index")
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--clusters", type=int, default=2000)
    ap.add_argument("--spread", type=float, default=1.0, help="cluster noise norm relative to the centre")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--single", type=int, default=200, help="single queries timed for p50/p99")
    ap.add_argument("--query-batch", type=int, default=100)
    ap.add_argument("--insert-batch", type=int, default=2000)
    ap.add_argument("--M", type=int, default=16)
    ap.add_argument("--ef-construction", type=int, default=200)
    ap.add_argument("--ef", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--workdir", default=None, help="where the Milvus Lite files go (default: a temp dir)")
    ap.add_argument("--reuse", action="store_true", help="with --workdir: reuse collections a previous run filled")
    args = ap.parse_args(argv)

    rng = np.random.default_rng(0)
    t = time.perf_counter()
    x = clustered(args.n, args.dim, args.clusters, args.spread, rng)
    # Queries: fresh points around the same centres (same seed → same centres, then different noise draws).
    q = clustered(args.queries, args.dim, args.clusters, args.spread, np.random.default_rng(0))
    ids = ids_for(args.n)
    print(
        f"data: {args.n} x {args.dim} clustered ({args.clusters} clusters) in {time.perf_counter() - t:.1f}s; "
        f"{args.queries} queries; machine: {os.cpu_count()} CPU cores"
    )
    truth, bf_s = brute_force(x, q, 10)
    bf_qps = len(q) / bf_s
    print(f"baseline numpy brute force: {bf_qps:,.0f} QPS batched (100/batch), recall 1.0 by definition")
    lat = []
    for i in range(min(args.single, 50)):
        t = time.perf_counter()
        brute_force(x, q[i : i + 1], 10)
        lat.append((time.perf_counter() - t) * 1000)
    print(
        f"baseline numpy brute force single query: p50 {np.percentile(lat, 50):.1f} ms, "
        f"p99 {np.percentile(lat, 99):.1f} ms"
    )

    work = args.workdir or tempfile.mkdtemp(prefix="scifolio-bench-")
    all_res = {}
    try:
        layouts = [
            ("1 collection", 1, "one.db"),
            (f"{args.shards} collections in one Lite file", args.shards, "shared.db"),
            (f"{args.shards} collections, one Lite file each", args.shards, "split_{shard}.db"),
        ]
        for label, n_shards, file in layouts:
            res = bench_index(x, q, ids, truth, n_shards, os.path.join(work, file), args)
            all_res[label] = res
            print(
                f"\n[{label}; HNSW M={args.M} efC={args.ef_construction}] insert "
                f"{res['insert_rate']:,.0f} rows/s ({res['insert_s']:.0f}s), index build+load "
                f"{res['first_search_s']:.0f}s",
                flush=True,
            )
            for ef in args.ef:
                r = res[ef]
                print(
                    f"  ef={ef:<4} recall@10 {r['recall']:.4f}  QPS {r['qps']:,.0f}  "
                    f"p50 {r['p50']:.1f} ms  p99 {r['p99']:.1f} ms  (QPS vs brute force x{r['qps'] / bf_qps:.2f})",
                    flush=True,
                )
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    one = all_res[layouts[0][0]]
    for label, _, _ in layouts[1:]:
        many = all_res[label]
        print(f"\n{label} vs 1 collection, same ef:")
        for ef in args.ef:
            print(
                f"  ef={ef:<4} p50 latency ratio {many[ef]['p50'] / one[ef]['p50']:.2f}x  "
                f"p99 ratio {many[ef]['p99'] / one[ef]['p99']:.2f}x  QPS ratio {many[ef]['qps'] / one[ef]['qps']:.2f}x  "
                f"recall {one[ef]['recall']:.4f} -> {many[ef]['recall']:.4f}"
            )
        print(f"  insert rate ratio {many['insert_rate'] / one['insert_rate']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
