"""The image index at scale on the Milvus server: 512-d clustered vectors, N = 100k, 300k, 1M, per index type.

One collection per N in the layout the index uses by default (``retrieval.index``: one collection, ``shards_num``
2, ``doc_id`` partition key), loaded by bulk import of parquet files. For each index type: build the index (time
until every row is indexed), load it, then measure over 1,000 held-out queries (drawn from the same clusters,
never inserted) recall@10 against exact numpy search, single-query p50/p99 latency at k = 10 through our layer
(``ShardedIndex.search``) and through pymilvus directly on the same collection (each query through both, back to
back, the order alternating), resident memory per vector and disk per vector (the server's storage directory).

Resident memory (issue 35 item 2) is measured on a **fresh server process**: once the index is built the collection
is released, the server stopped (SIGTERM, graceful) and started again on the same data directory, its RSS read with
nothing loaded, the one collection loaded, its RSS read again: ``resident_bytes_per_vector`` = (loaded - fresh) / N,
``resident_method`` says so. Every index type of an N gets its own fresh server, so no earlier build's freed memory
hides in the figure. (The older RSS delta, loaded minus released in the same long-running server, went negative
after a first build; old rows keep it as ``rss_delta_bytes_per_vector_not_for_sizing``.) The server's own gauge
``milvus_querynode_entity_size`` is recorded beside it (``metrics_entity_size_bytes_per_vector``) but not used for
sizing: on 2.3.5 it is the same for every index type of a collection (HNSW and an unbuilt IVF_PQ report the same
bytes), i.e. an estimate from the raw field data, not the loaded index.

Ingest (issue 35), both paths at the same N, each timed from its first row handed over to every row searchable
(indexed, loaded, and counted by a Strong-consistency read):
- bulk: the N rows arrive in embedding-sized batches (256) and are staged as they come by
  ``retrieval.index.BulkWriter`` (the index job's writer), then ``retrieval.index.bulk_import`` imports the files
  and returns once the rows are indexed and visible. Recorded apart: staging, import (tasks completed), index
  build, load. ``ingest_bulk_rows_per_s`` = N / (staging + import + build + load).
- upsert: the same rows through ``ShardedIndex.upsert`` in 1,000-row calls until a Strong count sees all N
  (rows in growing segments are searched unindexed, so the build is not inside this window);
  ``upsert_indexed_s`` adds how long the server then took to index them.
Prints a capacity line: hours to load 300M rows at the measured bulk rate with 1, 8 and 32 ingest workers
(assumes each worker has its own import and index node, i.e. linear scaling: not measured here).
``--ingest-only`` skips the exact top-k and the query timing (ingest rows have ``search_params`` null).

The server binds every interface, so run it in a loopback-only namespace, niced (it uses both cores for hours
at 1M):

    nice -n 10 unshare -n sh -c 'ip link set lo up && exec .venv/bin/python benchmarks/index_scale.py'
    ... benchmarks/index_scale.py --sizes 20000 --indexes HNSW,IVF_SQ8 --out /tmp/x.json   # quick look
    ... benchmarks/index_scale.py --sizes 100000,300000,1000000 --indexes IVF_SQ8 --ingest-only   # issue 35

Rows go to ``benchmarks/results/index_scale.json`` (rewritten after every measured point, so a run stopped
part-way keeps what it measured) as ``{n, index, search_params, recall_at_10, p50_ms, p99_ms, bytes_per_vector,
disk_bytes_per_vector, build_s, resident_bytes_per_vector, ...}``. ``--no-upsert`` skips the upsert ingest (an hour
of index build at 1M that only the ingest rows need); ``--deadline HH:MM`` (UTC) caps every wait so the run ends by
then: an index not built in time is recorded with the rows it had indexed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from retrieval.index import BULK_ROWS_PER_FILE

DIM = 512
K = 10
BUILD = {
    "HNSW": {"M": 16, "efConstruction": 100},  # the index's default is 200: halved to fit 1M in the time here
    "IVF_SQ8": {"nlist": 1024},
    "IVF_PQ": {"nlist": 1024, "m": 64, "nbits": 8},
    "DISKANN": {},
}
SEARCH = {
    "HNSW": [{"ef": 64}, {"ef": 128}],
    "IVF_SQ8": [{"nprobe": 16}, {"nprobe": 64}],
    "IVF_PQ": [{"nprobe": 16}, {"nprobe": 64}],
    "DISKANN": [{"search_list": 100}],
}


def clustered(n: int, centres: np.ndarray, spread: float, rng: np.random.Generator) -> np.ndarray:
    """Unit vectors around ``centres`` (crops of one kind of figure cluster in embedding space)."""
    out = np.empty((n, centres.shape[1]), dtype=np.float32)
    for s in range(0, n, 50_000):
        m = min(50_000, n - s)
        x = centres[rng.integers(0, len(centres), m)]
        x = x + spread * rng.standard_normal((m, centres.shape[1])).astype(np.float32) / np.sqrt(centres.shape[1])
        out[s : s + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def exact(x: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    out = np.empty((len(q), k), dtype=np.int64)
    for s in range(0, len(q), 100):
        sims = q[s : s + 100] @ x.T
        part = np.argpartition(-sims, k, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(sims, part, axis=1), axis=1)
        out[s : s + 100] = np.take_along_axis(part, order, axis=1)
    return out


def sha(i: int) -> str:
    return f"{i:064x}"  # row i's primary key; the benchmark maps hits back to rows by parsing it


BATCH = 256  # rows per embedded batch handed to the bulk writer


def row(i: int, x: np.ndarray):
    from retrieval.index import IndexRow

    return IndexRow(sha256=sha(i), vector=x[i], kind="figure", doc_id=f"doc{i // 20}", row=i)  # ~20 crops per doc


def stage(x: np.ndarray, out_dir: Path, rows_per_file: int) -> dict[int, list[str]]:
    """The rows as the embedding stage hands them over: batch by batch into the index job's ``BulkWriter``."""
    from retrieval.index import BulkWriter

    with BulkWriter(str(out_dir), 1, rows_per_file) as w:
        for s in range(0, len(x), BATCH):
            w.add([row(i, x) for i in range(s, min(len(x), s + BATCH))])
    return w.files


