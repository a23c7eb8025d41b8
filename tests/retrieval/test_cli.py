"""``scifolio index build|query|weights`` through register() on a private argparse parser."""

from __future__ import annotations

import argparse
import json

import pytest

from pipelines.cli.index import register

pytestmark = pytest.mark.integration


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scifolio")
    register(p.add_subparsers(dest="command", required=True))
    return p.parse_args(argv)


def test_help_mentions_every_subcommand(capsys):
    with pytest.raises(SystemExit):
        parse(["index", "--help"])
    out = capsys.readouterr().out
    assert all(w in out for w in ("build", "query", "serve", "weights"))


def test_build_bulk_dir_on_lite_exits_2_before_any_work(corpus_out, tmp_path, capsys):
    args = parse(
        ["index", "build", "--shards", str(corpus_out), "--uri", str(tmp_path / "cli.db"), "--embed-model", "unused"]
        + ["--bulk-dir", str(tmp_path / "bulk")]
    )
    assert args.bulk_dir == str(tmp_path / "bulk")
    assert args.func(args) == 2  # the model is never loaded: the refusal comes first
    err = capsys.readouterr().err
    assert "Milvus Lite" in err and "without --bulk-dir" in err
    assert not (tmp_path / "bulk").exists() and not (tmp_path / "cli.db").exists()


@pytest.mark.slow  # Beam build + three model loads
def test_build_query_weights(corpus_out, tiny_models, tmp_path, capsys):
    uri = str(tmp_path / "cli.db")
    clip = tiny_models["retrieval-clip"]
    args = parse(
        [
            "index",
            "build",
            "--shards",
            str(corpus_out),
            "--uri",
            uri,
            "--collections",
            "2",
            "--embed-model",
            clip,
            "--batch-size",
            "4",
            "--state-dir",
            str(tmp_path / "state"),
        ]
    )
    assert args.func(args) == 0
    totals = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert totals["crops_written"] == 12 and totals["shard_files_done"] == 2

    # --collections is discovered from the index.
    args = parse(["index", "query", "a red circle", "--uri", uri, "--embed-model", clip, "--k", "3", "--json"])
    assert args.func(args) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["query"] == "a red circle" and len(res["results"]) == 3

    args = parse(["index", "query", "--uri", uri, "--embed-model", clip])
    assert args.func(args) == 2  # neither text nor --image

    queries = tmp_path / "queries.txt"
    queries.write_text("# quality queries\na plot of results\na red circle\n")
    out = tmp_path / "weights.parquet"
    args = parse(
        [
            "index",
            "weights",
            "--queries",
            str(queries),
            "--out",
            str(out),
            "--shards",
            str(corpus_out),
            "--uri",
            uri,
            "--embed-model",
            clip,
            "--reranker",
            tiny_models["retrieval-reranker"],
            "--min-score",
            "0.0",
            "--max-weight",
            "2.0",
            "--k",
            "12",
        ]
    )
    assert args.func(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["queries"] == 2 and summary["scored_images"] == 12
    from formats.weights import SampleWeights

    written = SampleWeights.read(out)
    img_w, ch_w = written.images, written.chunks
    assert len(img_w) == 12 and all(1.0 <= w <= 2.0 for w in img_w.values())
    assert len(ch_w) == 4 and all(1.0 < w <= 2.0 for w in ch_w.values())
