"""Chunker properties over random documents: cap, exact overlap, image atomicity, lossless reassembly."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from formats.shards import Segment, ShardImage
from pipelines.assembly.chunk import chunk_bounds, chunk_document
from pipelines.assembly.interleave import TokenizedSegment


def _doc(spec: list[tuple[str, int]]) -> list[TokenizedSegment]:
    """Build a tokenised document: text segments get distinct token ids and one char per token."""
    out, next_id = [], 0
    for i, (kind, n) in enumerate(spec):
        if kind == "text":
            ids = tuple(range(next_id, next_id + n))
            next_id += n
            text = "".join(chr(0x4E00 + (t % 20000)) for t in ids)
            out.append(TokenizedSegment(Segment("text", n, i // 3, text=text, token_ids=ids), tuple(range(n))))
        else:
            sha = f"{i:064x}"
            img = ShardImage(sha, b"", 28, 28 * n, "figure")
            out.append(TokenizedSegment(Segment("image", n, i // 3, image_sha256=sha), image=img))
    return out


def _flatten(segments) -> list:
    units = []
    for s in segments:
        if s.kind == "text":
            units.extend(("t", t) for t in s.token_ids)
        else:
            units.extend(("i", s.image_sha256, j) for j in range(s.n_tokens))
    return units


doc_spec = st.lists(
    st.one_of(
        st.tuples(st.just("text"), st.integers(1, 400)),
        st.tuples(st.just("image"), st.integers(1, 60)),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(spec=doc_spec, cap=st.integers(64, 700), overlap_frac=st.floats(0.0, 0.6))
def test_chunk_properties(spec, cap, overlap_frac):
    overlap = int(cap * overlap_frac)
    doc = _doc(spec)
    chunks = chunk_document(doc, max_tokens=cap, overlap=overlap)
    total = sum(n for _, n in spec)
    whole = _flatten(ts.segment for ts in doc)

    assert chunks[0].start == 0 and chunks[-1].end == total
    if total <= cap:
        assert len(chunks) == 1
    text_whole = "".join(ts.segment.text for ts in doc)
    rebuilt, rebuilt_text = [], []
    for k, c in enumerate(chunks):
        assert 0 < c.n_tokens <= cap
        assert sum(s.n_tokens for s in c.segments) == c.n_tokens
        units = _flatten(c.segments)
        assert units == whole[c.start : c.end]
        # images are atomic: every image segment in a chunk is the whole image
        by_sha = {ts.segment.image_sha256: ts.segment.n_tokens for ts in doc if ts.segment.kind == "image"}
        for s in c.segments:
            if s.kind == "image":
                assert s.n_tokens == by_sha[s.image_sha256]
                assert any(img.sha256 == s.image_sha256 for img in c.images)
        if k:
            prev = chunks[k - 1]
            assert c.overlap == prev.end - c.start
            assert c.start > prev.start  # progress
            # exact overlap unless an image straddles the overlap point or no overlap was possible
            straddled = any(a < prev.end - overlap < a + n for a, n in _image_spans(spec))
            if not straddled and prev.end - overlap > prev.start:
                assert c.overlap == overlap
            assert whole[c.start : prev.end] == units[: c.overlap]
        rebuilt.extend(units[c.overlap :])
        rebuilt_text.append(_text_after_overlap(c))
    assert rebuilt == whole
    assert "".join(rebuilt_text) == text_whole


def _image_spans(spec):
    pos = 0
    for kind, n in spec:
        if kind == "image":
            yield pos, n
        pos += n


def _text_after_overlap(chunk) -> str:
    """Text of a chunk minus its overlap tokens (text tokens are 1 char each in this fixture)."""
    skip, out = chunk.overlap, []
    for s in chunk.segments:
        if skip >= s.n_tokens:
            skip -= s.n_tokens
            continue
        if s.kind == "text":
            out.append(s.text[skip:])
        skip = 0
    return "".join(out)


def test_spec_defaults_stride_and_duplication():
    # SPEC §A3 writes "stride = 262,144 − 512 = 255,488"; the subtraction is 261,632 (255,488 is
    # 256,000 − 512). The rule, stride = C − O, is what is implemented and checked; ≈0.2% holds either way.
    n = 1_000_000
    bounds = chunk_bounds([n], [False], 262_144, 512)
    assert all(e - s <= 262_144 for s, e in bounds)
    strides = [b[0] - a[0] for a, b in zip(bounds, bounds[1:])]
    assert strides == [262_144 - 512] * len(strides) == [261_632] * len(strides)
    dup = sum(a[1] - b[0] for a, b in zip(bounds, bounds[1:]))
    assert dup == 512 * (len(bounds) - 1)
    assert abs(512 / 261_632 - 0.002) < 1e-4


def test_boundary_moves_before_image_and_overlap_repeats_image_whole():
    # text 90 | image 20 | text 200, cap 100, overlap 15
    bounds = chunk_bounds([90, 20, 200], [False, True, False], 100, 15)
    assert bounds[0] == (0, 90)  # cut at 100 would split the image at [90, 110)
    assert bounds[1][0] == 75
    # next cut point: 75 + 100 = 175; overlap point 160 is text → exact overlap
    assert bounds[1] == (75, 175) and bounds[2][0] == 160
    # overlap point inside an image → the image is repeated whole
    bounds = chunk_bounds([95, 10, 200], [False, True, False], 100, 10)
    assert bounds[0] == (0, 95)
    bounds = chunk_bounds([50, 40, 200], [False, True, False], 100, 20)
    assert bounds[0] == (0, 100) and bounds[1][0] == 50  # 100-20=80 falls in image [50, 90) → start at 50


def test_rejects_image_larger_than_cap_and_bad_overlap():
    with pytest.raises(ValueError, match="cannot fit"):
        chunk_bounds([10, 200], [False, True], 100, 10)
    with pytest.raises(ValueError, match="overlap"):
        chunk_bounds([10], [False], 100, 100)


def test_empty_document_has_no_chunks():
    assert chunk_document([], 100, 10) == []
