"""The gateway's three protocols: OpenAI Chat Completions, OpenAI Responses, Anthropic Messages.

Each is one ``Protocol`` object (``PROTOCOLS``) holding everything protocol-specific (its path, request parsing,
response bodies, SSE events and error shapes: see ``Protocol``). The app (``gateway.build_app``) and the guard
(``guard.py``) loop over ``PROTOCOLS``; neither names a protocol. Shapes follow the vendors' docs (see
``shared/research/rl-systems.md`` §3) and are checked by the official SDKs' typed parsers in the tests
(``pytest tests/posttrain/agentic/test_gateway_sdk.py``).

Streams are incremental (``Gateway.stream``): the opening events at once, the text block/item with the first text
delta; tool calls (their arguments cut into ``PIECE``-character deltas), finish reason and usage at the end.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from posttrain.agentic.chat import (
    Conversation,
    Generation,
    GenerationStream,
    assistant_message,
    canonical_tool,
    text_of,
    user_content,
)

PIECE = 16
"""Characters per streamed tool-call argument delta."""

Events = AsyncIterator[tuple[str | None, Any]]
log = logging.getLogger(__name__)


def _opening(s: GenerationStream) -> Generation:
    """What is known of a streaming call before its first token (for the protocols' opening envelopes)."""
    return Generation("", [], "stop", s.prompt_tokens, 0, call_id=s.call_id)


def _pieces(s: str) -> list[str]:
    return [s[i : i + PIECE] for i in range(0, len(s), PIECE)] or [""]


def conversation(
    body: dict[str, Any], msgs: list[dict[str, Any]], tools: list[dict[str, Any]], max_tokens: Any
) -> Conversation:
    """The canonical ``Conversation`` of a request: its messages and tools as the adapter read them, plus the
    sampling fields every protocol names alike (temperature and top_p default to 1, ``stream``, ``model``)."""
    return Conversation(
        messages=msgs,
        tools=tools,
        max_tokens=int(max_tokens),
        temperature=float(body.get("temperature") if body.get("temperature") is not None else 1.0),
        top_p=float(body.get("top_p") if body.get("top_p") is not None else 1.0),
        stream=bool(body.get("stream")),
        model=body.get("model", "scifolio"),
    )


class Protocol:
    """One wire protocol of the gateway: everything that differs between Chat Completions, Responses and Messages."""

    name: str
    """Recorded with each call in the trace store (``calls.protocol``)."""
    path: str
    """The endpoint (also served under ``/s/{sid}``)."""
    extra_paths: tuple[str, ...] = ()
    """Further endpoints of the protocol that the guard checks in its error shape (Messages' ``count_tokens``)."""
    items_field: str = "messages"
    """The body field holding the conversation (its length is limited by the guard)."""

    def parse(self, body: dict[str, Any], default_max: int) -> Conversation:
        """Request JSON → ``Conversation`` (a malformed body raises ``ValueError``/``KeyError``/...)."""
        raise NotImplementedError

    def response(self, g: Generation, conv: Conversation, body: dict[str, Any]) -> dict[str, Any]:
        """The non-streaming JSON body."""
        raise NotImplementedError

    def events(self, s: GenerationStream, conv: Conversation, body: dict[str, Any]) -> Events:
        """The SSE stream of a streaming call, as ``(event, data)`` pairs (``event`` None: a bare ``data:`` line)."""
        raise NotImplementedError

    def stream_error(self, message: str, n_sent: int) -> tuple[str | None, Any]:
        """The in-band error event that ends a stream which failed after it began (the HTTP status, 200, is gone)."""
        raise NotImplementedError

    def error(self, status: int, message: str, code: str) -> dict[str, Any]:
        """The JSON body of an HTTP error (the gateway's 400/503, the guard's 401/403/404/413), in the protocol's own
        shape (OpenAI's unless overridden)."""
        kind = "server_error" if status >= 500 else "invalid_request_error" if status != 401 else "authentication_error"
        return {"error": {"message": message, "type": kind, "param": None, "code": code}}


# -- OpenAI Chat Completions ---------------------------------------------------------------------------
_CHAT_FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls"}


def _chat_usage(g: Generation) -> dict[str, int]:
    return {
        "prompt_tokens": g.prompt_tokens,
        "completion_tokens": g.completion_tokens,
        "total_tokens": g.prompt_tokens + g.completion_tokens,
    }


class ChatCompletions(Protocol):
    name, path = "chat", "/v1/chat/completions"

    def parse(self, body: dict[str, Any], default_max: int) -> Conversation:
        msgs = []
        for m in body.get("messages", []):
            role = "system" if m.get("role") == "developer" else m.get("role")
            if role == "assistant":
                calls = [
                    (c["id"], c["function"]["name"], c["function"].get("arguments", ""))
                    for c in m.get("tool_calls") or []
                ]
                msgs.append(assistant_message(text_of(m.get("content")), calls))
            elif role == "tool":
                msgs.append(
                    {"role": "tool", "tool_call_id": m.get("tool_call_id"), "content": text_of(m.get("content"))}
                )
            else:
                msgs.append({"role": role, "content": user_content(m.get("content"))})
        tools = [
            canonical_tool(t["function"]["name"], t["function"].get("description"), t["function"].get("parameters"))
            for t in body.get("tools") or []
            if t.get("type") == "function"
        ]
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or default_max
        return conversation(body, msgs, tools, max_tokens)

    def response(self, g: Generation, conv: Conversation, body: dict[str, Any]) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": g.text if (g.text or not g.tool_calls) else None}
        if g.tool_calls:
            msg["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_json}}
                for c in g.tool_calls
            ]
        return {
            "id": "chatcmpl-" + g.call_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": conv.model,
            "choices": [{"index": 0, "message": msg, "finish_reason": _CHAT_FINISH[g.finish], "logprobs": None}],
            "usage": _chat_usage(g),
        }

    async def events(self, s: GenerationStream, conv: Conversation, body: dict[str, Any]) -> Events:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        base = {
            "id": "chatcmpl-" + s.call_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": conv.model,
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}

        yield None, chunk({"role": "assistant", "content": ""})
        async for delta in s:
            yield None, chunk({"content": delta})
        g = s.generation
        for i, c in enumerate(g.tool_calls):
            head = {"index": i, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}}
            yield None, chunk({"tool_calls": [head]})
            for p in _pieces(c.arguments_json):
                yield None, chunk({"tool_calls": [{"index": i, "function": {"arguments": p}}]})
        yield None, chunk({}, _CHAT_FINISH[g.finish])
        if include_usage:
            yield None, {**base, "choices": [], "usage": _chat_usage(g)}
        yield None, "[DONE]"

    def stream_error(self, message: str, n_sent: int) -> tuple[str | None, Any]:
        """A ``data:`` object with ``error`` (the openai SDK raises ``APIError`` on it)."""
        return None, {"error": {"message": message, "type": "server_error", "param": None, "code": "server_error"}}


