"""``IncrementalDecoder``: decoding only the ids past the last character boundary gives, at every prefix of an
output, exactly the whole decode (the tiny byte-level BPE, with multi-byte characters, added tokens and random ids);
tokenizers whose decode is not plain byte concatenation are decoded whole."""

from __future__ import annotations

import copy
import random

from posttrain.agentic.gateway import IncrementalDecoder, byte_level_decode
from posttrain.tiny.agentic import build_tokenizer

TEXTS = [
    "naïve café → 数学 ✓ 🙂 done",
    'Let me fix it.<tool_call>{"name": "write_file", "arguments": {"path": "é.py"}}</tool_call><|im_end|>',
    "a < b <|im_start|>user\nok<|im_end|>\n",
]


def prefixes_agree(tok, ids: list[int]) -> int:
    dec = IncrementalDecoder(tok, incremental=True)
    for k in range(len(ids) + 1):
        assert dec(ids[:k]) == tok.decode(ids[:k], skip_special_tokens=False), (ids, k)
    return dec._n


def test_incremental_decode_equals_the_whole_decode_at_every_prefix():
    tok = build_tokenizer()
    assert byte_level_decode(tok)
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert prefixes_agree(tok, ids) == len(ids)  # the boundary reached the end: the tail stayed short
    rng = random.Random(0)
    for _ in range(50):  # random ids: lone continuation bytes, half characters, special tokens anywhere
        prefixes_agree(tok, [rng.randrange(len(tok)) for _ in range(rng.randrange(1, 40))])


def test_a_tokenizer_with_space_clean_up_is_decoded_whole():
    tok = copy.deepcopy(build_tokenizer())
    tok.clean_up_tokenization_spaces = True  # " ." -> "." depends on the text before: not concatenable
    assert not byte_level_decode(tok)
