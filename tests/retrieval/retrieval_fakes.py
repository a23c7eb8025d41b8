"""Test helpers shared by tests/retrieval: fakes implementing the real protocols, and fixture builders."""

from __future__ import annotations

import hashlib
import io

import numpy as np

from formats.shards import ChunkRow, Segment, ShardImage

COLORS = {
    "red": (220, 30, 30),
    "green": (30, 180, 60),
    "blue": (30, 60, 220),
    "yellow": (230, 210, 40),
    "purple": (140, 40, 170),
    "gray": (120, 120, 120),
}


def loopback_only() -> bool:
    """True inside a network namespace whose only interface is ``lo`` (nothing can leave the machine).

    Reads /proc/net/dev, which follows the caller's network namespace; /sys/class/net does not (sysfs keeps
    showing the host's interfaces after ``unshare -n`` unless it is remounted)."""
    with open("/proc/net/dev") as f:
        names = [line.split(":", 1)[0].strip() for line in f.readlines()[2:] if ":" in line]
    return names == ["lo"]


def draw_png(color: tuple[int, int, int], shape: str = "circle", size: tuple[int, int] = (64, 48)) -> bytes:
    from PIL import Image, ImageDraw

    im = Image.new("RGB", size, (255, 255, 255))
    d = ImageDraw.Draw(im)
    box = (8, 6, size[0] - 8, size[1] - 6)
    (d.ellipse if shape == "circle" else d.rectangle)(box, fill=color)
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


class HashEmbedder:
    """Fake embedder implementing the Embedder protocol: a deterministic unit vector per input's bytes/text."""

    def __init__(self, dim: int = 16):
        self._dim = dim

    @property
    def dim(self) -> int:
        return self._dim

    def _vec(self, key: bytes) -> np.ndarray:
        seed = int.from_bytes(hashlib.sha256(key).digest()[:8], "little")
        v = np.random.default_rng(seed).standard_normal(self._dim).astype(np.float32)
        return v / np.linalg.norm(v)

    def encode_images(self, images):
        return np.stack([self._vec(bytes(b)) for b in images]) if images else np.zeros((0, self._dim), np.float32)

    def encode_texts(self, texts):
        return np.stack([self._vec(t.encode()) for t in texts]) if texts else np.zeros((0, self._dim), np.float32)


def make_rows(doc: str, colors: list[str], shape: str, size: tuple[int, int] = (64, 48)) -> list[dict]:
    """Two chunk rows for one document; each image sits between a caption-like sentence and body text."""
    doc_id = hashlib.sha256(doc.encode()).hexdigest()
    rows = []
    for chunk_index, group in enumerate((colors[: len(colors) // 2], colors[len(colors) // 2 :])):
        segs, imgs = [], []
        for page, name in enumerate(group):
            png = draw_png(COLORS[name], shape, size)
            sha = hashlib.sha256(png).hexdigest()
            segs.append(Segment("text", 6, page, text=f"Figure {page + 1}: a {name} {shape} plot."))
            segs.append(Segment("image", 64, page, image_sha256=sha))
            segs.append(Segment("text", 5, page, text=f"The {name} {shape} shows the result."))
            imgs.append(ShardImage(sha, png, size[0], size[1], "figure"))
        rows.append(ChunkRow(doc_id=doc_id, chunk_index=chunk_index, segments=tuple(segs), images=tuple(imgs)).to_row())
    return rows
