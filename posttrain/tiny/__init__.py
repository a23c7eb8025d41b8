"""Tiny random causal LMs for offline smoke runs of distillation, described here and written by the
project's one tiny-model writer (``scifolio models tiny DIR``; ``pipelines.tiny.write_area(DIR, "posttrain")``).

A student and two domain teachers (reasoning, agentic), built from a config with random weights over a
tokenizer with a tool-rendering chat template (saved beside each model): nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from posttrain.tiny.lm import build_tiny_causal_lm, causal_lm

__all__ = ["NAMES", "build_tiny_causal_lm", "causal_lm", "tiny_models"]

NAMES = ("student", "teacher-reasoning", "teacher-agentic")


def tiny_models(kit: Any) -> dict[str, tuple[str, Callable[[], list[Any]]]]:
    """Student and teachers under ``DIR/posttrain-<name>``."""

    def build() -> list[Any]:
        # the agentic tokenizer: byte-level BPE + a chat template that renders tool calls, so the student can be
        # served by `scifolio posttrain gateway`; teachers share the student's vocabulary (distillation needs it)
        from posttrain.tiny.agentic import build_tokenizer

        tok = build_tokenizer(1024)
        return [causal_lm(vocab_size=len(tok)), tok]

    return {name: (f"posttrain-{name}", build) for name in NAMES}
