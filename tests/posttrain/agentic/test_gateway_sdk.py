"""The gateway through the official ``openai`` and ``anthropic`` SDKs (their typed stream parsers).

3 protocols × streaming/non-streaming × plain text/tool call on a scripted engine (exact token
sequences), then one plain-text round per protocol on the real tiny HF engine. Every call's trace
must hold exactly the engine's input and output ids, and the loss mask is 1 only on assistant tokens.
"""

from __future__ import annotations

import asyncio
import json
import time

import anthropic  # posttrain extra: a missing SDK must fail, not skip
import httpx
import openai
import pytest

from posttrain.agentic.gateway import Gateway, GatewayConfig, build_app
from posttrain.rollout.engines.scripted import ScriptedTokenEngine
from posttrain.tiny.agentic import build_tokenizer

TOOLS_OPENAI = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
                "additionalProperties": False,
            },
            "strict": True,  # the SDKs' stream helpers auto-parse only strict tools
        },
    }
]
TOOLS_RESP = [{"type": "function", **TOOLS_OPENAI[0]["function"]}]
TOOLS_ANTH = [
    {"name": "write_file", "description": "Write a file", "input_schema": TOOLS_OPENAI[0]["function"]["parameters"]}
]
ARGS = {"path": "calc.py", "content": "def add(a, b):\n    return a + b\n"}
TOOL_TEXT = "Let me fix it." + '<tool_call>{"name": "write_file", "arguments": ' + json.dumps(ARGS) + "}</tool_call>"
PLAIN_TEXT = "The tests pass now."


class Script:
    """Replies per session, in order; records nothing itself (the engine does)."""

    def __init__(self, tok):
        self.tok = tok
        self.im_end = tok.convert_tokens_to_ids("<|im_end|>")
        self.replies: dict[str, list[str]] = {}

    def __call__(self, req):
        text = self.replies[req.group_id].pop(0)
        return self.tok.encode(text, add_special_tokens=False) + [self.im_end]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def make_gateway(tok, engine=None):
    script = Script(tok)
    engine = engine or ScriptedTokenEngine(script)
    gw = Gateway(engine, tok, GatewayConfig(default_max_tokens=128))
    return gw, script


def clients(gw, sid):
    app = build_app(gw)
    oa = openai.AsyncOpenAI(
        base_url="http://gw/v1",
        api_key=sid,
        http_client=httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw"),
    )
    # anthropic >= 2.x ships its own httpx fork (httpx2); older releases use httpx
    hx = __import__("httpx2") if anthropic.__version__.split(".")[0] >= "2" else httpx
    an = anthropic.AsyncAnthropic(
        base_url="http://gw",
        api_key=sid,
        http_client=hx.AsyncClient(transport=hx.ASGITransport(app=app), base_url="http://gw"),
    )
    return oa, an


def check_trace(gw, sid, tok):
    """Store ids == engine ids for every call of the session; loss mask 1 exactly on assistant tokens."""
    store, driver = gw.store, gw.driver
    calls = store.session_calls[sid]
    assert calls
    for cid in calls:
        rid = store.calls[cid]["meta"]["request_id"]
        traj = driver.finished[rid]
        assert store.call_input_ids(cid) == traj.prompt_ids
        assert store.call_output_ids(cid) == traj.token_ids
    ex = store.session_export(sid)
    resp_positions = {i for s, e in ex["spans"] for i in range(s, e)}
    assert [i for i, m in enumerate(ex["loss_mask"]) if m] == sorted(resp_positions)
    last = store.calls[calls[-1]]
    assert ex["token_ids"] == store.call_input_ids(calls[-1]) + store.call_output_ids(calls[-1])
    assert len(ex["token_ids"]) == last["prompt_len"] + last["output_len"]
    # the trainable spans are exactly the engine's outputs, call by call
    assert [ex["token_ids"][a:b] for a, b in ex["spans"]] == [store.call_output_ids(c) for c in ex["calls"]]
    masked = tok.decode([t for t, m in zip(ex["token_ids"], ex["loss_mask"]) if not m])
    if not any(f["session"] == sid for f in store.forks):  # after a fork, the harness's rewrite is context
        assert masked.count("assistant\n") == len(
            ex["spans"]
        )  # masked tokens: system/user/tool turns + the template's "<|im_start|>assistant\n" headers only
    return ex


