"""Bounded loopback load test of the search service and the agentic gateway: N concurrent clients for a fixed time.

    python benchmarks/load_services.py [--clients 16] [--seconds 10] [--only search|gateway]

- search: ``retrieval.service.create_app`` over a real Milvus Lite index of 24 generated crops (the test suite's
  fixture shards) with the tiny CLIP, captioner and reranker (``scifolio models tiny``'s retrieval area); each
  client posts text queries (1 in 8 hostile: ``k`` over the limit, an over-long query, a body that is not JSON).
- gateway: ``Guard(build_app(Gateway))`` with API keys over a scripted engine (``--reply-tokens`` tokens at
  ``--step-ms`` a step, batched over the running requests like a real engine); each client is one session
  (under its key's prefix) making multi-turn Chat Completions calls; 1 in 8 is hostile (oversized body,
  ``max_tokens`` over the limit, another prefix's session, no key).
Both run under uvicorn on 127.0.0.1 in this process; clients are asyncio ``httpx`` clients.

Reported per service: requests, answered (2xx), refused (4xx/503, each with a reason in the body), errors (5xx),
lost (no HTTP answer), p50/p99 latency of the answered ones. Nothing may be lost: the last line is
``errors: N, lost: N`` summed over both services.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "retrieval"))

WORDS = ["red", "green", "blue", "circle", "square", "phase", "diagram", "plot", "table", "figure", "yellow"]


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


async def drive(url: str, clients: int, seconds: float, make, timeout: float = 30.0) -> dict:
    """``make(client_index, call_index) -> (method, path, kwargs)``; every call is classified by its answer."""
    import httpx

    stats: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    lat: list[float] = []
    deadline = time.monotonic() + seconds

    async def one(i: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=timeout) as c:
            n = 0
            while time.monotonic() < deadline:
                method, path, kw = make(i, n)
                n += 1
                t0 = time.monotonic()
                try:
                    r = await c.request(method, path, **kw)
                except httpx.HTTPError as e:
                    stats["lost"] += 1
                    reasons[f"lost: {type(e).__name__}"] += 1
                    continue
                if r.status_code < 300:
                    stats["answered"] += 1
                    lat.append(time.monotonic() - t0)
                elif r.status_code < 500 or r.status_code == 503:
                    stats["refused"] += 1
                    body = r.text
                    has_reason = any(k in body for k in ('"detail"', '"message"', '"error"'))
                    reasons[f"{r.status_code}{'' if has_reason else ' WITHOUT A REASON'}"] += 1
                    if not has_reason:
                        stats["lost"] += 1
                else:
                    stats["errors"] += 1
                    reasons[f"{r.status_code}: {r.text[:120]}"] += 1

    t0 = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(clients)))
    wall = time.monotonic() - t0
    n = sum(stats[k] for k in ("answered", "refused", "errors", "lost"))
    return {
        "requests": n,
        "answered": stats["answered"],
        "refused": stats["refused"],
        "errors": stats["errors"],
        "lost": stats["lost"],
        "p50_ms": round(pct(lat, 0.5) * 1000, 1),
        "p99_ms": round(pct(lat, 0.99) * 1000, 1),
        "rps": round(stats["answered"] / wall, 1),
        "reasons": dict(reasons),
    }


def search_service(tmp: Path):
    from retrieval_fakes import COLORS, make_rows

    from formats.shards import list_shards, write_shard
    from pipelines.tiny import write_area
    from retrieval.crops import iter_crops
    from retrieval.embed import EmbedConfig, LoadedEmbedder, STEmbedder
    from retrieval.index import IndexConfig, IndexRow, ShardedIndex
    from retrieval.search import SearchConfig, load_searcher
    from retrieval.service import ServeConfig, create_app

    models = write_area(tmp / "tiny", "retrieval")
    out = tmp / "out"
    names = list(COLORS)
    write_shard(out / "shards" / "shard-00000-of-00002.parquet", make_rows("doc-a", names, "circle"))
    write_shard(out / "shards" / "shard-00001-of-00002.parquet", make_rows("doc-b", names, "square"))
    emb = LoadedEmbedder.load(STEmbedder(EmbedConfig(models["retrieval-clip"])))
    crops = [c for p in list_shards(out) for c in iter_crops(p, out)]
    cfg = IndexConfig(uri=str(tmp / "index.db"), name="crops", n_shards=3)
    with ShardedIndex(cfg) as ix:
        ix.ensure(emb.dim)
        ix.upsert([IndexRow.from_crop(c, v) for c, v in zip(crops, emb.encode_images([c.png for c in crops]))])
    s = load_searcher(
        ShardedIndex(cfg),
        models["retrieval-clip"],
        models["retrieval-captioner"],
        models["retrieval-reranker"],
        config=SearchConfig(candidates=12),
    )
    return s, create_app(s, ServeConfig(shards=str(out))), len(crops)


def search_call(i: int, n: int):
    rng = random.Random(i * 100003 + n)
    q = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4)))
    kind = n % 8
    if kind == 7:
        bad = rng.choice(["k", "long", "json"])
        if bad == "k":
            return "POST", "/api/search/text", {"json": {"query": q, "k": 10_000}}
        if bad == "long":
            return "POST", "/api/search/text", {"json": {"query": "x" * 5000}}
        return "POST", "/api/search/text", {"content": b"{not json", "headers": {"content-type": "application/json"}}
    return "POST", "/api/search/text", {"json": {"query": q, "k": rng.choice([4, 8]), "rerank": kind == 3}}


def gateway_service(reply_tokens: int, step_ms: float):
    from posttrain.agentic.gateway import Gateway, GatewayConfig, build_app
    from posttrain.agentic.guard import GatewayLimits, Guard
    from posttrain.rollout.engines.scripted import ScriptedTokenEngine
    from posttrain.tiny.agentic import build_tokenizer

    tok = build_tokenizer()
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    reply = tok.encode("ok " * reply_tokens, add_special_tokens=False)[:reply_tokens] + [im_end]
    engine = ScriptedTokenEngine(lambda req: reply, capacity=256, step_delay_s=step_ms / 1000)
    gw = Gateway(engine, tok, GatewayConfig(default_max_tokens=64, max_context=8192))
    keys = {f"key-{k}": f"team-{k}:" for k in range(4)}
    return gw, Guard(build_app(gw), keys, GatewayLimits(max_body_bytes=256 * 1024, max_messages=64, max_tokens=512))


def gateway_call_factory():
    history: dict[int, list[dict]] = {}

    def call(i: int, n: int):
        key, team = f"key-{i % 4}", f"team-{i % 4}:"
        h = {"Authorization": f"Bearer {key}"}
        kind = n % 8
        if kind == 7:
            bad = ("big", "budget", "other", "nokey")[(n // 8) % 4]
            msgs = [{"role": "user", "content": "hi"}]
            if bad == "big":
                return (
                    "POST",
                    "/v1/chat/completions",
                    {"json": {"model": "m", "messages": [{"role": "user", "content": "x" * 300_000}]}, "headers": h},
                )
            if bad == "budget":
                return (
                    "POST",
                    "/v1/chat/completions",
                    {"json": {"model": "m", "messages": msgs, "max_tokens": 100_000}, "headers": h},
                )
            if bad == "other":
                other = f"team-{(i + 1) % 4}:s{i}"
                return (
                    "POST",
                    f"/s/{other}/v1/chat/completions",
                    {"json": {"model": "m", "messages": msgs}, "headers": h},
                )
            return "POST", "/v1/chat/completions", {"json": {"model": "m", "messages": msgs}}
        msgs = history.setdefault(i, [{"role": "system", "content": "You are terse."}])
        if len(msgs) > 12:  # a new episode
            del msgs[1:]
        msgs.append({"role": "user", "content": f"turn {n} of client {i}"})
        body = {"model": "m", "messages": list(msgs), "max_tokens": 64}
        msgs.append({"role": "assistant", "content": "ok " * 8})
        return "POST", f"/s/{team}c{i}/v1/chat/completions", {"json": body, "headers": h}

    return call


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--only", choices=["search", "gateway"], default=None)
    ap.add_argument("--reply-tokens", type=int, default=10)
    ap.add_argument("--step-ms", type=float, default=5.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    from posttrain.agentic.gateway import ServerThread

    results = {}
    with tempfile.TemporaryDirectory(prefix="load-") as tmp:
        if args.only in (None, "search"):
            searcher, app, n_crops = search_service(Path(tmp))
            with ServerThread(app) as url:
                results["search"] = asyncio.run(drive(url, args.clients, args.seconds, search_call))
            searcher.index.close()
            results["search"]["index"] = f"Milvus Lite, {n_crops} crops, 3 shards, tiny CLIP + captioner + reranker"
        if args.only in (None, "gateway"):
            gw, app = gateway_service(args.reply_tokens, args.step_ms)
            with ServerThread(app) as url:
                results["gateway"] = asyncio.run(drive(url, args.clients, args.seconds, gateway_call_factory()))
            results["gateway"]["engine"] = f"scripted, {args.reply_tokens} tokens at {args.step_ms} ms a step"
    print(f"{args.clients} concurrent clients for {args.seconds:g} s per service, loopback")
    for name, r in results.items():
        print(
            f"{name:<8} requests {r['requests']:>6}  answered {r['answered']:>6}  refused {r['refused']:>5}  "
            f"errors {r['errors']:>3}  lost {r['lost']:>3}  p50 {r['p50_ms']:>7} ms  p99 {r['p99_ms']:>7} ms  "
            f"{r['rps']} answered/s"
        )
        print(f"         refusals and losses by reason: {json.dumps(r['reasons'])}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    errors = sum(r["errors"] for r in results.values())
    lost = sum(r["lost"] for r in results.values())
    print(f"errors: {errors}, lost: {lost}")
    return 0 if errors == lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
