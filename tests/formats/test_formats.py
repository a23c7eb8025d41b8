"""Every cross-area format round-trips (write → read → equal), and the readers fail clearly on what is not theirs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from formats import fs
from formats.manifest import Manifest, QuarantineEntry, ShardEntry, Totals
from formats.quarantine import iter_quarantine, write_quarantine
from formats.records import Dropped
from formats.scores import VisualGainScore
from formats.shards import (
    ChunkRow,
    LayoutBox,
    PageInfo,
    PageRender,
    Segment,
    ShardFile,
    ShardImage,
    ShardWriter,
    list_shards,
    read_table,
    shard_name,
    write_shard,
)
from formats.weights import DrawWeights, SampleWeights, WeightsMismatch, check_coverage


def chunk(doc: str, k: int, weight: float = 1.0) -> ChunkRow:
    png = f"png-{doc}-{k}".encode()
    return ChunkRow(
        doc_id=doc,
        chunk_index=k,
        segments=(
            Segment("text", 3, 0, text="a b c", token_ids=(1, 2, 3)),
            Segment("image", 4, 0, image_sha256=f"sha-{doc}-{k}"),
            Segment("text", 2, 1, text="d e", token_ids=(4, 5)),
        ),
        images=(ShardImage(f"sha-{doc}-{k}", png, 10, 20, "figure"),),
        page_renders=(PageRender(0, b"page0", 30, 40, 72), PageRender(1, b"page1", 30, 40, 72)),
        pages=(
            PageInfo(
                0,
                "mineru",
                {"visual_gain": {"delta_h_nats": 0.1}},
                612.0,
                792.0,
                (LayoutBox("figure", (1, 2, 3, 4), "sha"),),
            ),
            PageInfo(1, "mineru", {}, 612.0, 792.0, ()),
        ),
        sample_weight=weight,
        meta={"source": f"{doc}.pdf", "overlap": 0},
    )


def manifest(files: list[str]) -> Manifest:
    return Manifest(
        schema_version="2",
        created_at="2026-12-03T00:00:00Z",
        inputs=["pdfs/"],
        config={"tokenizer": "t"},
        config_hash="abc",
        parser_version="parsing-2",
        parser_backends={"mineru": "4.0.12"},
        shards=[ShardEntry(f, 1, 9, "0" * 64, 100) for f in files],
        totals=Totals(3, 2, 1, 2, 18),
        dropped_by_reason={"open.empty": 1},
        quarantine=[QuarantineEntry("open", "open.jsonl", 1)],
        metrics={"documents": 2},
        elapsed_s=1.5,
        visual_gain=None,
        extra={"from_a_newer_version": True},
    )


def test_shard_rows_round_trip_whole_and_by_part(tmp_path: Path):
    rows = [chunk("d1", 0, 2.0), chunk("d1", 1), chunk("d2", 0, 0.5)]
    path = tmp_path / "out" / "shards" / shard_name(0, 1)
    entry = write_shard(path, rows)
    assert entry["rows"] == 3 and entry["tokens"] == 27 and entry["bytes"] == path.stat().st_size
    back = ShardFile(path).read_chunks()
    assert [c.to_row() for c in back] == [r.to_row() for r in rows]
    assert [c.chunk_id for c in back] == ["d1:0", "d1:1", "d2:0"]
    segs_only = list(ShardFile(path).iter_chunks(parts=("segments",)))
    assert segs_only[0].images == () and segs_only[0].segments == rows[0].segments and segs_only[0].n_tokens == 9
    assert ShardFile(path).chunk(2, parts=("images",)).images == rows[2].images
    assert ShardFile(path).sample_weights() == (["d1:0", "d1:1", "d2:0"], [2.0, 1.0, 0.5])
    assert ShardFile(path).doc_ids() == {"d1", "d2"}
    with pytest.raises(ValueError, match="unknown shard parts"):
        ShardFile(path).read_chunks(parts=("chunk_id",))
    with pytest.raises(IndexError):
        ShardFile(path).chunk(3)


def test_shard_writer_streams_tables(tmp_path: Path):
    part = tmp_path / "part.parquet"
    write_shard(part, [chunk("d3", 1), chunk("d3", 0)])
    w = ShardWriter(tmp_path / "s.parquet")
    w.write_table(read_table(part).sort_by("chunk_index"))
    entry = w.close()
    assert entry["rows"] == 2 and [c.chunk_index for c in ShardFile(tmp_path / "s.parquet").read_chunks()] == [0, 1]


def test_list_shards_manifest_order_then_glob_then_clear_errors(tmp_path: Path):
    out = tmp_path / "out"
    for i in range(2):
        write_shard(out / "shards" / shard_name(i, 2), [chunk(f"d{i}", 0)])
    assert [Path(p).name for p in list_shards(out)] == [shard_name(0, 2), shard_name(1, 2)]  # no manifest: sorted
    manifest([shard_name(1, 2), shard_name(0, 2)]).write(out)
    assert [Path(p).name for p in list_shards(out)] == [shard_name(1, 2), shard_name(0, 2)]  # the manifest's order
    with pytest.raises(FileNotFoundError, match="pass its parent"):
        list_shards(out / "shards")
    with pytest.raises(FileNotFoundError, match="not a build output directory"):
        list_shards(tmp_path / "empty")


def test_manifest_round_trip_keeps_unknown_keys(tmp_path: Path):
    m = manifest(["a.parquet"])
    m.write(tmp_path)
    assert Manifest.read(tmp_path) == m
    assert "from_a_newer_version" in fs.read_text(tmp_path / "manifest.json")
    with pytest.raises(FileNotFoundError, match="scifolio build"):
        Manifest.read(tmp_path / "nothing")


def test_quarantine_round_trip_sorted(tmp_path: Path):
    rows = [Dropped("b", "open", "empty", {"source": "b.pdf"}), Dropped("a", "open", "not_pdf", {"x": [1]})]
    entry = write_quarantine(tmp_path, "open", [d.to_row() for d in rows])
    assert entry == {"stage": "open", "file": "open.jsonl", "count": 2}
    first = list(iter_quarantine(tmp_path))
    assert sorted(first, key=lambda d: d.item_id) == sorted(rows, key=lambda d: d.item_id)
    write_quarantine(tmp_path, "open", [d.to_row() for d in reversed(rows)])
    assert list(iter_quarantine(tmp_path)) == first  # the file is a function of the set, not of arrival order


def test_visual_gain_score_round_trip_on_a_page():
    from formats.records import Page

    page = Page("d", 0, 10.0, 10.0, (), parser="mineru")
    assert VisualGainScore.of(page) is None
    s = VisualGainScore(0.3094, 0.4464, 312.5, 700, 2, 12.4, 9.1, 1, "m")
    scored = s.on(page)
    assert VisualGainScore.of(scored) == s
    decided = s.decided(0.02, "chemistry", True)
    assert VisualGainScore.from_dict(decided.to_dict()) == decided and decided.kept is True


def test_weights_round_trip_and_the_product_rule(tmp_path: Path):
    w = SampleWeights(chunks={"a:0": 3.0, "b:0": 0.0, "c:0": 0.5}, images={"sha": 3.0}, scores={"sha": 0.9})
    assert w.write(tmp_path / "w.parquet") == 4
    back = SampleWeights.read(tmp_path / "w.parquet")
    assert back.chunks == w.chunks and back.images == w.images and math.isclose(back.scores["sha"], 0.9, rel_tol=1e-6)
    # draw = own × listed; unlisted = own; 3 triples, 0 excludes, 0.5 halves
    ids, own = ["a:0", "b:0", "c:0", "d:0"], [1.0, 2.0, 2.0, 1.5]
    assert back.draw_weights(ids, own) == [3.0, 0.0, 1.0, 1.5]


def test_weights_refuse_bad_values_and_foreign_tables(tmp_path: Path):
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="finite and >= 0"):
            SampleWeights(chunks={"a:0": bad})
    with pytest.raises(WeightsMismatch, match="none of its 1 chunk ids"):
        check_coverage(SampleWeights(chunks={"x:0": 2.0}), {"a:0"})
    with pytest.raises(WeightsMismatch, match="lists no chunk weights"):
        check_coverage(SampleWeights(images={"sha": 2.0}), {"a:0"})
    assert check_coverage(SampleWeights(chunks={"a:0": 2.0, "x:0": 1.0}), {"a:0", "b:0"}) == 1
    (tmp_path / "other.parquet").write_bytes(b"")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"chunk_id": ["a:0"], "weight": [2.0]}), tmp_path / "other.parquet")
    with pytest.raises(ValueError, match="not a sample-weights table"):
        SampleWeights.read(tmp_path / "other.parquet")


def test_draw_weights_round_trip(tmp_path: Path):
    d = DrawWeights(["a:0", "b:0"], [1.0, 2.0], [3.0, 1.0])
    d.write(tmp_path / "d.parquet")
    assert DrawWeights.read(tmp_path / "d.parquet").by_chunk() == {"a:0": 3.0, "b:0": 2.0}


@given(st.dictionaries(st.text(min_size=1, max_size=8), st.floats(0, 1e6), max_size=20))
def test_weights_round_trip_property(chunks):
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        SampleWeights(chunks=chunks).write(Path(d) / "w.parquet")
        back = SampleWeights.read(Path(d) / "w.parquet").chunks
    assert back.keys() == chunks.keys()
    assert all(math.isclose(back[k], v, rel_tol=1e-6, abs_tol=1e-30) for k, v in chunks.items())  # float32


def test_open_output_leaves_nothing_on_failure(tmp_path: Path):
    target = tmp_path / "x" / "f.bin"
    with pytest.raises(RuntimeError):
        with fs.open_output(target) as f:
            f.write(b"partial")
            raise RuntimeError("boom")
    assert not target.exists() and list((tmp_path / "x").iterdir()) == []
    fs.write_text(target, "whole")
    assert fs.read_text(target) == "whole"


def test_jsonl_round_trip_skips_blank_lines_and_names_a_bad_line(tmp_path: Path):
    rows = [{"id": "a", "x": [1, 2]}, {"id": "b", "x": []}]
    fs.write_jsonl(tmp_path / "sub" / "rows.jsonl", rows)  # parents made, committed whole
    assert fs.read_jsonl(tmp_path / "sub" / "rows.jsonl") == rows
    (tmp_path / "bad.jsonl").write_text('{"id": 1}\n\n{"id": \n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:3: not JSON"):
        fs.read_jsonl(tmp_path / "bad.jsonl")