def upsert_ingest(uri: str, x: np.ndarray, index: str, timeout: float) -> dict:
    """The same rows through ``ShardedIndex.upsert`` (1,000-row calls) until a Strong count sees them all; then
    flush (seals the growing segments) and wait for the server to index them."""
    from retrieval.index import IndexConfig, ShardedIndex

    n = len(x)
    with ShardedIndex(IndexConfig(uri, name=f"upsert_{n}", index_type=index, build_params=BUILD[index])) as ix:
        ix.drop()
        ix.ensure(DIM)
        t = time.perf_counter()
        deadline = time.monotonic() + timeout
        for s in range(0, n, 1000):
            ix.upsert([row(i, x) for i in range(s, min(n, s + 1000))])
        write_s = time.perf_counter() - t
        while ix.count_of(0, "Strong") < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"upserted rows not visible after {timeout}s")
            time.sleep(0.2)
        searchable_s = time.perf_counter() - t
        ix.flush()
        ix.wait_indexed(0, n, deadline)
        indexed_s = time.perf_counter() - t
        ix.drop()
    return {
        "upsert_index": index,
        "upsert_write_s": round(write_s, 1),
        "upsert_searchable_s": round(searchable_s, 1),
        "upsert_indexed_s": round(indexed_s, 1),
        "ingest_upsert_rows_per_s": round(n / searchable_s),
    }


def capacity(rate: float, rows: float = 300e6, workers: tuple[int, ...] = (1, 8, 32)) -> str:
    return f"300M rows at {rate:,.0f} rows/s per ingest worker: " + ", ".join(
        f"{rows / (rate * w) / 3600:,.1f} h with {w}" for w in workers
    )


def server_rss() -> int:
    """Resident bytes of the Milvus server this process started (its child processes)."""
    import psutil

    return sum(p.memory_info().rss for p in psutil.Process().children(recursive=True))


def settled_rss(wait_s: float = 60.0, every_s: float = 3.0) -> int:
    """Server RSS once it stops moving (two reads ``every_s`` apart within 1 %), at most ``wait_s``: a server
    that has just started or loaded still allocates for a few seconds."""
    last = server_rss()
    t = time.monotonic()
    while time.monotonic() - t < wait_s:
        time.sleep(every_s)
        now = server_rss()
        if abs(now - last) <= 0.01 * last:
            return now
        last = now
    return last


