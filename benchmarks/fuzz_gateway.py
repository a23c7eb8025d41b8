"""Schema-aware fuzzing of the agentic gateway's three protocols (hypothesis), streaming and not, plus oversized and
truncated bodies, against a real uvicorn server on 127.0.0.1 behind ``guard.Guard`` (keys and limits).

    python benchmarks/fuzz_gateway.py [--examples 300] [--seed 0] [--stall-s 10]

The model is a scripted engine (short replies, some with tool calls), so every failure is the gateway's. Bodies
are drawn per protocol from the shapes its adapter reads (roles, string / part-list / odd content, tool calls and
tool results, tools, ``max_tokens``, ``stream``, sampling parameters), with any field swapped for arbitrary JSON
at times, each sent as drawn and (when it did not ask for a stream) again with ``"stream": true``; separately, bodies past the size limit and valid bodies cut at a random byte.

Counted:
- crashes: responses with status >= 500, a stream that ends with no terminal event (``[DONE]``, ``message_stop``,
  ``response.completed`` or the protocol's ``error`` event), and the server not answering at the end;
- hangs: requests that took longer than ``--stall-s``, and an engine that does not finish a plain request within
  ``--stall-s`` at the end (a stalled engine);
- losses: requests that got no HTTP answer at all, and trace-store rows written by a refused (4xx) request.
The last line is ``crashes: N, hangs: N, losses: N``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ENDPOINTS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
TERMINAL = ("[DONE]", "message_stop", "response.completed", '"type": "error"', '"error"')


def strategies():
    from hypothesis import strategies as st

    anyjson = st.recursive(
        st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=12,
    )
    text = st.text(max_size=80) | st.sampled_from(["", "<tool_call>", "<|im_end|>", "\x00", "é" * 30, "{"])
    role = st.one_of(
        *[st.sampled_from(["user", "user", "assistant", "system", "tool", "developer"])] * 6,
        st.sampled_from(["bogus", ""]),
        anyjson,
    )
    budget = st.one_of(st.integers(1, 256), st.integers(1, 256), st.integers(-5, 10**6))
    args = st.dictionaries(st.text(max_size=6), st.text(max_size=10), max_size=3).map(json.dumps) | st.text(max_size=20)

    def maybe(s):  # a field's proper shape, or sometimes arbitrary JSON
        return st.one_of(*[s] * 7, anyjson)

    chat_msg = st.fixed_dictionaries(
        {
            "role": role,
            "content": maybe(text | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}))),
        },
        optional={
            "tool_calls": maybe(
                st.lists(
                    st.fixed_dictionaries(
                        {
                            "id": text,
                            "type": st.just("function"),
                            "function": st.fixed_dictionaries({"name": text, "arguments": args}),
                        }
                    ),
                    max_size=2,
                )
            ),
            "tool_call_id": maybe(text),
        },
    )
    tool_oa = st.fixed_dictionaries(
        {
            "type": st.just("function"),
            "function": st.fixed_dictionaries({"name": text, "parameters": maybe(st.just({"type": "object"}))}),
        }
    )
    common = {
        "stream": maybe(st.booleans()),
        "temperature": maybe(st.floats(-1, 3, allow_nan=False)),
        "top_p": maybe(st.floats(-0.5, 1.5, allow_nan=False)),
    }
    chat = st.fixed_dictionaries(
        {"model": maybe(st.just("scifolio")), "messages": maybe(st.lists(chat_msg, max_size=6))},
        optional={"max_tokens": maybe(budget), "tools": maybe(st.lists(tool_oa, max_size=2)), **common},
    )
    resp_item = st.one_of(
        st.fixed_dictionaries({"role": role, "content": maybe(text)}, optional={"type": st.just("message")}),
        st.fixed_dictionaries(
            {"type": st.just("function_call"), "call_id": maybe(text), "name": maybe(text), "arguments": args}
        ),
        st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": maybe(text), "output": maybe(text)}),
    )
    responses = st.fixed_dictionaries(
        {"model": maybe(st.just("scifolio")), "input": maybe(text | st.lists(resp_item, max_size=6))},
        optional={
            "instructions": maybe(text),
            "max_output_tokens": maybe(budget),
            "tools": maybe(st.lists(st.fixed_dictionaries({"type": st.just("function"), "name": text}), max_size=2)),
            **common,
        },
    )
    block = st.one_of(
        st.fixed_dictionaries({"type": st.just("text"), "text": maybe(text)}),
        st.fixed_dictionaries({"type": st.just("tool_use"), "id": maybe(text), "name": maybe(text), "input": anyjson}),
        st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": maybe(text), "content": maybe(text)}),
    )
    anth_msg = st.fixed_dictionaries({"role": role, "content": maybe(text | st.lists(block, max_size=3))})
    messages = st.fixed_dictionaries(
        {
            "model": maybe(st.just("scifolio")),
            "messages": maybe(st.lists(anth_msg, max_size=6)),
            "max_tokens": maybe(budget),
        },
        optional={
            "system": maybe(text),
            "tools": maybe(
                st.lists(st.fixed_dictionaries({"name": text, "input_schema": st.just({"type": "object"})}), max_size=2)
            ),
            **common,
        },
    )
    return {"chat": chat, "responses": responses, "messages": messages}


def serve(max_body: int):
    from posttrain.agentic.gateway import Gateway, GatewayConfig, ServerThread, build_app
    from posttrain.agentic.guard import GatewayLimits, Guard
    from posttrain.rollout.engines.scripted import ScriptedTokenEngine
    from posttrain.tiny.agentic import build_tokenizer

    tok = build_tokenizer()
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    replies = [
        "Fine.",
        'I will call it.<tool_call>{"name": "write_file", "arguments": {"path": "a.py", "content": "x"}}</tool_call>',
        "<tool_call>not json</tool_call>",
    ]
    counter = iter(range(10**9))

    def script(req):
        return tok.encode(replies[next(counter) % len(replies)], add_special_tokens=False) + [im_end]

    gw = Gateway(ScriptedTokenEngine(script), tok, GatewayConfig(default_max_tokens=64, max_context=4096))
    keys = {"fuzz-key": "fuzz:"}
    guard = Guard(build_app(gw), keys, GatewayLimits(max_body_bytes=max_body, max_messages=64, max_tokens=4096))
    return gw, guard, ServerThread(guard)


def rows(gw) -> int:
    return sum(len(v) for v in gw.store.session_calls.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=300, help="hypothesis examples per protocol")
    ap.add_argument("--raw", type=int, default=60, help="oversized and truncated bodies per protocol")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stall-s", type=float, default=10.0)
    ap.add_argument("--max-body", type=int, default=64 * 1024)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import httpx
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed

    gw, guard, server = serve(args.max_body)
    statuses: Counter[str] = Counter()
    crashes = hangs = losses = tried = 0
    slowest = 0.0
    failures: list[str] = []
    with server as url, httpx.Client(base_url=url, timeout=args.stall_s + 5) as client:
        headers = {"Authorization": "Bearer fuzz-key", "x-api-key": "fuzz-key"}

        def send(protocol: str, content: bytes, stream: bool) -> None:
            nonlocal crashes, hangs, losses, tried, slowest
            tried += 1
            before = rows(gw)
            t0 = time.monotonic()
            try:
                with client.stream("POST", ENDPOINTS[protocol], content=content, headers=headers) as r:
                    text = "".join(r.iter_text())
                status = r.status_code
            except httpx.HTTPError as e:
                losses += 1
                failures.append(f"{protocol}: no answer: {e!r} for {content[:200]!r}")
                return
            took = time.monotonic() - t0
            slowest = max(slowest, took)
            statuses[f"{protocol} {status}{' stream' if stream and status == 200 else ''}"] += 1
            if took > args.stall_s:
                hangs += 1
                failures.append(f"{protocol}: {took:.1f}s for {content[:200]!r}")
            if status >= 500:
                crashes += 1
                failures.append(f"{protocol}: {status} {text[:300]} for {content[:300]!r}")
            elif status == 200 and "text/event-stream" in r.headers.get("content-type", ""):
                if not any(t in text[-400:] for t in TERMINAL):
                    crashes += 1
                    failures.append(f"{protocol}: stream without a terminal event: {text[-300:]!r}")
            elif 400 <= status < 500 and rows(gw) != before:
                losses += 1
                failures.append(f"{protocol}: a refused request wrote trace rows: {content[:200]!r}")

        strats = strategies()

        def fuzz(protocol: str) -> None:
            @settings(max_examples=args.examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
            @hseed(args.seed)
            @given(strats[protocol])
            def run(body):
                send(protocol, json.dumps(body).encode(), body.get("stream") is True)
                if body.get("stream") is not True:  # every shape streamed too: the SSE paths get as many tries
                    send(protocol, json.dumps({**body, "stream": True}).encode(), True)

            run()

        for protocol in ENDPOINTS:
            fuzz(protocol)
        rng = random.Random(args.seed)
        for protocol in ENDPOINTS:
            valid = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
            if protocol == "responses":
                valid = {"model": "m", "input": "hi"}
            for i in range(args.raw):
                if i % 2:  # oversized: a long message, or a huge pile of messages
                    big = dict(
                        valid,
                        messages=[{"role": "user", "content": "x" * rng.randint(args.max_body, 4 * args.max_body)}],
                    )
                    send(protocol, json.dumps(big).encode(), False)
                else:  # truncated at a random byte
                    data = json.dumps(dict(valid, stream=bool(rng.getrandbits(1)))).encode()
                    send(protocol, data[: rng.randrange(len(data))], False)
        # the server and the engine after it all: alive, and a plain request finishes in time
        t0 = time.monotonic()
        try:
            alive = client.get("/v1/models", headers=headers).status_code == 200
            ok = client.post(
                ENDPOINTS["chat"], json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}, headers=headers
            )
            alive = alive and ok.status_code == 200
        except httpx.HTTPError:
            alive = False
        if not alive:
            crashes += 1
            failures.append("the server did not answer at the end")
        if time.monotonic() - t0 > args.stall_s:
            hangs += 1
            failures.append("the engine stalled")

    print(
        f"requests tried: {tried} ({args.examples} hypothesis examples per protocol, each also streamed, "
        f"+ {args.raw} oversized/truncated per protocol)"
    )
    print(
        f"refused by the guard: {guard.refused}; trace-store calls written: {rows(gw)}; slowest request {slowest:.2f}s"
    )
    for key, n in sorted(statuses.items()):
        print(f"  {key:<28}{n:>6}")
    for f in failures[:20]:
        print("FAIL", f)
    figures = {"tried": tried, "crashes": crashes, "hangs": hangs, "losses": losses, "statuses": dict(statuses)}
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    print(f"crashes: {crashes}, hangs: {hangs}, losses: {losses}")
    return 0 if crashes == hangs == losses == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
