"""Images in gateway calls, keyed by content hash in the text the trace store matches and keeps.

A vision-language model renders every image as the same placeholder text and ids, so a PrefixTree matched on them
would reuse one image's stored context (and its logprobs) for another. The gateway matches and stores *keyed text*
instead, where the k-th placeholder reads ``<image sha256=H>`` (H: the SHA-256 of the image's encoded bytes); a
keyed delta is encoded by expanding each marker to the processor's placeholder ids, and the engine gets the pixel
values of the prompt's images, in order. The store keeps the markers, never pixels; pixel values are cached by hash
(a harness re-sends its history's images on every call).

Image parts are data URLs; local paths only under ``GatewayConfig.image_root`` (the gateway reads no other file of
its host, and downloads nothing). A part that cannot be used is a ``BadImage`` with its reason
(``formats.chat_images.REASONS``), which the gateway answers with HTTP 400.

Serve a ``pretrain export --vlm`` model: ``scifolio posttrain gateway --model DIR``; tests:
``pytest tests/posttrain/agentic/test_gateway_images.py``.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import OrderedDict
from typing import Any

from formats.chat_images import BadImage, ImageLimits, decode_image, image_bytes, resolve

MARKER = re.compile(r"<image sha256=([0-9a-f]{64})>")


class ImageKeys:
    """The gateway's image side for one processor (``transformers`` ``LlavaProcessor`` or alike)."""

    def __init__(
        self, processor: Any, image_root: str | None = None, limits: ImageLimits = ImageLimits(), cache: int = 256
    ) -> None:
        self.processor = processor
        self.token = processor.image_token
        self.token_id = processor.tokenizer.convert_tokens_to_ids(self.token)
        self.image_root = os.path.realpath(image_root) if image_root else None
        self.limits = limits
        self._cache: OrderedDict[str, tuple[Any, int, Any]] = OrderedDict()
        """hash → (pixel values [1, C, H, W], placeholder ids it expands to, the decoded image)"""
        self._size = cache

    def resolve(self, messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
        """Messages with each image part as ``{"type": "image"}`` (what the chat template renders as the
        placeholder) and the images' hashes in order; each new image is decoded and processed once."""
        out, hashes = resolve(messages, load=lambda part: self._add(self._bytes(part)))
        while len(self._cache) > max(self._size, len(set(hashes))):  # this call's images are the newest
            self._cache.popitem(last=False)
        return out, hashes

    def key(self, text: str, hashes: list[str]) -> str:
        """The rendered text with its k-th placeholder replaced by the k-th image's marker."""
        pieces = text.split(self.token)
        if len(pieces) - 1 != len(hashes):
            raise ValueError(
                f"the conversation renders {len(pieces) - 1} {self.token} placeholders for {len(hashes)} images "
                f"(a text part that spells {self.token} is not an image)"
            )
        return pieces[0] + "".join(f"<image sha256={h}>{p}" for h, p in zip(hashes, pieces[1:]))

    def encode(self, keyed: str, tokenizer: Any) -> list[int]:
        """Ids of keyed text: the text between markers tokenised, each marker its image's placeholder ids."""
        ids: list[int] = []
        for i, piece in enumerate(MARKER.split(keyed)):  # text, hash, text, ..., text
            if i % 2:
                ids += [self.token_id] * self._cache[piece][1]
            elif piece:
                ids += tokenizer.encode(piece, add_special_tokens=False)
        return ids

    def pixels(self, hashes: list[str]) -> tuple[Any, tuple]:
        """The images' pixel values stacked in order (the HF engine's prefill), and the decoded images (vLLM's)."""
        import torch

        return torch.cat([self._cache[h][0] for h in hashes]), tuple(self._cache[h][2] for h in hashes)

    def _bytes(self, part: dict[str, Any]) -> bytes:
        url = part["image_url"]["url"]
        if url.startswith("data:") or ("://" in url and not url.startswith("file://")):
            return image_bytes(part, None, self.limits)  # a URL other than data: is refused there (unsupported_url)
        if self.image_root is None:
            raise BadImage("unsupported_url", f"{url[:60]}: the gateway takes data URLs (no image_root is set)")
        path = os.path.realpath(os.path.join(self.image_root, url.removeprefix("file://")))
        if os.path.commonpath([path, self.image_root]) != self.image_root:
            raise BadImage("unsupported_url", f"{url[:60]}: outside image_root {self.image_root}")
        return image_bytes({"image_url": {"url": path}}, None, self.limits)

    def _add(self, data: bytes) -> str:
        h = hashlib.sha256(data).hexdigest()
        if h in self._cache:
            self._cache.move_to_end(h)
            return h
        img = decode_image(data, self.limits)
        enc = self.processor(text=self.token, images=[img], return_tensors="pt", add_special_tokens=False)
        self._cache[h] = (enc["pixel_values"], int((enc["input_ids"][0] == self.token_id).sum()), img)
        return h
