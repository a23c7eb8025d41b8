"""Examples as token ids, padded batches, and the models' forward passes shared by every Memory Decoder stage.

An example is ``[BOS] question answer [EOS]``; the positions that count (datastore keys, losses, perplexity) are
the answer side: every t ≥ ``answer_start`` is predicted from the prefix ``ids[:t]``, whose encoding is the hidden
state at t−1. A ``{"text"}`` row is an answer with an empty question.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from formats import fs
from posttrain.fit import right_pad

POSITION_BITS = 20  # datastore id = example index << 20 | position: 1M positions per example, 2^43 examples


@dataclass(frozen=True)
class Example:
    """One tokenised example."""

    index: int
    """Row number in its jsonl file (stable across runs: the datastore id is derived from it)."""
    ids: tuple[int, ...]
    """``[BOS] question answer [EOS]`` token ids."""
    answer_start: int
    """First predicted position (≥ 1)."""

    def positions(self) -> range:
        return range(self.answer_start, len(self.ids))


def encode_rows(rows: Sequence[dict], tokenizer, max_len: int, start: int = 0) -> list[Example]:
    """Tokenise rows (``question``/``answer`` or ``text``); ``start`` offsets the stored indices."""
    out = []
    for i, row in enumerate(rows):
        if "answer" in row:
            q, a = row.get("question", ""), row["answer"]
        elif "text" in row:
            q, a = "", row["text"]
        else:
            raise ValueError(f"row {start + i} has neither 'answer' nor 'text': {sorted(row)}")
        q_ids = tokenizer(q, add_special_tokens=False)["input_ids"] if q else []
        a_ids = tokenizer(a, add_special_tokens=False)["input_ids"]
        ids = ([tokenizer.bos_token_id] + q_ids + a_ids + [tokenizer.eos_token_id])[:max_len]
        answer_start = 1 + len(q_ids)
        if answer_start >= len(ids):
            continue  # the question alone fills max_len: nothing answer-side to store or score
        out.append(Example(index=start + i, ids=tuple(ids), answer_start=answer_start))
    return out


def load_examples(path: str | Path, tokenizer, max_len: int) -> list[Example]:
    return encode_rows(fs.read_jsonl(path), tokenizer, max_len)


SHARD_SOURCE_OFFSET = 1 << 40  # example indices of the corpus-shard source start here (ids stay below 2^63)


def shard_texts(out: str | Path) -> Iterator[str]:
    """The text of every chunk of a build output directory (``scifolio build --out``): its text segments joined,
    in the manifest's shard order, row and segment order (so indices are stable across runs), read through
    ``formats.shards`` one row batch at a time."""
    from formats.shards import ShardFile, list_shards

    for path in list_shards(out):
        for chunk in ShardFile(path).iter_chunks(parts=("segments",)):
            text = " ".join(s.text for s in chunk.segments if s.kind == "text" and s.text)
            if text.strip():
                yield text


def shard_examples(shards_dir: str | Path, tokenizer, max_len: int) -> list[Example]:
    """Corpus text as answer-only examples: each chunk's tokens cut into windows of ``max_len − 2`` after a BOS;
    only a chunk's last window ends in EOS (the text goes on after the others: an EOS there would be a target the
    text never has). Indices start at ``SHARD_SOURCE_OFFSET``, so their datastore ids never meet the SFT
    source's."""
    out: list[Example] = []
    width = max(1, max_len - 2)
    for text in shard_texts(shards_dir):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        for start in range(0, len(ids), width):
            window = ids[start : start + width]
            end = (tokenizer.eos_token_id,) if start + width >= len(ids) else ()
            full = (tokenizer.bos_token_id, *window, *end)
            out.append(Example(index=SHARD_SOURCE_OFFSET + len(out), ids=full, answer_start=1))
    return out


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    if tok.bos_token_id is None or tok.eos_token_id is None or tok.pad_token_id is None:
        raise ValueError(f"tokenizer {path} needs bos, eos and pad tokens")
    return tok


def load_lm(path: str):
    """A frozen-by-default causal LM in eval mode."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).eval()


@dataclass(frozen=True)
class Batch:
    """Right-padded ids with the mask of predicted positions (answer side) and who is domain."""

    ids: Tensor
    """``[B, T]`` int64."""
    attention: Tensor
    """``[B, T]`` 1 on real tokens."""
    predict: Tensor
    """``[B, T]`` bool: position t is predicted from ids[:t] (its logits sit at t−1)."""


def collate(examples: Sequence[Example], pad_id: int) -> Batch:
    ids, att = right_pad([e.ids for e in examples], pad_id)
    pred = torch.zeros_like(ids, dtype=torch.bool)
    for b, e in enumerate(examples):
        pred[b, e.answer_start : len(e.ids)] = True
    return Batch(ids=ids, attention=att, predict=pred)


def forward(model, batch: Batch) -> tuple[Tensor, Tensor]:
    """``(logits [B, T, V], last hidden [B, T, H])`` of a causal LM (position t's outputs predict token t+1)."""
    out = model(input_ids=batch.ids, attention_mask=batch.attention, output_hidden_states=True)
    return out.logits, out.hidden_states[-1]


def shifted(x: Tensor, batch: Batch) -> Tensor:
    """Rows of ``x [B, T, …]`` that predict the answer-side tokens, flattened in (b, t) order: ``[n, …]``."""
    return x[:, :-1][batch.predict[:, 1:]]


def gold(batch: Batch) -> Tensor:
    return batch.ids[batch.predict]


def batches(examples: Sequence[Example], size: int, seed: int, start_step: int = 0) -> Iterator[list[Example]]:
    """Endless shuffled batches; step s always gets the same batch (a resumed run continues the sequence)."""
    n = len(examples)
    per_epoch = max(1, n // size)
    step = start_step
    while True:
        epoch, i = divmod(step, per_epoch)
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        order = torch.randperm(n, generator=g).tolist()
        yield [examples[j] for j in order[i * size : (i + 1) * size]]
        step += 1
