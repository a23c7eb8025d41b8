"""Series files as documents of the corpus job, Beam-free (``pipelines/assembly/series.py``): rows, quarantine
reasons, the timestamp fallback (a warning, never a quarantine), contexts cut to the chunk cap; and the shard schema's
series part read back, old (version 2) shards included.

    .venv/bin/python -m pytest tests/pipelines/test_series_build.py -q
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats.shards import SHARD_SCHEMA, ChunkRow, ShardFile, write_shard
from pipelines.assembly.build import BuildConfig
from pipelines.assembly.series import SeriesBuilder


@pytest.fixture(scope="module")
def builder(tmp_path_factory: pytest.TempPathFactory) -> SeriesBuilder:
    from pipelines.tiny import write_tiny_tokenizer

    tok = write_tiny_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer")
    return SeriesBuilder(BuildConfig(tokenizer=str(tok), max_tokens=64, overlap=8))


def test_one_row_per_series_with_record_and_segment(builder: SeriesBuilder) -> None:
    csv = "series_id,channel,value,context\n" + "".join(
        f"{s},{c},{i * (2 if c == 'y' else 1)},{'probe ' + s if i == 0 else ''}\n"
        for s in ("b", "a")
        for c in ("x", "y")
        for i in range(30)
    )
    data = csv.encode()
    result = builder.build(data, "/data/probes.csv")
    assert result.doc_id == hashlib.sha256(data).hexdigest() and not result.dropped
    assert result.stats["series"] == 2 and result.stats["series_points"] == 2 * 2 * 30
    rows = [ChunkRow.from_row(r) for r in result.rows]
    assert [r.chunk_index for r in rows] == [0, 1] and [r.meta["name"] for r in rows] == ["a", "b"]
    for row in rows:
        (rec,) = row.series
        assert rec.channels == ("x", "y") and rec.length == 30 and rec.context == f"probe {row.meta['name']}"
        text, series = row.segments
        assert text.kind == "text" and text.token_ids and series.kind == "series" and series.series_id == rec.series_id
        assert series.n_tokens <= 64 and row.n_tokens == text.n_tokens + series.n_tokens <= 64


def test_bad_files_are_quarantined_with_reasons(builder: SeriesBuilder) -> None:
    cases = {
        "words.csv": (b"series_id,value\na,hello\n", "non_numeric_values"),
        "empty.csv": (b"", "unparseable"),
        "header.csv": (b"series_id,value\n", "empty"),
        "novalue.csv": (b"series_id,x\na,1\n", "no_value_column"),
        "nan.csv": (b"series_id,value\na,nan\na,inf\n", "no_finite_values"),
        "bad.tsf": (b"not a tsf\n", "bad_tsf_header"),
        "bad.parquet": (b"PAR1 nope", "unparseable"),
    }
    for name, (data, reason) in cases.items():
        result = builder.build(data, f"/in/{name}")
        assert not result.rows, name
        (d,) = result.dropped
        assert (d.item_id, d.stage, d.reason) == (hashlib.sha256(data).hexdigest(), "series", reason), name
        assert d.detail["source"] == f"/in/{name}"


def test_unparseable_timestamps_keep_row_order_with_a_warning(
    builder: SeriesBuilder, caplog: pytest.LogCaptureFixture
) -> None:
    data = b"series_id,timestamp,value\n" + b"".join(b"t,day-%d,%d\n" % (i, 10 - i) for i in range(10))
    with caplog.at_level(logging.WARNING):
        result = builder.build(data, "/in/lab.csv")
    assert not result.dropped and result.stats["series_warnings.timestamp_row_order"] == 1
    (rec,) = ChunkRow.from_row(result.rows[0]).series
    assert rec.values == (tuple(float(10 - i) for i in range(10)),)  # row order kept
    assert "did not parse" in rec.meta["warning"] and "did not parse" in caplog.text


def test_long_context_is_cut_to_fit_the_chunk(builder: SeriesBuilder) -> None:
    tsf = "# " + "a long description of the plant " * 40 + "\n@attribute series_name string\n@data\nP:1,2,3,4,5\n"
    (row,) = [ChunkRow.from_row(r) for r in builder.build(tsf.encode(), "/in/p.tsf").rows]
    assert row.n_tokens <= 64 and row.segments[0].text and len(row.segments[0].text) < len(row.series[0].context)


def test_version_2_shards_read_with_no_series(tmp_path: Path) -> None:
    """A shard written before series rows (no ``series`` column, no segment ``series_id``) still reads."""
    old_segment = pa.struct([f for f in SHARD_SCHEMA.field("segments").type.value_type if f.name != "series_id"])
    fields = [
        pa.field("segments", pa.list_(old_segment)) if f.name == "segments" else f
        for f in SHARD_SCHEMA
        if f.name != "series"
    ]
    row = {"chunk_id": "d:0", "doc_id": "d", "chunk_index": 0, "n_tokens": 2, "sample_weight": 1.0, "meta": "{}",
           "segments": [{"kind": "text", "text": "hi", "token_ids": [1, 2], "n_tokens": 2, "page_index": 0}]}  # fmt: skip
    pq.write_table(pa.Table.from_pylist([row], schema=pa.schema(fields)), tmp_path / "old.parquet")
    f = ShardFile(tmp_path / "old.parquet")
    (chunk,) = f.read_chunks()
    assert chunk.series == () and chunk.segments[0].series_id is None and f.series_count() == 0
    assert chunk.segments[0].token_ids == (1, 2)


def test_series_count_from_footer_matches_rows(builder: SeriesBuilder, tmp_path: Path) -> None:
    csv = "series_id,value\n" + "".join(f"s{i % 5},{i}\n" for i in range(100))
    rows = builder.build(csv.encode(), "/in/five.csv").rows
    write_shard(tmp_path / "s.parquet", rows + rows[:2], row_group_size=2)
    assert ShardFile(tmp_path / "s.parquet").series_count() == 7


def test_huge_values_do_not_overflow_the_stats(builder: SeriesBuilder) -> None:
    """Found by benchmarks/fuzz_series.py: squares of 1e300 overflowed (μ, σ) and crashed the job."""
    data = "series_id,value\n" + "".join(f"h,{(-1) ** i * 1e300}\n" for i in range(30))
    (row,) = [ChunkRow.from_row(r) for r in builder.build(data.encode(), "/in/huge.csv").rows]
    mu, sigma = row.series[0].stats()
    assert mu == [0.0] and sigma[0] == pytest.approx(1e300)


def test_an_unexpected_error_is_the_files_dead_letter(builder: SeriesBuilder, monkeypatch: pytest.MonkeyPatch) -> None:
    import pipelines.assembly.series as mod

    def boom(*a, **k):
        raise ZeroDivisionError("a reader bug")

    monkeypatch.setattr(mod, "read_series_bytes", boom)
    (d,) = builder.build(b"series_id,value\na,1\n", "/in/x.csv").dropped
    assert (d.stage, d.reason) == ("series", "error") and "ZeroDivisionError" in d.detail["error"]
    monkeypatch.setattr(mod, "read_series_bytes", lambda *a, **k: (_ for _ in ()).throw(MemoryError()))
    with pytest.raises(MemoryError):  # infrastructure: the job retries, never a final dead letter
        builder.build(b"series_id,value\na,1\n", "/in/x.csv")
