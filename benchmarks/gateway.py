"""Gateway overhead: time per model call through the gateway vs calling the engine directly (issue 13).

Engine: ``ScriptedTokenEngine`` emitting ``--reply-tokens`` tokens with ``--step-ms`` per decode step
(default 10 × 5 ms ≈ 50 ms per call), batched over every running request like a real engine.

- direct: ``EngineDriver.generate(Request(prompt_ids))`` from ``--sessions`` concurrent asyncio tasks
  (the same driver the gateway uses: submit + step until finished; no HTTP, no template, no store).
- gateway: the same number of concurrent sessions, each an ``openai.AsyncOpenAI`` client, in
  ``--client-procs`` client processes (harnesses are separate processes) over real HTTP to uvicorn on 127.0.0.1 (a thread of this process), multi-turn conversations (``--turns`` calls each; every
  reply goes back into the history), so each call pays SDK + HTTP + template rendering + prefix match +
  delta tokenisation + capture + SQLite write + protocol envelope.

Sessions are grouped (``g{k}:{r}``, 8 per group) and the first two replies of a group are identical,
so the trace store branches: it reports stored tokens and bytes vs a flat log of every call.

    PYTHONPATH=. python benchmarks/gateway.py                 # targets: p50 ≤ 1.1×, p99 ≤ 1.5× direct
    PYTHONPATH=. python benchmarks/gateway.py --client raw    # the same JSON without the SDK: the gateway alone
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import zlib
from pathlib import Path

from posttrain.agentic.driver import EngineDriver
from posttrain.agentic.gateway import Gateway, GatewayConfig, ServerThread, build_app
from posttrain.rollout.engines.scripted import ScriptedTokenEngine
from posttrain.rollout.types import Request, SamplingParams
from posttrain.tiny.agentic import build_tokenizer


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def make_script(tok, n_tokens: int):
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    words = tok.encode(" the tests pass and the code is fixed now ok", add_special_tokens=False)

    seen: dict[str, int] = {}

    def script(req: Request) -> list[int]:
        sid = req.group_id
        turn = seen[sid] = seen.get(sid, -1) + 1
        r = (sid.split(":") + ["0"])[1]
        salt = 0 if turn < 2 else zlib.crc32(f"{r}/{turn}".encode()) % 7  # groups share their first 2 replies
        body = [(words[(i + salt) % len(words)]) for i in range(n_tokens - 1)]
        return body + [im_end]

    return script, im_end


async def direct(args, tok) -> list[float]:
    script, im_end = make_script(tok, args.reply_tokens)
    engine = ScriptedTokenEngine(script, capacity=args.sessions, step_delay_s=args.step_ms / 1000)
    driver = EngineDriver(engine)
    prompt = tok.encode("<|im_start|>user\nFix the bug please.<|im_end|>\n<|im_start|>assistant\n")
    lat: list[float] = []

    async def session(k: int) -> None:
        ids = list(prompt)
        for t in range(args.turns):
            req = Request(f"d{k}/{t}", ids, SamplingParams(max_new_tokens=64, stop_token_ids=(im_end,)), f"d{k}")
            t0 = time.perf_counter()
            traj = await driver.generate(req)
            lat.append(time.perf_counter() - t0)
            ids = ids + traj.token_ids + tok.encode("\n<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n")

    await asyncio.gather(*(session(k) for k in range(args.sessions)))
    return lat


def _client_process(url: str, sessions: list[int], turns: int, client_kind: str, conn) -> None:
    """The harness side, in its own process (as real harnesses are): concurrent sessions, latencies and CPU out.

    ``sdk``: ``openai.AsyncOpenAI`` (what harnesses use); ``raw``: the same JSON over ``httpx`` without the
    SDK, which isolates the gateway's own cost from the SDK's request/response processing."""
    import httpx
    import openai

    lat: list[float] = []
    cpu: list[float] = []

    async def session(k: int, ready: asyncio.Barrier) -> None:
        sid = f"g{k // 8}:{k % 8}"
        http = httpx.AsyncClient()
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=sid, max_retries=0, http_client=http)
        msgs = [{"role": "system", "content": "You fix code."}, {"role": "user", "content": "Fix the bug please."}]
        await client.models.list()  # connection warm-up, not timed
        headers = {"authorization": f"Bearer {sid}"}
        if await ready.wait() == 0:  # every session is connected: CPU is counted from here (not client set-up)
            cpu.append(time.process_time())
        for _ in range(turns):
            t0 = time.perf_counter()
            if client_kind == "sdk":
                r = await client.chat.completions.create(model="m", messages=msgs)
                content = r.choices[0].message.content
            else:
                resp = await http.post(
                    url + "/v1/chat/completions", json={"model": "m", "messages": msgs}, headers=headers
                )
                content = resp.json()["choices"][0]["message"]["content"]
            lat.append(time.perf_counter() - t0)
            msgs += [{"role": "assistant", "content": content}, {"role": "user", "content": "ok"}]

    async def main() -> None:
        ready = asyncio.Barrier(len(sessions))
        await asyncio.gather(*(session(k, ready) for k in sessions))
        cpu.append(time.process_time())

    asyncio.run(main())
    conn.send((lat, cpu[-1] - cpu[0]))
    conn.close()


def through_gateway(args, tok, trace_path: Path) -> tuple[list[float], Gateway, float, float]:
    """Latencies, the gateway, and CPU seconds spent by the clients and by this (server + engine) process."""
    import multiprocessing as mp

    script, _ = make_script(tok, args.reply_tokens)
    engine = ScriptedTokenEngine(script, capacity=args.sessions, step_delay_s=args.step_ms / 1000)
    gw = Gateway(engine, tok, GatewayConfig(trace_path=str(trace_path), default_max_tokens=64))
    ctx = mp.get_context("spawn")
    with ServerThread(build_app(gw)) as url:
        procs, pipes = [], []
        for c in range(args.client_procs):
            recv, send = ctx.Pipe(duplex=False)
            mine = list(range(c, args.sessions, args.client_procs))
            if not mine:
                continue
            procs.append(ctx.Process(target=_client_process, args=(url, mine, args.turns, args.client, send)))
            pipes.append(recv)
        for proc in procs:
            proc.start()
        cpu0 = time.process_time()
        got = [recv.recv() for recv in pipes]
        server_cpu = time.process_time() - cpu0
        for proc in procs:
            proc.join()
    return [x for lat, _ in got for x in lat], gw, sum(c for _, c in got), server_cpu


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=32)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--reply-tokens", type=int, default=10)
    p.add_argument("--step-ms", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--client-procs", type=int, default=4, help="harness processes the sessions are spread over (1 = all in one)"
    )
    p.add_argument(
        "--client",
        choices=("sdk", "raw"),
        default="sdk",
        help="sdk: openai.AsyncOpenAI (the issue's measure); raw: the same JSON over httpx (the gateway's own cost)",
    )
    a = p.parse_args(argv)
    tok = build_tokenizer()
    cores = len(os.sched_getaffinity(0))
    rows = []
    for rnd in range(a.rounds):
        cpu0 = time.process_time()
        d = asyncio.run(direct(a, tok))
        direct_cpu = time.process_time() - cpu0
        with tempfile.TemporaryDirectory() as tmp:
            g, gw, client_cpu, server_cpu = through_gateway(a, tok, Path(tmp) / "traces.sqlite")
            store = gw.store
            store.db.commit()
            store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            db_bytes = sum(os.path.getsize(f) for f in Path(tmp).iterdir())
            flat = [
                {"input_ids": store.call_input_ids(c), "output_ids": store.call_output_ids(c), "logprobs": n.logprobs}
                for c in store.calls
                for n in [store.nodes[store.calls[c]["response_node"]]]
            ]
            flat_bytes = len("\n".join(json.dumps(x) for x in flat).encode())
            stored, flat_tok = store.stored_tokens(), store.flat_tokens()
            store.close()
        row = {
            "round": rnd,
            "direct_p50_ms": 1000 * statistics.median(d),
            "direct_p99_ms": 1000 * pct(d, 0.99),
            "gateway_p50_ms": 1000 * statistics.median(g),
            "gateway_p99_ms": 1000 * pct(g, 0.99),
            "calls": len(g),
            # CPU per call: the clients (SDK or raw httpx), and the gateway process minus what the same engine
            # and driver cost in the direct run (so: HTTP server, parsing, template, match, capture, store).
            "client_cpu_ms_per_call": 1000 * client_cpu / len(g),
            "gateway_cpu_ms_per_call": 1000 * (server_cpu - direct_cpu) / len(g),
            "engine_cpu_ms_per_call": 1000 * direct_cpu / len(d),
            "stored_tokens": stored,
            "flat_tokens": flat_tok,
            "sqlite_bytes": db_bytes,
            "flat_jsonl_bytes": flat_bytes,
        }
        row["p50_ratio"] = row["gateway_p50_ms"] / row["direct_p50_ms"]
        row["p99_ratio"] = row["gateway_p99_ms"] / row["direct_p99_ms"]
        # Closed loop: each session issues its next call when the last returns, so the offered load at the
        # direct latency is sessions / p50 calls per second; at that rate the added CPU needs this many cores.
        per_call_cpu_s = (client_cpu + server_cpu) / len(g)
        row["cores_needed_at_direct_rate"] = a.sessions / (row["direct_p50_ms"] / 1000) * per_call_cpu_s
        rows.append(row)
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    best = min(rows, key=lambda r: r["p50_ratio"])
    med = sorted(rows, key=lambda r: r["p50_ratio"])[len(rows) // 2]
    print(
        f"median round: direct p50 {med['direct_p50_ms']:.1f} ms p99 {med['direct_p99_ms']:.1f} ms | gateway p50 "
        f"{med['gateway_p50_ms']:.1f} ms p99 {med['gateway_p99_ms']:.1f} ms | ratio p50 {med['p50_ratio']:.3f}x "
        f"p99 {med['p99_ratio']:.3f}x (best round p50 {best['p50_ratio']:.3f}x) | store {med['stored_tokens']} vs "
        f"flat {med['flat_tokens']} tokens"
    )
    print(
        f"CPU per call ({a.client} client): client {med['client_cpu_ms_per_call']:.2f} ms, gateway "
        f"{med['gateway_cpu_ms_per_call']:.2f} ms, engine+driver {med['engine_cpu_ms_per_call']:.2f} ms; "
        f"{a.sessions} sessions at the direct rate need {med['cores_needed_at_direct_rate']:.2f} cores "
        f"for client + server (this machine: {cores})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