def restart(server) -> str:
    """Stop the started server gracefully (SIGTERM, up to 120 s) and start it again on the same data directory;
    returns its URI (the port may change)."""
    import subprocess

    if server.server_proc is not None:
        server.server_proc.terminate()
        try:
            server.server_proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pass
    server.stop()  # kills it if SIGTERM did not, closes the log files
    server.start()
    return f"http://127.0.0.1:{server.listen_port}"


def entity_size(server, collection_id: int) -> float | None:
    """The query node's ``milvus_querynode_entity_size`` gauge for one collection (bytes), from the server's
    Prometheus endpoint; None where it does not report it."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{server.webservice_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith("milvus_querynode_entity_size{") and f'collection_id="{collection_id}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def fresh_resident(server, name: str, n: int) -> tuple[str, dict]:
    """Resident memory of collection ``name`` (released) by a fresh server process: restart, RSS with nothing
    loaded, load, RSS again. Returns the server's URI and the fields for the row."""
    from pymilvus import MilvusClient

    uri = restart(server)
    client = MilvusClient(uri=uri)
    try:
        fresh = settled_rss()
        t = time.perf_counter()
        client.load_collection(name)
        load_s = time.perf_counter() - t
        loaded = settled_rss()
        cid = client.describe_collection(name)["collection_id"]
        gauge = entity_size(server, cid)
        for _ in range(5):  # the gauge appears a few seconds after the load on a fresh server
            if gauge is not None:
                break
            time.sleep(2)
            gauge = entity_size(server, cid)
    finally:
        client.close()
    return uri, {
        "resident_bytes_per_vector": round((loaded - fresh) / n, 1),
        "resident_method": "fresh server process: RSS after loading this one collection minus RSS with nothing loaded",
        "server_rss_fresh_gib": round(fresh / 2**30, 3),
        "server_rss_loaded_gib": round(loaded / 2**30, 3),
        "fresh_load_s": round(load_s, 1),
        "metrics_entity_size_bytes_per_vector": None if gauge is None else round(gauge / n, 1),
    }


def du(path: str) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def paired_latencies(
    fns: tuple, queries: np.ndarray
) -> tuple[tuple[list[list[str]], list[list[str]]], tuple[np.ndarray, np.ndarray]]:
    """Each query through both ``fns`` back to back, the order alternating per query, so a load that changes
    during the run hits both sides alike (timed one after the other, the two sides saw different loads)."""
    found: tuple[list, list] = ([], [])
    ms: tuple[list, list] = ([], [])
    for i, q in enumerate(queries):
        for side in (0, 1) if i % 2 == 0 else (1, 0):
            t = time.perf_counter()
            found[side].append(fns[side](q))
            ms[side].append((time.perf_counter() - t) * 1000)
    return found, (np.array(ms[0]), np.array(ms[1]))


