"""``scifolio posttrain memdec`` (alias: ``scifolio memdec``): the Memory Decoder stages (posttrain/memdec) with the datastore in sharded Milvus collections
(retrieval/vectors.py; Milvus Lite file by default, a server URI with ``--set store.uri=http://host:19530``).

    scifolio memdec prepare --config debug --work-dir out/memdec   # synthetic data + tiny base on general text
    scifolio memdec build-datastore --config debug --work-dir out/memdec
    scifolio memdec train --config debug --work-dir out/memdec [--resume]
    scifolio memdec train-router --config debug --work-dir out/memdec
    scifolio memdec eval --config debug --work-dir out/memdec [--check]
    scifolio memdec all --config debug --work-dir out/memdec       # every stage in order

Any config field: ``--set memory.steps=50 --set store.index_type=FLAT``. The Milvus server binds every
interface: on a shared host run it inside a loopback-only namespace.
"""

from __future__ import annotations

import argparse
import json
import sys

from pipelines.cli.options import add_set, recipe_config

STAGES = ("prepare", "build-datastore", "train", "train-router", "eval", "all")


def register(subparsers: argparse._SubParsersAction, alias: bool = True) -> None:
    """``scifolio posttrain memdec`` (the post-training stage) and ``scifolio memdec`` (its documented alias)."""
    from posttrain.memdec.config import RECIPES, MemdecConfig

    p = subparsers.add_parser(
        "memdec",
        help="Memory Decoder: datastore, memory, router, fused decoding, eval"
        + (" (alias of `scifolio posttrain memdec`)" if alias else ""),
        description="Memory Decoder stages (SPEC §C9). Run them in order; each reads what the previous wrote.",
    )
    sub = p.add_subparsers(dest="memdec_command", metavar="STAGE", required=True)
    helps = {
        "prepare": "generate the synthetic domain/general sets and pre-train the tiny base on general text",
        "build-datastore": "encode the domain corpus into Milvus (resumable) and precompute Eq 1 kNN targets",
        "train": "train the memory model on the kNN targets (Eq 2), checkpoint/resume",
        "train-router": "train the λ router with base and memory frozen (Eq 4)",
        "eval": "held-out PPL of base / memory / fused and mean λ on domain and general text",
        "all": "every stage in order",
    }
    for stage in STAGES:
        s = sub.add_parser(stage, help=helps[stage], description=helps[stage])
        s.add_argument("--config", default="debug", choices=sorted(RECIPES), help="named recipe (posttrain/memdec)")
        s.add_argument(
            "--work-dir", default=MemdecConfig.work_dir, help="where the run reads and writes everything (config)"
        )
        add_set(s, "memory.steps=50 or store.uri=http://127.0.0.1:19530")
        s.add_argument("--quiet", action="store_true", help="no progress bars")
        s.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
        if stage in ("train", "all"):
            s.add_argument(
                "--resume", action="store_true", help="continue the memory from <work-dir>/memory/checkpoint/state.pt"
            )
        if stage in ("eval", "all"):
            s.add_argument("--check", action="store_true", help="exit 1 when a claim of the experiment fails")
        if stage in ("build-datastore", "all"):
            s.add_argument("--fresh", action="store_true", help="drop the collections and the cursor first")
        s.set_defaults(func=run_memdec)


def open_store(cfg):
    """The retrieval store behind posttrain's KeyValueStore protocol."""
    from retrieval.vectors import ShardedVectorStore, VectorStoreConfig

    s = cfg.store
    return ShardedVectorStore(
        VectorStoreConfig(
            uri=cfg.store_uri,
            name=s.name,
            n_shards=s.n_shards,
            shards_num=s.shards_num,
            index_type=s.index_type,
            metric=s.metric,
        )
    )


def run_memdec(args: argparse.Namespace) -> int:
    from pathlib import Path

    from posttrain.memdec import run
    from posttrain.memdec.config import RECIPES

    if (cfg := recipe_config(RECIPES, args, given={"work_dir": args.work_dir})) is None:
        return 0
    stage = args.memdec_command
    todo = STAGES[:-1] if stage == "all" else (stage,)
    try:
        for st in todo:
            if st == "prepare":
                out = run.prepare(cfg, quiet=args.quiet)
            elif st == "build-datastore":
                with open_store(cfg) as store:
                    if args.fresh:
                        store.drop()
                        (Path(cfg.work_dir) / "datastore_cursor.json").unlink(missing_ok=True)
                    out = run.build(cfg, store, quiet=args.quiet)
            elif st == "train":
                out = run.train(cfg, resume=args.resume, quiet=args.quiet)
            elif st == "train-router":
                out = run.fit_router(cfg, quiet=args.quiet)
            else:
                report = run.run_eval(cfg)
                print(report.table())
                if args.check and not report.ok():
                    return 1
                continue
            print(f"{st}: {json.dumps(out)}")
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