def run(coro):
    return asyncio.run(coro)


# -- OpenAI Chat Completions ---------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_chat_text_and_tool_call(tok, stream):
    gw, script = make_gateway(tok)
    sid = f"chat-{stream}"
    script.replies[sid] = [TOOL_TEXT, PLAIN_TEXT]
    oa, _ = clients(gw, sid)

    async def go():
        msgs = [{"role": "system", "content": "You fix code."}, {"role": "user", "content": "Fix calc.py"}]
        if stream:
            async with oa.chat.completions.stream(model="m", messages=msgs, tools=TOOLS_OPENAI) as s:
                async for _ in s:
                    pass
                first = await s.get_final_completion()
        else:
            first = await oa.chat.completions.create(model="m", messages=msgs, tools=TOOLS_OPENAI)
        ch = first.choices[0]
        assert ch.finish_reason == "tool_calls"
        assert ch.message.content == "Let me fix it."
        (call,) = ch.message.tool_calls
        assert call.function.name == "write_file" and json.loads(call.function.arguments) == ARGS
        msgs += [ch.message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "ok"}]
        if stream:
            async with oa.chat.completions.stream(
                model="m", messages=msgs, tools=TOOLS_OPENAI, stream_options={"include_usage": True}
            ) as s:
                async for _ in s:
                    pass
                second = await s.get_final_completion()
        else:
            second = await oa.chat.completions.create(model="m", messages=msgs, tools=TOOLS_OPENAI)
        assert second.choices[0].message.content == PLAIN_TEXT
        assert second.choices[0].finish_reason == "stop"
        assert second.usage.completion_tokens == len(gw.store.call_output_ids(gw.store.session_calls[sid][-1]))

    run(go())
    check_trace(gw, sid, tok)
    assert not gw.store.forks  # the re-rendered history extended the stored ids exactly
    first, second = gw.store.session_calls[sid]
    assert gw.store.call_input_ids(second)[: len(gw.store.call_input_ids(first))] == gw.store.call_input_ids(first)


# -- OpenAI Responses ----------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_responses_text_and_tool_call(tok, stream):
    gw, script = make_gateway(tok)
    sid = f"resp-{stream}"
    script.replies[sid] = [TOOL_TEXT, PLAIN_TEXT]
    oa, _ = clients(gw, sid)

    async def go():
        inp = [{"role": "user", "content": "Fix calc.py"}]
        kw = dict(model="m", instructions="You fix code.", tools=TOOLS_RESP)
        if stream:
            async with oa.responses.stream(input=inp, **kw) as s:
                kinds = [e.type async for e in s]
                first = await s.get_final_response()
            assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
            assert "response.function_call_arguments.delta" in kinds
        else:
            first = await oa.responses.create(input=inp, **kw)
        msg, fc = first.output
        assert msg.type == "message" and msg.content[0].text == "Let me fix it."
        assert fc.type == "function_call" and fc.name == "write_file" and json.loads(fc.arguments) == ARGS
        inp += [
            {"type": "message", "role": "assistant", "content": "Let me fix it."},
            {"type": "function_call", "call_id": fc.call_id, "name": fc.name, "arguments": fc.arguments},
            {"type": "function_call_output", "call_id": fc.call_id, "output": "ok"},
        ]
        if stream:
            async with oa.responses.stream(input=inp, **kw) as s:
                async for _ in s:
                    pass
                second = await s.get_final_response()
        else:
            second = await oa.responses.create(input=inp, **kw)
        assert second.output_text == PLAIN_TEXT and second.status == "completed"
        assert second.usage.output_tokens == len(tok.encode(PLAIN_TEXT, add_special_tokens=False)) + 1

    run(go())
    check_trace(gw, sid, tok)
    assert not gw.store.forks