# -- OpenAI Responses ----------------------------------------------------------------------------------
def _responses_items(g: Generation) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if g.text or not g.tool_calls:
        items.append(
            {
                "type": "message",
                "id": "msg_" + g.call_id,
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": g.text, "annotations": [], "logprobs": []}],
            }
        )
    for c in g.tool_calls:
        items.append(
            {
                "type": "function_call",
                "id": "fc_" + c.id,
                "call_id": c.id,
                "name": c.name,
                "arguments": c.arguments_json,
                "status": "completed",
            }
        )
    return items


class Responses(Protocol):
    name, path, items_field = "responses", "/v1/responses", "input"

    def parse(self, body: dict[str, Any], default_max: int) -> Conversation:
        msgs: list[dict[str, Any]] = []
        if body.get("instructions"):
            msgs.append({"role": "system", "content": body["instructions"]})
        inp = body.get("input", [])
        if isinstance(inp, str):
            inp = [{"role": "user", "content": inp}]
        for item in inp:
            kind = item.get("type", "message")
            if kind == "message":
                role = "system" if item.get("role") == "developer" else item.get("role")
                if role == "assistant":
                    msgs.append(assistant_message(text_of(item.get("content")), []))
                else:
                    msgs.append({"role": role, "content": user_content(item.get("content"))})
            elif kind == "function_call":
                if not msgs or msgs[-1]["role"] != "assistant":
                    msgs.append(assistant_message("", []))
                call = assistant_message("", [(item["call_id"], item["name"], item.get("arguments", ""))])
                msgs[-1].setdefault("tool_calls", []).extend(call["tool_calls"])
            elif kind == "function_call_output":
                msgs.append({"role": "tool", "tool_call_id": item["call_id"], "content": text_of(item.get("output"))})
            # reasoning items carry no text the template renders; they are dropped
        tools = [
            canonical_tool(t["name"], t.get("description"), t.get("parameters"))
            for t in body.get("tools") or []
            if t.get("type") == "function"
        ]
        return conversation(body, msgs, tools, body.get("max_output_tokens") or default_max)

    def response(
        self, g: Generation, conv: Conversation, body: dict[str, Any], status: str | None = None, output=None
    ) -> dict[str, Any]:
        """The response object; ``status`` and ``output`` given: a stream's opening one (no usage yet)."""
        done = status is None
        status = status or ("incomplete" if g.finish == "length" else "completed")
        return {
            "id": "resp_" + g.call_id,
            "object": "response",
            "created_at": int(time.time()),
            "status": status,
            "model": conv.model,
            "output": _responses_items(g) if output is None else output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "error": None,
            "usage": {
                "input_tokens": g.prompt_tokens,
                "output_tokens": g.completion_tokens,
                "total_tokens": g.prompt_tokens + g.completion_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            }
            if done
            else None,
        }

    async def events(self, s: GenerationStream, conv: Conversation, body: dict[str, Any]) -> Events:
        seq = 0

        def ev(kind: str, **data: Any) -> tuple[str, dict[str, Any]]:
            nonlocal seq
            out = (kind, {"type": kind, "sequence_number": seq, **data})
            seq += 1
            return out

        opening = self.response(_opening(s), conv, body, "in_progress", [])
        yield ev("response.created", response=opening)
        yield ev("response.in_progress", response=opening)
        msg_id = "msg_" + s.call_id  # the message item is output 0 whenever there is one (``_responses_items``)
        where = dict(item_id=msg_id, output_index=0, content_index=0)

        def open_message() -> list[tuple[str, dict[str, Any]]]:
            item = {"type": "message", "id": msg_id, "status": "in_progress", "role": "assistant", "content": []}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            return [
                ev("response.output_item.added", output_index=0, item=item),
                ev("response.content_part.added", **where, part=part),
            ]

        opened = False
        async for delta in s:
            if not opened:
                for e in open_message():
                    yield e
                opened = True
            yield ev("response.output_text.delta", **where, delta=delta, logprobs=[])
        g = s.generation
        for oi, item in enumerate(_responses_items(g)):
            if item["type"] == "message":
                if not opened:
                    for e in open_message():
                        yield e
                yield ev("response.output_text.done", **where, text=g.text, logprobs=[])
                yield ev("response.content_part.done", **where, part=item["content"][0])
            else:
                added = {**item, "status": "in_progress", "arguments": ""}
                yield ev("response.output_item.added", output_index=oi, item=added)
                for p in _pieces(item["arguments"]):
                    yield ev("response.function_call_arguments.delta", item_id=item["id"], output_index=oi, delta=p)
                yield ev(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=oi,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            yield ev("response.output_item.done", output_index=oi, item=item)
        final = self.response(g, conv, body)
        yield ev("response.incomplete" if final["status"] == "incomplete" else "response.completed", response=final)

    def stream_error(self, message: str, n_sent: int) -> tuple[str | None, Any]:
        """The Responses ``error`` event (its ``sequence_number`` continues the stream's)."""
        data = {"type": "error", "code": "server_error", "message": message, "param": None, "sequence_number": n_sent}
        return "error", data


# -- Anthropic Messages --------------------------------------------------------------------------------
_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_ANTHROPIC_ERRORS = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    503: "api_error",
}


