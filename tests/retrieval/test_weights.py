"""Sample-weight derivation: hand-computed values, bounds, the parquet the pre-training loader reads."""

from __future__ import annotations

import math

import pytest

from formats.weights import SampleWeights
from retrieval.weights import (
    WeightConfig,
    best_scores,
    chunk_weights,
    image_weight,
    image_weights,
    iter_chunk_images,
    parse_query_line,
    write_weights,
)


def test_image_weight_is_linear_from_threshold_to_max():
    cfg = WeightConfig(min_score=0.5, max_weight=3.0)
    assert image_weight(0.49, cfg) == 1.0
    assert image_weight(0.5, cfg) == 1.0
    assert image_weight(0.75, cfg) == pytest.approx(2.0)
    assert image_weight(1.0, cfg) == pytest.approx(3.0)
    assert image_weight(7.0, cfg) == pytest.approx(3.0)  # bounded even for an out-of-range score


def test_best_scores_take_max_over_queries():
    assert best_scores([[("a", 0.2), ("b", 0.9)], [("a", 0.8)], []]) == {"a": 0.8, "b": 0.9}


def test_chunk_weight_is_max_of_its_images_and_default_is_one():
    cfg = WeightConfig(min_score=0.6, max_weight=2.0)
    img_w = image_weights({"a": 0.8, "b": 1.0, "c": 0.3}, cfg)
    assert img_w == {"a": pytest.approx(1.5), "b": pytest.approx(2.0)}  # c below threshold: not listed
    chunks = [("d:0", ["a", "c"]), ("d:1", ["a", "b"]), ("d:2", ["c"]), ("d:3", [])]
    assert chunk_weights(chunks, img_w) == {"d:0": pytest.approx(1.5), "d:1": pytest.approx(2.0)}


def test_config_rejects_weights_that_would_lower_a_ratio():
    with pytest.raises(ValueError):
        WeightConfig(max_weight=0.5)
    with pytest.raises(ValueError):
        WeightConfig(min_score=1.0)


def test_weights_parquet_roundtrip(tmp_path, corpus_out):
    chunk_images = dict(iter_chunk_images(corpus_out))
    assert len(chunk_images) == 4 and all(len(v) == 3 for v in chunk_images.values())
    first_chunk, ids = sorted(chunk_images.items())[0]
    cfg = WeightConfig(min_score=0.5, max_weight=3.0)
    scores = {ids[0]: 1.0, ids[1]: 0.1}
    img_w = image_weights(scores, cfg)
    ch_w = chunk_weights(chunk_images.items(), img_w)
    n = write_weights(tmp_path / "w.parquet", scores, img_w, ch_w)
    assert n == 2
    assert SampleWeights.read(tmp_path / "w.parquet").chunks == {first_chunk: 3.0}
    assert SampleWeights.read(tmp_path / "w.parquet").images == {ids[0]: 3.0}
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "w.parquet").to_pylist()
    assert rows[0]["score"] == 1.0 and math.isnan(rows[1]["score"])


def test_query_lines(tmp_path):
    img = tmp_path / "q.png"
    img.write_bytes(b"x")
    assert parse_query_line("  # comment") is None and parse_query_line("") is None
    assert parse_query_line("phase diagram") == ("text", "phase diagram")
    assert parse_query_line(str(img)) == ("image", str(img))
    assert parse_query_line("image: /x/y.png") == ("image", "/x/y.png")
    assert parse_query_line("missing.png") == ("text", "missing.png")