# -- Anthropic Messages --------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_messages_text_and_tool_call(tok, stream):
    gw, script = make_gateway(tok)
    sid = f"anth-{stream}"
    script.replies[sid] = [TOOL_TEXT, PLAIN_TEXT]
    _, an = clients(gw, sid)

    async def go():
        msgs = [{"role": "user", "content": "Fix calc.py"}]
        kw = dict(model="m", max_tokens=128, system="You fix code.", tools=TOOLS_ANTH)
        if stream:
            async with an.messages.stream(messages=msgs, **kw) as s:
                kinds = [e.type async for e in s]
                first = await s.get_final_message()
            assert "content_block_start" in kinds and "message_stop" in kinds
        else:
            first = await an.messages.create(messages=msgs, **kw)
        assert first.stop_reason == "tool_use"
        text, use = first.content
        assert text.text == "Let me fix it." and use.name == "write_file" and use.input == ARGS
        msgs += [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "ok"}]},
        ]
        if stream:
            async with an.messages.stream(messages=msgs, **kw) as s:
                async for _ in s:
                    pass
                second = await s.get_final_message()
        else:
            second = await an.messages.create(messages=msgs, **kw)
        assert second.content[0].text == PLAIN_TEXT and second.stop_reason == "end_turn"
        n = await an.messages.count_tokens(messages=msgs, model="m", system="You fix code.", tools=TOOLS_ANTH)
        assert n.input_tokens == gw.store.calls[gw.store.session_calls[sid][-1]]["prompt_len"]

    run(go())
    check_trace(gw, sid, tok)
    assert not gw.store.forks


def test_session_from_path_prefix_and_fork_on_rerender(tok):
    """``/s/{sid}/v1`` names the session; a history re-rendered differently forks (recorded), never re-tokenised."""
    gw, script = make_gateway(tok)
    script.replies["p1"] = ["first answer", "second answer"]
    app = build_app(gw)

    async def go():
        oa = openai.AsyncOpenAI(
            base_url="http://gw/s/p1/v1",
            api_key="ignored",
            http_client=httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw"),
        )
        msgs = [{"role": "user", "content": "hi"}]
        r = await oa.chat.completions.create(model="m", messages=msgs)
        assert r.choices[0].message.content == "first answer"
        # the harness rewrites the assistant turn before sending it back
        msgs += [{"role": "assistant", "content": "FIRST ANSWER"}, {"role": "user", "content": "more"}]
        await oa.chat.completions.create(model="m", messages=msgs)

    run(go())
    assert gw.store.session_calls.keys() == {"p1"}
    (fork,) = gw.store.forks
    assert fork["stored"].startswith("first answer") and fork["rendered"].startswith("FIRST ANSWER")
    first, second = gw.store.session_calls["p1"]
    # the fork branches at the context node of the first call: its stored ids are still reused
    assert gw.store.calls[second]["context_node"] != gw.store.calls[first]["response_node"]
    assert gw.store.call_input_ids(second)[: len(gw.store.call_input_ids(first))] == gw.store.call_input_ids(first)
    check_trace(gw, "p1", tok)


def test_real_tiny_engine_all_protocols(tok):
    """Plain text on the real HF engine (random tiny Qwen2): one non-streaming and one streaming call per protocol."""
    from posttrain.rollout.engines.hf import HFEngine
    from posttrain.tiny import build_tiny_causal_lm

    engine = HFEngine(build_tiny_causal_lm(vocab_size=1024), capacity=8)
    gw, _ = make_gateway(tok, engine)
    oa, an = clients(gw, "hf")

    async def go():
        msgs = [{"role": "user", "content": "Say hi"}]
        r = await oa.chat.completions.create(model="m", messages=msgs, max_tokens=8)
        assert r.choices[0].finish_reason in ("stop", "length")
        async with oa.chat.completions.stream(model="m", messages=msgs, max_tokens=8) as s:
            async for _ in s:
                pass
            try:  # the SDK's helper refuses to "parse" a length-truncated completion, by design
                done = await s.get_final_completion()
            except openai.LengthFinishReasonError as e:
                done = e.completion
            assert done.choices[0].finish_reason in ("stop", "length")
        r = await oa.responses.create(model="m", input="Say hi", max_output_tokens=8)
        assert r.status in ("completed", "incomplete")
        async with oa.responses.stream(model="m", input="Say hi", max_output_tokens=8) as s:
            events = [e async for e in s]
            # a truncated response ends in response.incomplete (the SDK's get_final_response wants .completed)
            assert events[-1].type in ("response.completed", "response.incomplete")
            assert events[-1].response.usage.output_tokens >= 1
        m = await an.messages.create(model="m", max_tokens=8, messages=msgs)
        assert m.stop_reason in ("end_turn", "max_tokens")
        async with an.messages.stream(model="m", max_tokens=8, messages=msgs) as s:
            async for _ in s:
                pass
            await s.get_final_message()

    run(go())
    store = gw.store
    assert len(store.session_calls["hf"]) == 6
    for cid in store.session_calls["hf"]:
        traj = gw.driver.finished[store.calls[cid]["meta"]["request_id"]]
        assert store.call_input_ids(cid) == traj.prompt_ids
        assert store.call_output_ids(cid) == traj.token_ids
        assert store.nodes[store.calls[cid]["response_node"]].logprobs == traj.logprobs
        assert 1 <= len(traj.token_ids) <= 8


