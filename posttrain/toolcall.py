"""The tool-call markup: the one definition of how a model's output carries a tool call (Qwen/Hermes format).

    TEXT<tool_call>{"name": NAME, "arguments": {...}}</tool_call>...

``render`` writes a call (``json.dumps``, default separators, ``name`` before ``arguments``), ``TEMPLATE_CALL`` is
the same in a Jinja chat template (``tc`` an OpenAI-style tool call; the tiny tokenizer's template,
``posttrain/tiny/agentic.py``), ``parse`` reads a generated output back. Everyone imports it from here: the
gateway's parser and its streaming hold-back (``agentic/chat.py``, ``agentic/gateway.py``), the scripted agents
(``agentic/rl.py``), the harness's format-error check (``agentic/tasks.py``) and the tiny template. A leaf: it
imports nothing of ours.

    pytest tests/posttrain/agentic/test_gateway_sdk.py
"""

from __future__ import annotations

import json
import re
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
"""The markers (added tokens of the tiny tokenizer)."""
_BLOCK = re.compile(re.escape(OPEN) + "(.*?)" + re.escape(CLOSE), re.DOTALL)

TEMPLATE_CALL = (
    "{{ '" + OPEN + "' + ({'name': tc.function.name, 'arguments': tc.function.arguments} | tojson) + '" + CLOSE + "' }}"
)
"""Jinja: one tool call ``tc`` (``{"function": {"name", "arguments"}}``) rendered as ``render`` writes it."""
TEMPLATE_HINT = OPEN + '{"name": NAME, "arguments": ARGS}' + CLOSE
"""How a system prompt tells the model to call a tool."""


def render(name: str, arguments: dict[str, Any], text: str = "") -> str:
    """``text`` followed by one tool call, as the model emits it."""
    return text + OPEN + json.dumps({"name": name, "arguments": arguments}) + CLOSE


def parse(text: str, finish_reason: str) -> tuple[str, list[tuple[str, dict[str, Any]]], bool]:
    """Split a generated output (stop token already removed) into (content, [(name, arguments)], well_formed).

    ``content`` is the text before the first ``<tool_call>``; each block is one call. A block that is not valid JSON
    with a string ``name`` and an object ``arguments``, a ``</tool_call>`` without an opening, or calls in an output
    cut by the length limit make the output *malformed*: the whole text is content, no call, ``well_formed`` False.
    """
    first = text.find(OPEN)
    if first < 0:
        return text, [], CLOSE not in text
    calls: list[tuple[str, dict[str, Any]]] = []
    for m in _BLOCK.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            return text, [], False
        if not (isinstance(obj, dict) and isinstance(obj.get("name"), str) and isinstance(obj.get("arguments"), dict)):
            return text, [], False
        calls.append((obj["name"], obj["arguments"]))
    if not calls or finish_reason == "length":
        return text, [], False
    return text[:first], calls, True


def held_prefix(text: str, markers: tuple[str, ...] = (OPEN,)) -> int:
    """Characters at the end of ``text`` that begin one of ``markers`` (a streamed text holds them back: the next
    token may complete a ``<tool_call>``)."""
    return max((k for m in markers for k in range(1, len(m)) if text.endswith(m[:k])), default=0)
