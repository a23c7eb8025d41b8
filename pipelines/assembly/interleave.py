"""Kept pages of one document → interleaved text/image segments, then tokenised.

Pure and Beam-free: the Beam job calls :func:`interleave_document` per document.

Pages are stitched in page order; within a page, ``Page.content()`` fixes reading order. Consecutive
text blocks of one page merge into one text segment (paragraphs joined by a blank line); every cropped
figure/table/equation is one atomic image segment at its position; captions stay text. Segment text
boundaries never cross a page, so every segment keeps its ``page_index`` provenance.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from formats.records import Block, Page
from formats.shards import Segment, ShardImage

PARAGRAPH_SEP = "\n\n"


@dataclass(frozen=True)
class ImageTokenRule:
    """How many context tokens an image costs: ⌈h/patch⌉·⌈w/patch⌉, clamped (Qwen2-VL's 28-px merged patches)."""

    patch: int = 28
    """Pixels per side of one image token (Qwen2-VL: 14-px patches merged 2×2)."""
    max_tokens: int = 16384
    """Cap per image (Qwen2-VL's default max_pixels = 16384·28·28); larger images are resized by the model."""
    min_tokens: int = 4
    """Floor per image (Qwen2-VL's min_pixels = 4·28·28)."""
    extra_tokens: int = 0
    """Tokens added per image for delimiters (e.g. 2 for <|vision_start|>/<|vision_end|>)."""

    def __call__(self, width: int, height: int) -> int:
        n = math.ceil(height / self.patch) * math.ceil(width / self.patch)
        return min(self.max_tokens, max(self.min_tokens, n)) + self.extra_tokens


@dataclass(frozen=True)
class RawSegment:
    """A segment before tokenisation."""

    kind: str  # "text" | "image"
    page_index: int
    text: str = ""
    image: ShardImage | None = None


def page_segments(pages: Iterable[Page]) -> list[RawSegment]:
    """Pages (any order) → raw segments in document order."""
    out: list[RawSegment] = []
    for page in sorted(pages, key=lambda p: p.page_index):
        texts: list[str] = []
        for kind, block in page.content():
            if kind == "text":
                texts.append(block.text.strip())
                continue
            if texts:  # text before this image becomes one segment
                out.append(RawSegment("text", page.page_index, text=PARAGRAPH_SEP.join(texts)))
                texts = []
            crop = block.crop
            assert crop is not None
            text, text_from = equation_text(block)
            image = ShardImage(crop.sha256, crop.png, crop.width, crop.height, block.kind, text, text_from)
            out.append(RawSegment("image", page.page_index, image=image))
        if texts:
            out.append(RawSegment("text", page.page_index, text=PARAGRAPH_SEP.join(texts)))
        # Pages are separated by a paragraph break so text of consecutive pages does not run together.
        if out and out[-1].kind == "text" and out[-1].page_index == page.page_index:
            last = out[-1]
            out[-1] = RawSegment("text", last.page_index, text=last.text + PARAGRAPH_SEP)
    return out


def equation_text(block: Block) -> tuple[str, str]:
    """(text, where from) an equation crop keeps beside its image: the backend's LaTeX (``latex``), else the text the
    parse read (``Block.text_from``: ``text-layer-math`` glyphs or ``ocr``; ``backend`` when the backend read it);
    ("", "") for other kinds and for equations read as nothing."""
    if block.kind != "equation":
        return "", ""
    if block.latex and block.latex.strip():
        return block.latex.strip(), "latex"
    text = " ".join(block.text.split())
    return (text, block.text_from or "backend") if text else ("", "")


class Tokenizer:
    """A Hugging Face tokenizer by name or local path, loaded once per process.

    Only token ids and character offsets are used, so any fast tokenizer works.
    """

    def __init__(self, name_or_path: str):
        if not name_or_path:
            raise ValueError("no tokenizer: give a name or path (scifolio build resolves the default, SmolLM2's)")
        self.name_or_path = name_or_path
        self._tok = _load_tokenizer(name_or_path)

    def encode_batch(self, texts: Sequence[str]) -> list[tuple[list[int], list[int]]]:
        """Texts → (token ids, char start offset per token), one batched call into the Rust tokenizer."""
        if not texts:
            return []
        enc = self._tok(list(texts), add_special_tokens=False, return_offsets_mapping=True)
        out = []
        for ids, offsets in zip(enc["input_ids"], enc["offset_mapping"]):
            out.append((list(ids), [int(s) for s, _ in offsets]))
        return out


@lru_cache(maxsize=4)
def _load_tokenizer(name_or_path: str) -> Any:
    from transformers import AutoTokenizer

    local = os.path.isdir(name_or_path)
    tok = AutoTokenizer.from_pretrained(name_or_path, local_files_only=local)
    if not getattr(tok, "is_fast", False):
        raise ValueError(f"tokenizer {name_or_path!r} is not a fast tokenizer; offsets are needed for chunking")
    return tok


@dataclass(frozen=True)
class TokenizedSegment:
    """A tokenised segment plus the char offsets the chunker needs to split text losslessly."""

    segment: Segment
    offsets: tuple[int, ...] = ()
    image: ShardImage | None = None


def tokenize_segments(
    raw: Sequence[RawSegment], tokenizer: Tokenizer, image_tokens: ImageTokenRule = ImageTokenRule()
) -> list[TokenizedSegment]:
    texts = [r.text for r in raw if r.kind == "text"]
    encoded = iter(tokenizer.encode_batch(texts))
    out: list[TokenizedSegment] = []
    for r in raw:
        if r.kind == "text":
            ids, offsets = next(encoded)
            if not ids:
                continue
            seg = Segment("text", len(ids), r.page_index, text=r.text, token_ids=tuple(ids))
            out.append(TokenizedSegment(seg, tuple(offsets)))
        else:
            img = r.image
            assert img is not None
            n = image_tokens(img.width, img.height)
            seg = Segment("image", n, r.page_index, image_sha256=img.sha256)
            out.append(TokenizedSegment(seg, image=img))
    return out


def interleave_document(
    pages: Iterable[Page], tokenizer: Tokenizer, image_tokens: ImageTokenRule = ImageTokenRule()
) -> list[TokenizedSegment]:
    """Kept pages of one document → tokenised interleaved segments in document order."""
    return tokenize_segments(page_segments(pages), tokenizer, image_tokens)
