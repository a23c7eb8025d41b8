"""The gateway's canonical conversation and the one tool-call format it parses.

Every protocol adapter (``protocols.py``) turns its request into a ``Conversation``: OpenAI-chat-like
messages (``role`` system/user/assistant/tool, ``content`` a string, assistant ``tool_calls`` with
``arguments`` as a dict) plus tool definitions ``{"type": "function", "function": {name, description,
parameters}}``. The model's chat template renders that to text (``render``).

Generated text is parsed in the tool-call markup of ``posttrain/toolcall.py`` (``parse_output``); a malformed
output is returned as plain text (no tool call) and flagged for the process annotator (SPEC §C7).

A call's result is a ``Generation``; a streaming call's is a ``GenerationStream`` (text deltas, then the
``Generation``), which the protocols' ``events`` turn into SSE.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from posttrain import toolcall


@dataclass
class Conversation:
    """A protocol-neutral request: what the chat template renders, and how to sample."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stream: bool = False
    model: str = "scifolio"


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments)


@dataclass
class Generation:
    """One model call's result, before any protocol envelope."""

    text: str
    """Assistant text (before the first tool call; stop token removed)."""
    tool_calls: list[ToolCall]
    finish: str
    """"stop" | "length" | "tool_calls"."""
    prompt_tokens: int
    completion_tokens: int
    well_formed: bool = True
    call_id: str = ""
    """Trace-store id of this model call."""


class GenerationStream:
    """One streaming model call (``Gateway.stream``), protocol-neutral.

    ``call_id`` and ``prompt_tokens`` are known before the first token (protocols put them in their opening event).
    ``async for delta in stream`` yields final assistant text as the engine generates it; the deltas concatenate to
    ``generation.text``. After the loop ``generation`` holds tool calls, finish reason and usage (the call is
    already in the trace store). A failure of the call is raised from the loop.
    """

    def __init__(self, call_id: str, prompt_tokens: int) -> None:
        self.call_id = call_id
        self.prompt_tokens = prompt_tokens
        self.generation: Generation | None = None
        self._queue: asyncio.Queue = asyncio.Queue()
        self.on_abandon: Callable[[], None] | None = None
        """What ``abandon`` runs (the gateway aborts the engine request)."""

    def abandon(self) -> None:
        """The reader went away before the end: stop generating (once; nothing once the call is done)."""
        hook, self.on_abandon = self.on_abandon, None
        if hook is not None and self.generation is None:
            hook()

    def __aiter__(self) -> GenerationStream:
        return self

    async def __anext__(self) -> str:
        item = await self._queue.get()
        if isinstance(item, str):
            return item
        if isinstance(item, Generation):
            self.generation = item
            raise StopAsyncIteration
        raise item

    def put(self, item: str | Generation | BaseException) -> None:
        """Hand the reader a text delta, the finished ``Generation`` (ends the loop) or the call's failure."""
        self._queue.put_nowait(item)


def parse_output(text: str, finish_reason: str, seed: str) -> tuple[str, list[ToolCall], bool]:
    """Split generated text (stop token already removed) into content and tool calls (``toolcall.parse``), each
    call with a stable id (``call_`` + a hash of ``seed`` and its index)."""
    content, calls, well_formed = toolcall.parse(text, finish_reason)
    ids = ("call_" + hashlib.sha1(f"{seed}/{i}".encode()).hexdigest()[:20] for i in range(len(calls)))
    return content, [ToolCall(c, name, args) for c, (name, args) in zip(ids, calls)], well_formed


def render(tokenizer: Any, conv: Conversation) -> str:
    """The chat template's text for the conversation, ending in the assistant generation prompt."""
    return tokenizer.apply_chat_template(
        conv.messages, tools=conv.tools or None, tokenize=False, add_generation_prompt=True
    )


def canonical_tool(name: str, description: str | None, parameters: dict | None) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": name}
    if description:
        fn["description"] = description
    fn["parameters"] = parameters or {"type": "object", "properties": {}}
    return {"type": "function", "function": fn}


def assistant_message(content: str, calls: list[tuple[str, str, Any]]) -> dict[str, Any]:
    """calls: (id, name, arguments as dict or JSON string)."""
    tool_calls = []
    for cid, name, args in calls:
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                pass  # rendered as the raw string; the trace store forks if it no longer matches
        tool_calls.append({"id": cid, "type": "function", "function": {"name": name, "arguments": args}})
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        msg["tool_calls"] = tool_calls
    return msg


def text_of(content: Any) -> str:
    """Flatten a content field (string or list of text parts/blocks) to a string."""
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for p in content:
        if isinstance(p, str):
            parts.append(p)
        elif isinstance(p, dict) and "text" in p:
            parts.append(p["text"])
        elif isinstance(p, dict) and p.get("type") == "tool_result":
            parts.append(text_of(p.get("content")))
    return "".join(parts)


def image_url(part: Any) -> str | None:
    """The URL of a protocol's image part: OpenAI chat ``image_url`` (``{"url": ...}`` or a string), Responses
    ``input_image`` (``image_url``), Anthropic ``image`` (a base64 ``source`` becomes a data URL, a ``url`` source its
    URL); ``""`` for an image part naming none (``file_id``), None for a part that is not an image."""
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    if kind == "image_url":
        ref = part.get("image_url")
        return str((ref.get("url") if isinstance(ref, dict) else ref) or "")
    if kind == "input_image":
        return str(part.get("image_url") or "")
    if kind == "image":
        src = part.get("source") or {}
        if src.get("type") == "base64":
            return f"data:{src.get('media_type') or 'image/png'};base64,{src.get('data') or ''}"
        return str(src.get("url") or "")
    return None


def user_content(content: Any) -> Any:
    """A user message's canonical content: its text (``text_of``) when it holds no image, else its text and image
    parts in order as ``{"type": "text"}`` and ``{"type": "image_url", "image_url": {"url": ...}}``."""
    if not isinstance(content, list) or all(image_url(p) is None for p in content):
        return text_of(content)
    parts: list[dict[str, Any]] = []
    for p in content:
        url = image_url(p)
        if url is not None:
            parts.append({"type": "image_url", "image_url": {"url": url}})
        elif text := text_of([p]):
            parts.append({"type": "text", "text": text})
    return parts