def test_routed_experts_of_a_moe_engine_are_stored(tok):
    """R3: a tiny Qwen2-MoE behind the gateway; the store keeps the routes the engine recorded, per position."""
    from posttrain.objectives.r3 import EngineRoutingRecorder
    from posttrain.rollout.engines.hf import HFEngine
    from posttrain.tiny.moe import build_tiny_moe_lm

    model = build_tiny_moe_lm(vocab_size=1024)
    engine = HFEngine(model, capacity=4)
    engine.experts_recorder = EngineRoutingRecorder(model)
    gw = Gateway(engine, tok, GatewayConfig(default_max_tokens=6, return_routed_experts=True))
    oa, _ = clients(gw, "moe")

    async def go():
        await oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=6)

    run(go())
    (cid,) = gw.store.session_calls["moe"]
    traj = gw.driver.finished[gw.store.calls[cid]["meta"]["request_id"]]
    stored = gw.store.nodes[gw.store.calls[cid]["response_node"]].experts
    assert stored == traj.routed_experts
    assert len(stored) == len(traj.prompt_ids) + len(traj.token_ids) - 1  # every position fed to the model
    assert len(stored[0]) == 2 and len(stored[0][0]) == 2  # [layers][top_k]


def test_serve_a_saved_tiny_model_dir(tmp_path):
    """``load_model_gateway(DIR)`` (what ``serve_gateway`` runs) on the dir ``write_tiny_agentic`` writes:
    the saved tokenizer keeps its chat template and tool tokens; one real HTTP call through uvicorn."""
    from posttrain.agentic.gateway import ServerThread, load_model_gateway
    from posttrain.tiny.agentic import write_tiny_agentic

    d = write_tiny_agentic(tmp_path / "tiny")
    gw = load_model_gateway(str(d))
    assert gw.tokenizer.convert_tokens_to_ids("<tool_call>") == build_tokenizer().convert_tokens_to_ids("<tool_call>")
    with ServerThread(build_app(gw)) as url:
        r = openai.OpenAI(base_url=url + "/v1", api_key="dir").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    (cid,) = gw.store.session_calls["dir"]
    assert r.usage.completion_tokens == len(gw.store.call_output_ids(cid)) <= 4
    assert r.usage.prompt_tokens == len(gw.store.call_input_ids(cid))


def test_temperature_zero_is_greedy_and_bad_sampling_is_a_400(tok):
    """``temperature=0`` decodes greedily on the real engine (same reply for any seed, each token the argmax,
    logprob 0); a negative temperature is refused with HTTP 400, not sampled at some other temperature."""
    import torch

    from posttrain.rollout.engines.hf import HFEngine
    from posttrain.tiny import build_tiny_causal_lm

    model = build_tiny_causal_lm(vocab_size=1024)
    gw, _ = make_gateway(tok, HFEngine(model, capacity=4))
    msgs = [{"role": "user", "content": "Say hi"}]

    async def go():
        outs = []
        for sid in ("a", "b"):  # different sessions → different per-call seeds
            oa, _ = clients(gw, sid)
            await oa.chat.completions.create(model="m", messages=msgs, max_tokens=6, temperature=0)
            outs.append(gw.driver.finished[gw.store.calls[gw.store.session_calls[sid][0]]["meta"]["request_id"]])
        oa, _ = clients(gw, "c")
        with pytest.raises(openai.BadRequestError, match="invalid_sampling_parameters"):
            await oa.chat.completions.create(model="m", messages=msgs, max_tokens=6, temperature=-0.5)
        return outs

    a, b = run(go())
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs == [0.0] * len(a.token_ids)
    ids = list(a.prompt_ids)
    with torch.no_grad():
        for t in a.token_ids:
            assert t == int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(t)