def _blocks(g: Generation) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if g.text or not g.tool_calls:
        blocks.append({"type": "text", "text": g.text})
    for c in g.tool_calls:
        blocks.append({"type": "tool_use", "id": "toolu_" + c.id[5:], "name": c.name, "input": c.arguments})
    return blocks


class Messages(Protocol):
    name, path, extra_paths = "messages", "/v1/messages", ("/v1/messages/count_tokens",)

    def parse(self, body: dict[str, Any], default_max: int) -> Conversation:
        msgs: list[dict[str, Any]] = []
        if body.get("system"):
            msgs.append({"role": "system", "content": text_of(body["system"])})
        for m in body.get("messages", []):
            content = m.get("content")
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else (content or [])
            if m.get("role") == "assistant":
                text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
                calls = [(b["id"], b["name"], b.get("input") or {}) for b in blocks if b.get("type") == "tool_use"]
                msgs.append(assistant_message(text, calls))
                continue
            parts: list[dict[str, Any]] = []
            for b in blocks:
                if b.get("type") == "tool_result":
                    out = text_of(b.get("content"))
                    if b.get("is_error"):
                        out = "Error: " + out
                    msgs.append({"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": out})
                elif b.get("type") in ("text", "image"):
                    parts.append(b)
            if parts:
                msgs.append({"role": "user", "content": user_content(parts)})
        tools = [
            canonical_tool(t["name"], t.get("description"), t.get("input_schema")) for t in body.get("tools") or []
        ]
        return conversation(body, msgs, tools, body.get("max_tokens") or default_max)

    def response(self, g: Generation, conv: Conversation, body: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": "msg_" + g.call_id,
            "type": "message",
            "role": "assistant",
            "model": conv.model,
            "content": _blocks(g),
            "stop_reason": _STOP[g.finish],
            "stop_sequence": None,
            "usage": {"input_tokens": g.prompt_tokens, "output_tokens": g.completion_tokens},
        }

    async def events(self, s: GenerationStream, conv: Conversation, body: dict[str, Any]) -> Events:
        start = self.response(_opening(s), conv, body)
        start.update(content=[], stop_reason=None, usage={"input_tokens": s.prompt_tokens, "output_tokens": 0})
        yield "message_start", {"type": "message_start", "message": start}
        text_start = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
        opened = False  # the text block is block 0 whenever there is one (``_blocks``)
        async for delta in s:
            if not opened:
                yield "content_block_start", text_start
                opened = True
            text_delta = {"type": "text_delta", "text": delta}
            yield "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": text_delta}
        g = s.generation
        for i, b in enumerate(_blocks(g)):
            if b["type"] == "text":
                if not opened:
                    yield "content_block_start", text_start
            else:
                block = {**b, "input": {}}
                yield "content_block_start", {"type": "content_block_start", "index": i, "content_block": block}
                for p in _pieces(json.dumps(b["input"])):
                    delta = {"type": "input_json_delta", "partial_json": p}
                    yield "content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}
            yield "content_block_stop", {"type": "content_block_stop", "index": i}
        stop = {"stop_reason": _STOP[g.finish], "stop_sequence": None}
        yield "message_delta", {"type": "message_delta", "delta": stop, "usage": {"output_tokens": g.completion_tokens}}
        yield "message_stop", {"type": "message_stop"}

    def stream_error(self, message: str, n_sent: int) -> tuple[str | None, Any]:
        """Anthropic's ``error`` event (the anthropic SDK raises an API error on it)."""
        return "error", {"type": "error", "error": {"type": "api_error", "message": message}}

    def error(self, status: int, message: str, code: str) -> dict[str, Any]:
        kind = _ANTHROPIC_ERRORS.get(status, "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": message, "code": code}}


PROTOCOLS: tuple[Protocol, ...] = (ChatCompletions(), Responses(), Messages())
"""The gateway's protocols, in the order the app mounts them."""
MESSAGES = PROTOCOLS[2]
"""Anthropic Messages (its ``count_tokens`` endpoint parses with it)."""


# -- SSE framing ---------------------------------------------------------------------------------------
def _frame(name: str | None, data: Any) -> str:
    payload = data if isinstance(data, str) else json.dumps(data)
    return (f"event: {name}\n" if name else "") + f"data: {payload}\n\n"


async def sse(events: Events, protocol: Protocol) -> AsyncIterator[str]:
    """Server-sent-event framing: ``event: NAME`` (when named) + one ``data:`` line + a blank line. A failure while
    streaming (e.g. the engine's) is logged with its traceback and ends the stream with the protocol's own error
    event (``protocol.stream_error``), so the harness gets an API error instead of a cut connection."""
    n_sent = 0
    try:
        async for name, data in events:
            yield _frame(name, data)
            n_sent += 1
    except Exception as e:
        log.exception("stream failed after %d events", n_sent)
        yield _frame(*protocol.stream_error(f"{type(e).__name__}: {e}", n_sent))
