"""Split one document's token stream into long-context chunks with overlap (SPEC §A3, DESIGN "Chunking").

Rule, over the document's token positions [0, L):
- chunk k is [s_k, e_k) with e_k − s_k ≤ C (cap, default 262,144); a document with L ≤ C is one chunk;
- e_k = min(L, s_k + C), moved back to the start of an image the cut would split (images are atomic);
- s_{k+1} = e_k − O (overlap, default 512): the first O tokens of chunk k+1 repeat the last O of chunk k.
  If that point falls inside an image, s_{k+1} moves back to the image's start (the image is repeated
  whole, so the overlap is larger than O). If the rule would not advance (s_{k+1} ≤ s_k, possible only
  when a chunk holds ≤ O tokens because of a large image), chunk k+1 starts at e_k with no overlap.

Every chunk records ``overlap`` = e_{k−1} − s_k, so chunk 0 followed by each chunk minus its first
``overlap`` tokens reassembles the document exactly (token ids, text and images).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from formats.shards import Segment, ShardImage
from pipelines.assembly.interleave import TokenizedSegment

DEFAULT_MAX_TOKENS = 262_144
DEFAULT_OVERLAP = 512


@dataclass(frozen=True)
class Chunk:
    index: int
    start: int
    end: int
    overlap: int
    segments: tuple[Segment, ...]
    images: tuple[ShardImage, ...]

    @property
    def n_tokens(self) -> int:
        return self.end - self.start


def chunk_bounds(
    seg_lengths: Sequence[int], image_mask: Sequence[bool], max_tokens: int, overlap: int
) -> list[tuple[int, int]]:
    """Chunk [start, end) token intervals for a document given per-segment lengths and which are images."""
    if max_tokens <= 0 or overlap < 0 or overlap >= max_tokens:
        raise ValueError(f"need 0 <= overlap < max_tokens, got overlap={overlap}, max_tokens={max_tokens}")
    starts = [0]
    for n in seg_lengths:
        starts.append(starts[-1] + n)
    total = starts[-1]
    images = [(starts[i], starts[i + 1]) for i, is_img in enumerate(image_mask) if is_img and seg_lengths[i] > 0]
    for a, b in images:
        if b - a > max_tokens:
            raise ValueError(
                f"an image of {b - a} tokens cannot fit a chunk of {max_tokens}; lower the image token cap"
            )
    img_starts = [a for a, _ in images]

    def inside_image(pos: int) -> tuple[int, int] | None:
        i = bisect.bisect_right(img_starts, pos) - 1
        if i >= 0 and images[i][0] < pos < images[i][1]:
            return images[i]
        return None

    bounds: list[tuple[int, int]] = []
    s = 0
    while True:
        e = min(total, s + max_tokens)
        if e < total and (img := inside_image(e)):
            e = img[0]
        bounds.append((s, e))
        if e >= total:
            return bounds
        t = e - overlap
        if img := inside_image(t):
            t = img[0]
        s = t if t > s else e


def chunk_document(
    segments: Sequence[TokenizedSegment], max_tokens: int = DEFAULT_MAX_TOKENS, overlap: int = DEFAULT_OVERLAP
) -> list[Chunk]:
    """Tokenised document → chunks (no chunk above ``max_tokens``; exact ``overlap`` except around images)."""
    lengths = [ts.segment.n_tokens for ts in segments]
    if sum(lengths) == 0:
        return []
    bounds = chunk_bounds(lengths, [ts.segment.kind == "image" for ts in segments], max_tokens, overlap)
    seg_starts = [0]
    for n in lengths:
        seg_starts.append(seg_starts[-1] + n)

    chunks: list[Chunk] = []
    prev_end = 0
    for k, (s, e) in enumerate(bounds):
        segs: list[Segment] = []
        images: dict[str, ShardImage] = {}
        first = bisect.bisect_right(seg_starts, s) - 1
        for i in range(first, len(segments)):
            a, b = seg_starts[i], seg_starts[i + 1]
            if a >= e:
                break
            lo, hi = max(s, a) - a, min(e, b) - a
            if hi <= lo:
                continue
            segs.append(_slice(segments[i], lo, hi))
            if segments[i].image is not None:
                images.setdefault(segments[i].image.sha256, segments[i].image)
        chunks.append(Chunk(k, s, e, prev_end - s if k else 0, tuple(segs), tuple(images.values())))
        prev_end = e
    return chunks


def _slice(ts: TokenizedSegment, lo: int, hi: int) -> Segment:
    seg = ts.segment
    if lo == 0 and hi == seg.n_tokens:
        return seg
    assert seg.kind == "text", "images are atomic"
    n = seg.n_tokens
    # Slice text at token starts; the first slice keeps leading characters, the last keeps the tail,
    # so concatenating consecutive slices gives back the segment's text exactly.
    c0 = 0 if lo == 0 else ts.offsets[lo]
    c1 = len(seg.text) if hi == n else ts.offsets[hi]
    return Segment("text", hi - lo, seg.page_index, text=seg.text[c0:c1], token_ids=seg.token_ids[lo:hi])