# -- Incremental streaming -----------------------------------------------------------------------------
STREAM_TEXT = "The tests pass now and the code is fixed, so calc.py adds."


def test_streams_are_incremental_through_the_sdks(tok):
    """Real HTTP (uvicorn on 127.0.0.1; httpx's ASGI transport buffers whole bodies) and an engine that takes 50 ms a
    step: through each SDK's stream the first text delta arrives after a few steps, not after the whole call, the
    deltas concatenate to the final text (tool call parsed at the end), and the trace holds the engine's ids."""
    from posttrain.agentic.gateway import ServerThread

    script = Script(tok)
    engine = ScriptedTokenEngine(script, step_delay_s=0.05)
    gw, _ = make_gateway(tok, engine)
    n_tokens = len(tok.encode(STREAM_TEXT, add_special_tokens=False)) + 1
    assert 15 <= n_tokens <= 30
    small = {"path": "calc.py"}
    tool_reply = STREAM_TEXT + '<tool_call>{"name": "write_file", "arguments": ' + json.dumps(small) + "}</tool_call>"
    script.replies = {"inc-chat": [tool_reply], "inc-resp": [STREAM_TEXT], "inc-anth": [STREAM_TEXT]}
    msgs = [{"role": "user", "content": "Fix calc.py"}]
    timings = {}

    async def timed(name, events, text_of_event):
        t0 = time.perf_counter()
        first, deltas = None, []
        async for ev in events:
            d = text_of_event(ev)
            if d:
                first = first or time.perf_counter() - t0
                deltas.append(d)
        timings[name] = (first, time.perf_counter() - t0, len(deltas))
        return "".join(deltas)

    async def go(url):
        oa = openai.AsyncOpenAI(base_url=url + "/v1", api_key="inc-chat")
        stream = await oa.chat.completions.create(model="m", messages=msgs, tools=TOOLS_OPENAI, stream=True)
        calls = []

        def chat_text(chunk):
            if chunk.choices and chunk.choices[0].delta.tool_calls:
                calls.append(chunk.choices[0].delta.tool_calls[0])
            return chunk.choices[0].delta.content if chunk.choices else None

        assert await timed("chat", stream, chat_text) == STREAM_TEXT
        assert calls[0].function.name == "write_file"
        assert json.loads("".join(c.function.arguments for c in calls)) == small

        oa = openai.AsyncOpenAI(base_url=url + "/v1", api_key="inc-resp")
        async with oa.responses.stream(model="m", input="Fix calc.py") as s:
            text = await timed("responses", s, lambda e: e.delta if e.type == "response.output_text.delta" else None)
            final = await s.get_final_response()
        assert text == final.output_text == STREAM_TEXT

        an = anthropic.AsyncAnthropic(base_url=url, api_key="inc-anth")
        async with an.messages.stream(model="m", max_tokens=64, messages=msgs) as s:
            text = await timed("messages", s, lambda e: e.delta.text if e.type == "content_block_delta" else None)
            final = await s.get_final_message()
        assert text == final.content[0].text == STREAM_TEXT and final.usage.output_tokens == n_tokens

    with ServerThread(build_app(gw)) as url:
        run(go(url))
    for name, (first, total, n_deltas) in timings.items():
        assert total >= n_tokens * 0.05  # the engine really took a step per token
        assert first < 0.4 * total, (name, first, total)
        assert n_deltas >= n_tokens // 2, (name, n_deltas)  # text went out as it decoded, not in one piece
    for sid in script.replies:
        check_trace(gw, sid, tok)


def text_stream(gw, sid, conv):
    """Drive ``Gateway.stream`` directly: (deltas, Generation)."""

    async def go():
        s = await gw.stream(sid, conv, "chat")
        deltas = [d async for d in s]
        return deltas, s.generation

    return run(go())


