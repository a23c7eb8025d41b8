"""Streaming through the gateway: time to first text delta vs the whole call, and what incremental decoding costs.

Engine: ``ScriptedTokenEngine`` emitting ``--reply-tokens`` tokens at ``--step-ms`` per decode step, batched over
all running requests. ``--sessions`` concurrent ``openai.AsyncOpenAI`` clients (asyncio tasks in this process) over
real HTTP to uvicorn on 127.0.0.1 (a thread of this process), ``--turns`` chat calls each, every call streamed
(``stream=True``) and, in a second pass, not streamed. Before incremental streaming, a streamed call's first delta
came when the engine had finished, i.e. TTFT = the whole call (the non-streamed latency below).

Then the gateway's own text work per streamed reply of ``--decode-lengths`` tokens: decoding the whole output again
at every step (exact for any tokenizer, O(n²)) vs decoding only the ids past the last character boundary (what it
does for byte-level BPE tokenizers, O(n)).

    PYTHONPATH=. python benchmarks/gateway_stream.py
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import openai

from posttrain.agentic.gateway import Gateway, GatewayConfig, IncrementalDecoder, ServerThread, build_app
from posttrain.rollout.engines.scripted import ScriptedTokenEngine
from posttrain.tiny.agentic import build_tokenizer

WORDS = " the tests pass and the code is fixed now, naïve café → 数学 ok"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


async def calls(url: str, args, stream: bool) -> tuple[list[float], list[float]]:
    """(time to first text delta, whole call) per call, seconds."""
    ttft, total = [], []

    async def session(k: int) -> None:
        oa = openai.AsyncOpenAI(base_url=url + "/v1", api_key=f"{'s' if stream else 'n'}{k}", max_retries=0)
        msgs = [{"role": "user", "content": "Fix the bug please."}]
        for _ in range(args.turns):
            t0 = time.perf_counter()
            if stream:
                first, parts = None, []
                async for c in await oa.chat.completions.create(model="m", messages=msgs, stream=True):
                    if c.choices and c.choices[0].delta.content:
                        first = first or time.perf_counter() - t0
                        parts.append(c.choices[0].delta.content)
                text = "".join(parts)
            else:
                r = await oa.chat.completions.create(model="m", messages=msgs)
                text = r.choices[0].message.content
                first = time.perf_counter() - t0
            total.append(time.perf_counter() - t0)
            ttft.append(first)
            msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": "ok"}]

    await asyncio.gather(*(session(k) for k in range(args.sessions)))
    return ttft, total


def decode_cost(gw: Gateway, lengths: list[int]) -> list[tuple[int, float, float]]:
    """(n, ms, ms): the gateway's text work over a streamed reply of n ids, one id per step (``Gateway._stream``'s
    loop: decode, hold back, cut at tool calls), decoding the whole output at every step vs only the new ids."""
    base = gw.tokenizer.encode(WORDS, add_special_tokens=False)
    rows = []
    for n in lengths:
        reply = (base * (n // len(base) + 1))[:n]
        ms = []
        for incremental in (False, True):
            decode = IncrementalDecoder(gw.tokenizer, incremental)
            ids: list[int] = []
            sent = ""
            t = time.perf_counter()
            for tok_id in reply:
                ids.append(tok_id)
                text = gw._final_text(ids, decode, len(sent))
                if len(text) > len(sent) and text.startswith(sent):
                    sent = text
            ms.append(1000 * (time.perf_counter() - t))
            assert sent == gw.tokenizer.decode(reply).rstrip("\ufffd")[: len(sent)]
        rows.append((n, *ms))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--reply-tokens", type=int, default=64)
    p.add_argument("--step-ms", type=float, default=10.0)
    p.add_argument("--decode-lengths", default="256,1024,4096,8192")
    a = p.parse_args()
    tok = build_tokenizer()
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    words = tok.encode(WORDS, add_special_tokens=False)
    reply = [words[i % len(words)] for i in range(a.reply_tokens - 1)] + [im_end]
    engine = ScriptedTokenEngine(lambda r: reply, capacity=4 * a.sessions, step_delay_s=a.step_ms / 1000)
    gw = Gateway(engine, tok, GatewayConfig(default_max_tokens=a.reply_tokens + 8))
    with ServerThread(build_app(gw)) as url:
        warm = argparse.Namespace(**{**vars(a), "turns": 1})
        for stream in (True, False):  # first connections, first SDK parses: not measured
            asyncio.run(calls(url, warm, stream))
        s_ttft, s_total = asyncio.run(calls(url, a, stream=True))
        _, n_total = asyncio.run(calls(url, a, stream=False))
    ms = lambda xs, q: 1000 * pct(xs, q)  # noqa: E731
    print(
        f"{a.sessions} sessions x {a.turns} turns, {a.reply_tokens} tokens x {a.step_ms:g} ms steps\n"
        f"streamed:     TTFT p50 {ms(s_ttft, 0.5):.0f} ms p99 {ms(s_ttft, 0.99):.0f} ms | "
        f"whole call p50 {ms(s_total, 0.5):.0f} ms p99 {ms(s_total, 0.99):.0f} ms\n"
        f"not streamed: whole call p50 {ms(n_total, 0.5):.0f} ms p99 {ms(n_total, 0.99):.0f} ms "
        f"(= the old streamed TTFT)\n"
        f"TTFT / whole call (p50): {statistics.median(s_ttft) / statistics.median(n_total):.3f}"
    )
    print("the gateway's text work per streamed reply (tiny byte-level BPE), event-loop CPU:")
    for n, whole, incremental in decode_cost(gw, [int(x) for x in a.decode_lengths.split(",")]):
        print(f"  {n:>5} tokens: whole output decoded each step {whole:.0f} ms, new ids only {incremental:.0f} ms")


if __name__ == "__main__":
    main()
