"""A tiny tokenizer with a tool-calling chat template, and a tiny model to serve through the gateway.

The tokenizer is a byte-level BPE trained here, in milliseconds, on a built-in corpus (nothing is
downloaded), wrapped as a ``PreTrainedTokenizerFast`` with a Qwen/Hermes-style Jinja chat template:
roles system/user/assistant/tool between ``<|im_start|>ROLE\\n`` and ``<|im_end|>\\n``; tool definitions
listed in the system turn; an assistant tool call rendered as

    <tool_call>{"name": NAME, "arguments": {...}}</tool_call>

(``json.dumps`` with default separators, ``name`` before ``arguments``) right after the assistant's text
and before ``<|im_end|>``: the markup ``posttrain/toolcall.py`` defines, which the gateway parses.

    python -c "from pathlib import Path; from posttrain.tiny.agentic import write_tiny_agentic; \\
print(write_tiny_agentic(Path('/tmp/tiny-agentic')))"
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from posttrain import toolcall

IM_START, IM_END, EOS = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TOOL_OPEN, TOOL_CLOSE = toolcall.OPEN, toolcall.CLOSE
SPECIAL = (EOS, IM_START, IM_END)

CHAT_TEMPLATE = (
    "{%- if messages and messages[0].role == 'system' -%}"
    "{%- set sys = messages[0].content -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}{%- set sys = '' -%}{%- set rest = messages -%}{%- endif -%}"
    "{%- if sys or tools -%}{{ '<|im_start|>system\\n' + sys }}"
    "{%- if tools -%}{{ '\\n\\n# Tools\\n<tools>' }}"
    "{%- for t in tools -%}{{ '\\n' + (t | tojson) }}{%- endfor -%}"
    "{{ '\\n</tools>\\nCall a tool with " + toolcall.TEMPLATE_HINT + ".' }}"
    "{%- endif -%}{{ '<|im_end|>\\n' }}{%- endif -%}"
    "{%- for m in rest -%}"
    "{%- if m.role == 'assistant' -%}{{ '<|im_start|>assistant\\n' + (m.content or '') }}"
    "{%- for tc in m.tool_calls or [] -%}" + toolcall.TEMPLATE_CALL + "{%- endfor -%}{{ '<|im_end|>\\n' }}"
    "{%- else -%}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

_CORPUS = [
    "You are a helpful coding assistant. Fix the bug so that the tests pass.",
    "def add(a, b):\n    return a + b\n\ndef test_add():\n    assert add(1, 2) == 3\n",
    '{"name": "write_file", "arguments": {"path": "calc.py", "content": "def add(a, b):\\n    return a + b\\n"}}',
    '{"name": "run_tests", "arguments": {}}',
    "The tests passed. 3 passed, 0 failed. Error: AssertionError in test_sub. Done.",
    "What is the weather in Paris? It is sunny and 21 degrees. Hello, world! Thanks.",
    "import os\nimport sys\nfor i in range(10):\n    print(i)\nclass Foo:\n    pass\n",
]


@lru_cache(maxsize=4)
def build_tokenizer(vocab_size: int = 1024):
    """The tiny tokenizer (deterministic: same corpus, same merges). Ids < ``vocab_size``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 2,
        special_tokens=list(SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=EOS)
    fast.add_tokens([TOOL_OPEN, TOOL_CLOSE])
    fast.chat_template = CHAT_TEMPLATE
    if len(fast) > vocab_size:
        raise ValueError(f"tokenizer has {len(fast)} ids > vocab {vocab_size}")
    return fast


def write_tiny_agentic(out_dir: Path, vocab_size: int = 1024, hidden_size: int = 64, seed: int = 0) -> Path:
    """Write a servable tiny model: random 2-layer Qwen2 + this tokenizer (with its chat template)."""
    from posttrain.tiny.lm import build_tiny_causal_lm

    out_dir = Path(out_dir)
    build_tiny_causal_lm(vocab_size, hidden_size, seed).save_pretrained(out_dir)
    build_tokenizer(vocab_size).save_pretrained(out_dir)
    return out_dir