@pytest.mark.parametrize("incremental", [True, False])
def test_stream_holds_back_partial_utf8_and_tool_call_starts(tok, incremental):
    """Byte-level BPE splits 'ï', '数' across tokens and '<' may start '<tool_call>': no delta ever carries a
    replacement character or tool-call text, and the deltas still add up to the parsed content (decoding only the
    new ids, and decoding the whole output at every step)."""
    from posttrain.agentic.chat import Conversation

    gw, script = make_gateway(tok)
    assert gw.incremental_decode  # the tiny tokenizer is a byte-level BPE
    gw.incremental_decode = incremental
    body = "naïve café → 数学 ✓ so a < b and "
    script.replies = {"u": [body + '<tool_call>{"name": "write_file", "arguments": {"path": "x"}}</tool_call>']}
    ids = tok.encode(body, add_special_tokens=False)
    assert any("\ufffd" in tok.decode(ids[:k]) for k in range(1, len(ids)))  # the case really occurs
    deltas, g = text_stream(gw, "u", Conversation([{"role": "user", "content": "hi"}], tools=[]))
    assert "".join(deltas) == g.text == body and g.finish == "tool_calls" and g.tool_calls[0].name == "write_file"
    assert len(deltas) > 10 and not any("\ufffd" in d or "tool" in d for d in deltas)
    assert not any(d.endswith("<") for d in deltas)  # a lone '<' may begin '<tool_call>': held to the next token
    (cid,) = gw.store.session_calls["u"]
    assert gw.store.call_output_ids(cid) == gw.driver.finished[gw.store.calls[cid]["meta"]["request_id"]].token_ids


def test_stream_of_a_malformed_tool_call_ends_with_the_held_text(tok):
    """Text after '<tool_call>' is held; when the call does not parse, the whole output is content and the held
    rest goes out as the last delta (still before the finish)."""
    from posttrain.agentic.chat import Conversation

    gw, script = make_gateway(tok)
    reply = "Trying.<tool_call>{not json}</tool_call>"
    script.replies = {"m": [reply]}
    deltas, g = text_stream(gw, "m", Conversation([{"role": "user", "content": "hi"}]))
    assert g.text == reply and not g.tool_calls and not g.well_formed and g.finish == "stop"
    assert "".join(deltas) == reply and deltas[-1] == "<tool_call>{not json}</tool_call>"


class SilentEngine(ScriptedTokenEngine):
    """Emits tokens but does not report them in ``new_tokens`` (a broken engine: negative control)."""

    def step(self):
        out = super().step()
        out.new_tokens = {}
        return out


def test_stream_fails_loudly_when_the_engine_does_not_report_its_ids(tok):
    from posttrain.agentic.chat import Conversation

    script = Script(tok)
    gw, _ = make_gateway(tok, SilentEngine(script))
    script.replies = {"x": ["hello there"]}
    with pytest.raises(RuntimeError, match="reported 0 new ids"):
        text_stream(gw, "x", Conversation([{"role": "user", "content": "hi"}]))


def test_streaming_bad_sampling_is_a_400_and_frees_the_session(tok):
    gw, script = make_gateway(tok)
    script.replies["b"] = ["fine"]
    oa, an = clients(gw, "b")

    async def go():
        msgs = [{"role": "user", "content": "hi"}]
        with pytest.raises(openai.BadRequestError, match="invalid_sampling_parameters"):
            await oa.chat.completions.create(model="m", messages=msgs, temperature=-1, stream=True)
        with pytest.raises(anthropic.BadRequestError, match="invalid_sampling_parameters"):
            await an.messages.create(
                model="m", max_tokens=8, messages=msgs, stream=True, extra_body={"temperature": -1}
            )
        stream = await oa.chat.completions.create(model="m", messages=msgs, stream=True)  # the lock was released
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    assert run(go()) == "fine"


class BreakingEngine(ScriptedTokenEngine):
    """Fails (and drops its requests) once a request has 3 tokens: a stream that has already begun."""

    def step(self):
        out = super().step()
        if any(t.n_tokens >= 3 for t, _ in self._running):
            self._running = []
            raise RuntimeError("engine broke")
        return out


