"""Chat rows for the SFT tests: system, user, assistant and tool messages with OpenAI-shaped tool calls, whose
assistant answers are a fixed function of what the row shows (a sum from an 8-entry table, a word to repeat), so a
tiny model memorises 32 of them in a few dozen steps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

WORDS = ("alpha", "beta", "gamma", "delta", "omega", "sigma", "theta", "kappa")


def chat_rows(n: int = 32) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        a, b = i % 4 + 1, i // 16 + 1  # an 8-entry sum table, each entry in 4 rows
        word = WORDS[i % len(WORDS)]
        tool = " with the tool" if i % 4 == 0 else ""
        msgs: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a terse lab assistant."},
            {"role": "user", "content": f"Sample {i}: add {a} and {b}{tool}, then say {word}."},
        ]
        if tool:  # a tool round trip: the call and the final answer are trained, the tool's reply is not
            args = json.dumps({"a": a, "b": b})
            msgs.append(
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": f"c{i}", "type": "function", "function": {"name": "add", "arguments": args}}
                ]}
            )  # fmt: skip
            msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": str(a + b)})
        msgs.append({"role": "assistant", "content": f"{a + b} {word}"})
        rows.append({"messages": msgs})
    return rows


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def tiny_chat_model(out: Path, seed: int = 0) -> Path:
    """The pre-training tiny tokenizer (BPE) + a 2-layer Qwen2 over its vocabulary, saved as a HF directory."""
    import torch
    from transformers import AutoTokenizer

    from pipelines.tiny import write_tiny_tokenizer
    from posttrain.tiny.lm import causal_lm

    tok = AutoTokenizer.from_pretrained(write_tiny_tokenizer(out / "tokenizer"))
    torch.manual_seed(seed)
    causal_lm(len(tok), 64, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id).save_pretrained(out / "lm")
    tok.save_pretrained(out / "lm")
    return out / "lm"
