"""Image parts of chat messages: OpenAI-style content parts → PIL images, checked, with a reason when they fail.

    from formats.chat_images import BadImage, encode_chat, has_images
    ids, pixel_values, images = encode_chat(row["messages"], processor, base_dir="data/")  # raises BadImage(reason)

A message's ``content`` is a string or a list of parts: ``{"type": "text", "text": ...}``, ``{"type": "image_url",
"image_url": {"url": "data:image/png;base64,..."}}`` (a data URL, a local path or a ``file://`` URL; a relative
path is taken from ``base_dir``, the folder of the jsonl that holds the row) or ``{"type": "image"}`` with an
``"image"`` key holding the same. Every image part becomes ``{"type": "image"}`` for the processor's chat template
(``formats.chat.VLM_CHAT_TEMPLATE``), its pixels passed beside it in order. A part that cannot become an image
raises :class:`BadImage` with one of :data:`REASONS`; callers count and skip the row, never crash. Remote URLs are
refused (nothing is downloaded). PIL is imported only when an image is decoded (this module stays stdlib at import).
"""

from __future__ import annotations

import base64
import binascii
import io
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

REASONS = ("missing_file", "unreadable", "too_large", "unsupported_url")

MAX_BYTES = 20 << 20
"""Largest encoded image accepted (20 MiB, OpenAI's own limit for an image input)."""
MAX_PIXELS = 40_000_000
"""Largest decoded image accepted (width × height), checked from the header before pixels are decoded."""


class BadImage(ValueError):
    """An image part that cannot be used; ``reason`` is one of :data:`REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int = MAX_BYTES
    """Largest encoded image (bytes)."""
    max_pixels: int = MAX_PIXELS
    """Largest width × height."""


def is_image_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") in ("image", "image_url")


def has_images(row: dict[str, Any]) -> bool:
    """Whether any message of ``row["messages"]`` holds an image part."""
    return any(
        is_image_part(p) for m in row.get("messages") or () if isinstance(m.get("content"), list) for p in m["content"]
    )


def data_url(png: bytes) -> str:
    """PNG bytes as the ``data:image/png;base64,...`` URL of an ``image_url`` part."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def image_bytes(part: dict[str, Any], base_dir: str | None = None, limits: ImageLimits = ImageLimits()) -> bytes:
    """The encoded bytes an image part names (data URL, path, ``file://``), size-checked."""
    ref = part.get("image_url", part.get("image"))
    url = ref.get("url") if isinstance(ref, dict) else ref
    if not isinstance(url, str) or not url:
        raise BadImage("unsupported_url", f"image part without a url: {str(part)[:80]}")
    if url.startswith("data:"):
        head, _, payload = url.partition(",")
        if ";base64" not in head:
            raise BadImage("unsupported_url", f"data URL is not base64: {head[:40]}")
        if len(payload) * 3 // 4 > limits.max_bytes:
            raise BadImage("too_large", f"data URL of ~{len(payload) * 3 // 4} bytes > {limits.max_bytes}")
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as e:
            raise BadImage("unreadable", f"data URL does not decode as base64 ({e})") from None
    if "://" in url and not url.startswith("file://"):
        raise BadImage("unsupported_url", f"{url[:60]}: only data URLs and local files (nothing is downloaded)")
    path = url.removeprefix("file://")
    if base_dir and not os.path.isabs(path):
        path = os.path.join(base_dir, path)
    if not os.path.isfile(path):
        raise BadImage("missing_file", f"{path}: no such file")
    if (size := os.path.getsize(path)) > limits.max_bytes:
        raise BadImage("too_large", f"{path}: {size} bytes > {limits.max_bytes}")
    with open(path, "rb") as f:
        return f.read()


def load_image(part: dict[str, Any], base_dir: str | None = None, limits: ImageLimits = ImageLimits()) -> Any:
    """An image part → an RGB ``PIL.Image`` (pixel count checked from the header, before decoding)."""
    return decode_image(image_bytes(part, base_dir, limits), limits)


def decode_image(data: bytes, limits: ImageLimits = ImageLimits()) -> Any:
    """Encoded image bytes → an RGB ``PIL.Image`` (pixel count checked from the header, before decoding)."""
    from PIL import Image

    try:
        img = Image.open(io.BytesIO(data))
        if img.width * img.height > limits.max_pixels:
            raise BadImage("too_large", f"{img.width}×{img.height} pixels > {limits.max_pixels}")
        return img.convert("RGB")  # decodes: a truncated or corrupt file fails here
    except BadImage:
        raise
    except Exception as e:  # PIL raises several types (UnidentifiedImageError, OSError, SyntaxError…)
        raise BadImage("unreadable", f"{type(e).__name__}: {e}") from None


def resolve(
    messages: list[dict[str, Any]],
    base_dir: str | None = None,
    limits: ImageLimits = ImageLimits(),
    load: Callable[[dict[str, Any]], Any] | None = None,
) -> tuple[list[dict[str, Any]], list[Any]]:
    """Messages with every image part replaced by ``{"type": "image"}``, and the images in order (each part through
    ``load``, default :func:`load_image`)."""
    out, images = [], []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for p in content:
                if is_image_part(p):
                    images.append(load(p) if load is not None else load_image(p, base_dir, limits))
                    p = {"type": "image"}
                parts.append(p)
            m = {**m, "content": parts}
        out.append(m)
    return out, images


def encode_chat(
    messages: list[dict[str, Any]], processor: Any, base_dir: str | None = None, limits: ImageLimits = ImageLimits()
) -> tuple[list[int], Any, tuple[Any, ...]]:
    """A chat with image parts → (prompt ids, pixel values, the decoded images) through a vision-language model's
    processor (its chat template with the generation prompt, then text and images together; no special tokens
    added, as ``posttrain.rl.task.prompt_ids`` tokenises text chats). The decoded images are for an engine that runs
    its own processor (vLLM: ``Request.images``)."""
    msgs, images = resolve(messages, base_dir, limits)
    text = processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    enc = processor(text=text, images=images or None, return_tensors="pt", add_special_tokens=False)
    return enc["input_ids"][0].tolist(), enc.get("pixel_values"), tuple(images)