def test_a_failure_mid_stream_is_each_protocols_error_event(tok):
    """The status line (200) is already sent: the failure arrives as the protocol's own error event, which the
    SDKs raise as API errors (Responses yields its ``error`` event), and the session stays usable."""
    script = Script(tok)
    gw, _ = make_gateway(tok, BreakingEngine(script))
    script.replies["e"] = ["one two three four five six seven eight"] * 3
    oa, an = clients(gw, "e")
    msgs = [{"role": "user", "content": "hi"}]

    async def go():
        stream = await oa.chat.completions.create(model="m", messages=msgs, stream=True)
        with pytest.raises(openai.APIError, match="engine broke"):
            async for _ in stream:
                pass
        stream = await oa.responses.create(model="m", input="hi", stream=True)
        events = [e async for e in stream]
        assert events[-1].type == "error" and "engine broke" in events[-1].message
        assert events[-1].sequence_number == events[-2].sequence_number + 1
        stream = await an.messages.create(model="m", max_tokens=32, messages=msgs, stream=True)
        with pytest.raises(anthropic.APIError, match="engine broke"):
            async for _ in stream:
                pass

    run(go())
    assert not gw.store.session_calls.get("e")  # a failed call is not captured


def test_a_tool_call_without_text_streams_no_text_block(tok):
    """Nothing before ``<tool_call>``: the streams open no text block/item, the call is block/item/index 0."""
    gw, script = make_gateway(tok)
    only_call = '<tool_call>{"name": "write_file", "arguments": ' + json.dumps(ARGS) + "}</tool_call>"
    script.replies = {"t": [only_call] * 3}
    oa, an = clients(gw, "t")
    msgs = [{"role": "user", "content": "Fix calc.py"}]

    async def go():
        async with oa.chat.completions.stream(model="m", messages=msgs, tools=TOOLS_OPENAI) as s:
            texts = [e.delta async for e in s if e.type == "content.delta"]
            done = await s.get_final_completion()
        assert not "".join(texts) and not done.choices[0].message.content  # only the opening chunk's ""
        assert json.loads(done.choices[0].message.tool_calls[0].function.arguments) == ARGS
        async with oa.responses.stream(model="m", input="Fix calc.py", tools=TOOLS_RESP) as s:
            kinds = [e.type async for e in s]
            r = await s.get_final_response()
        assert "response.output_text.delta" not in kinds and [o.type for o in r.output] == ["function_call"]
        async with an.messages.stream(model="m", max_tokens=128, messages=msgs, tools=TOOLS_ANTH) as s:
            kinds = [e.type async for e in s]
            m = await s.get_final_message()
        assert "text" not in kinds and [b.type for b in m.content] == ["tool_use"] and m.content[0].input == ARGS

    run(go())
    check_trace(gw, "t", tok)


def test_a_client_that_goes_away_aborts_its_request(tok):
    """Real HTTP, 60 tokens at 50 ms a step (3 s): the client reads two deltas and closes the stream. The engine
    request is aborted within a few steps (its slot is free long before the 3 s), the tokens generated so far are
    captured with finish ``abort``, and the session's next call goes through."""
    from posttrain.agentic.gateway import ServerThread

    script = Script(tok)
    engine = ScriptedTokenEngine(script, step_delay_s=0.05)
    gw, _ = make_gateway(tok, engine)
    long_reply = " ".join(["word"] * 59)
    script.replies = {"gone": [long_reply, PLAIN_TEXT]}
    msgs = [{"role": "user", "content": "Say a lot"}]

    async def go(url):
        oa = openai.AsyncOpenAI(base_url=url + "/v1", api_key="gone", max_retries=0)
        t0 = time.perf_counter()
        stream = await oa.chat.completions.create(model="m", messages=msgs, stream=True)
        seen = 0
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                seen += 1
                if seen == 2:
                    break
        await stream.close()
        while gw.store.session_calls.get("gone") is None:  # the capture follows the abort
            assert time.perf_counter() - t0 < 2.0, "the request ran on after the client left"
            await asyncio.sleep(0.02)
        assert engine.n_active == 0
        r = await oa.chat.completions.create(model="m", messages=msgs)  # the session lock was released
        return time.perf_counter() - t0, r.choices[0].message.content

    with ServerThread(build_app(gw)) as url:
        elapsed, second = run(go(url))
    assert second == PLAIN_TEXT and elapsed < 3.0
    first = gw.store.calls[gw.store.session_calls["gone"][0]]
    assert first["finish"] == "abort"
    traj = gw.driver.finished[first["meta"]["request_id"]]
    assert traj.finish_reason == "abort" and 2 <= len(traj.token_ids) < 40
    assert gw.store.call_output_ids(gw.store.session_calls["gone"][0]) == traj.token_ids