def recall(found: list[list[str]], truth: np.ndarray) -> float:
    return sum(len(set(f) & {sha(int(j)) for j in t}) for f, t in zip(found, truth)) / truth.size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100000,300000,1000000")
    ap.add_argument("--indexes", default="HNSW,IVF_SQ8,IVF_PQ,DISKANN")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--clusters", type=int, default=2000)
    ap.add_argument("--spread", type=float, default=1.0, help="cluster noise norm relative to the centre")
    ap.add_argument("--build-timeout", type=float, default=5400)
    ap.add_argument("--deadline", default=None, help="HH:MM UTC today: no wait (import, build, load) runs past it")
    ap.add_argument("--no-upsert", action="store_true", help="skip the upsert ingest (only ingest rows need it)")
    ap.add_argument("--out", default="benchmarks/results/index_scale.json")
    ap.add_argument("--uri", default=None, help="an existing server (default: start the PyPI milvus server here)")
    ap.add_argument("--ingest-only", action="store_true", help="ingest rates only (no exact top-k, no queries)")
    ap.add_argument("--rows-per-file", type=int, default=BULK_ROWS_PER_FILE, help="bulk writer's file size")
    ap.add_argument(
        "--build-parallel",
        type=int,
        default=4,
        help="index builds the started server runs at once (indexNode.scheduler.buildParallel; its default is 1)",
    )
    args = ap.parse_args()

    from pymilvus import MilvusClient

    from retrieval.index import IndexConfig, ShardedIndex, bulk_import, search_params

    end = None
    if args.deadline:
        import datetime as dt

        hh, mm = (int(v) for v in args.deadline.split(":"))
        now = dt.datetime.now(dt.UTC)
        end = time.time() + (now.replace(hour=hh, minute=mm, second=0, microsecond=0) - now).total_seconds()

    def budget() -> float:
        """Seconds the next wait may take: the build timeout, or less to end by ``--deadline``."""
        return args.build_timeout if end is None else max(1.0, min(args.build_timeout, end - time.time()))

    base = tempfile.mkdtemp(prefix="index-scale-")
    server = None
    if args.uri is None:
        from milvus import default_server as server

        server.set_base_dir(os.path.join(base, "milvus"))
        server.config.set("indexNode.scheduler.buildParallel", args.build_parallel)
        server.config.set("queryNode.enableDisk", "true")  # the query node loads DiskANN indexes only with it
        server.start()
        uri = f"http://127.0.0.1:{server.listen_port}"
    else:
        uri = args.uri
    out = Path(args.out)
    rows: list[dict] = json.loads(out.read_text()) if out.exists() else []

    def record(row: dict) -> None:
        rows[:] = [
            r
            for r in rows
            if (r["n"], r["index"], r.get("search_params")) != (row["n"], row["index"], row.get("search_params"))
        ]
        rows.append(row)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            json.dumps(sorted(rows, key=lambda r: (r["n"], r["index"], json.dumps(r.get("search_params")))), indent=1)
        )
        print(json.dumps(row), flush=True)

    rng = np.random.default_rng(0)
    centres = rng.standard_normal((args.clusters, DIM)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    queries = clustered(args.queries, centres, args.spread, np.random.default_rng(1))
    try:
        for n in [int(s) for s in args.sizes.split(",")]:
            t = time.perf_counter()
            x = clustered(n, centres, args.spread, np.random.default_rng(100 + n))
            truth = None if args.ingest_only else exact(x, queries, K)
            print(f"N={n}: data (+ exact top-{K}) in {time.perf_counter() - t:.1f}s", flush=True)
            up: dict = {}
            if not args.no_upsert:
                up = upsert_ingest(uri, x, args.indexes.split(",")[0], budget())
                print(f"N={n}: upsert {json.dumps(up)}", flush=True)
            for k_index, index in enumerate(args.indexes.split(",")):
                first = k_index == 0
                name = f"scale_{n}_{index.lower()}"
                cfg = IndexConfig(uri, name=name, index_type=index, build_params=BUILD[index])
                staged = Path(base) / f"bulk-{n}-{index}"
                started = time.perf_counter()
                try:
                    with ShardedIndex(cfg) as ix:
                        ix.drop()
                        ix.ensure(DIM)  # creates the collection with its index; bulk-imported segments get built
                        disk0 = du(base)
                        t = time.perf_counter()
                        files = stage(x, staged, args.rows_per_file)
                        stage_s = time.perf_counter() - t
                        done = bulk_import(ix, files, timeout_s=budget())
                        total_s = time.perf_counter() - t
                        shutil.rmtree(staged, ignore_errors=True)
                        ing = {
                            "ingest_bulk_rows_per_s": round(n / total_s),
                            "bulk_files": done.files,
                            "bulk_stage_s": round(stage_s, 1),
                            "bulk_import_s": round(done.import_s, 1),
                            "bulk_build_s": round(done.indexed_s - done.import_s, 1),
                            "bulk_load_s": round(done.searchable_s - done.indexed_s, 1),
                            "bulk_searchable_s": round(total_s, 1),
                            "bulk_import_only_rows_per_s": round(n / (stage_s + done.import_s)),
                            "build_parallel": args.build_parallel,
                            "load_avg_1m": round(os.getloadavg()[0], 2),
                            **up,
                        }
                        if up:
                            ing["bulk_over_upsert"] = round(n / total_s / up["ingest_upsert_rows_per_s"], 2)
                        print(capacity(n / total_s), flush=True)
                        if args.ingest_only:
                            record({"n": n, "index": index, "build_params": BUILD[index], "search_params": None, **ing})
                            ix.drop()
                            continue
                        build_s = done.indexed_s - done.import_s
                        ix.client.release_collection(name)
                        disk = du(base) - disk0
                    if server is not None:
                        uri, mem = fresh_resident(server, name, n)
                    else:
                        mem = {"resident_bytes_per_vector": None, "resident_method": "not measured (--uri server)"}
                    print(f"N={n} {index}: {json.dumps(mem)}", flush=True)
                    cfg = IndexConfig(uri, name=name, index_type=index, build_params=BUILD[index])
                    with ShardedIndex(cfg) as ix:
                        for sp in SEARCH[index]:
                            # Bounded: a serving read. Strong waits for the server's next time tick (~200 ms
                            # per query on an idle 2.3 server), which measures the clock, not the index.
                            ix.config = cfg = IndexConfig(
                                uri,
                                name=name,
                                index_type=index,
                                build_params=BUILD[index],
                                search_params=sp,
                                consistency="Bounded",
                            )
                            direct = MilvusClient(uri=uri)
                            params = search_params(index, "IP", K, sp)

                            def raw(q, direct=direct, params=params, name=name):
                                res = direct.search(
                                    name,
                                    data=[q.tolist()],
                                    limit=K,
                                    output_fields=[
                                        "caption",
                                        "context",
                                        "kind",
                                        "doc_id",
                                        "page_index",
                                        "source",
                                        "row",
                                        "quality",
                                    ],
                                    search_params=params,
                                    anns_field="vector",
                                    consistency_level="Bounded",
                                )
                                return [h["id"] for h in res[0]]

                            def layer(q, ix=ix):
                                return [h.sha256 for h in ix.search(q, k=K)[0]]

                            la0 = os.getloadavg()[0]
                            (ours, raw_found), (ours_ms, raw_ms) = paired_latencies((layer, raw), queries)
                            direct.close()
                            record(
                                {
                                    "n": n,
                                    "index": index,
                                    "build_params": BUILD[index],
                                    "search_params": sp,
                                    "recall_at_10": round(recall(ours, truth), 4),
                                    "recall_at_10_direct": round(recall(raw_found, truth), 4),
                                    "p50_ms": round(float(np.percentile(ours_ms, 50)), 3),
                                    "p99_ms": round(float(np.percentile(ours_ms, 99)), 3),
                                    "direct_p50_ms": round(float(np.percentile(raw_ms, 50)), 3),
                                    "direct_p99_ms": round(float(np.percentile(raw_ms, 99)), 3),
                                    "layer_overhead_p50": round(
                                        float(np.percentile(ours_ms, 50) / np.percentile(raw_ms, 50)), 3
                                    ),
                                    **mem,
                                    "server_rss_after_queries_gib": round(server_rss() / 2**30, 3),
                                    "first_index_of_n": first,
                                    "disk_bytes_per_vector": round(disk / n, 1),
                                    "build_s": round(build_s, 1),
                                    **ing,
                                    "load_avg_1m_queries": [round(la0, 2), round(os.getloadavg()[0], 2)],
                                    "shards_num": cfg.shards_num,
                                    "consistency": "Bounded",
                                    "queries": len(queries),
                                }
                            )
                        ix.drop()
                except Exception as e:  # an index type this server cannot build (in time) is a result too
                    err = {"n": n, "index": index, "build_params": BUILD[index], "error": f"{type(e).__name__}: {e}"}
                    err["elapsed_s"] = round(time.perf_counter() - started, 1)
                    err["load_avg_1m"] = round(os.getloadavg()[0], 2)
                    try:
                        with ShardedIndex(cfg) as ix:
                            d = ix.client.describe_index(name, "vector")  # progress: rows indexed by now
                            err["indexed_rows"], err["total_rows"] = d.get("indexed_rows"), d.get("total_rows")
                            ix.drop()
                    except Exception as e2:  # noqa: BLE001 - the server itself may be what failed
                        err["cleanup_error"] = f"{type(e2).__name__}: {e2}"[:300]
                    record(err)
                finally:
                    shutil.rmtree(staged, ignore_errors=True)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
