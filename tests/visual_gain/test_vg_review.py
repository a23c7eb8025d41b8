"""Review export (selection, static HTML), decisions files and the fit, through the CLI functions."""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import replace

import pytest
from vg_helpers import make_page, png_bytes, scored_page

from pipelines.cli.review import register
from visual_gain.review import (
    ReviewConfig,
    export_review,
    fit_from_decisions,
    load_decisions,
    read_scored_pages,
    select_for_review,
    write_scored_pages,
)
from visual_gain.thresholds import Thresholds

T = Thresholds({"default": 0.05, "chemistry": 0.10})


def _corpus() -> list:
    pages = [scored_page(-0.098 + 0.004 * i, i, "chemistry") for i in range(80)]  # ΔH -0.098 … 0.218, none on 0.1
    pages += [scored_page(0.01 * i, 100 + i, "default") for i in range(12)]
    pages += [scored_page(0.0, 200, "default", n_images=0)]  # text-only: not reviewable
    return pages


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scifolio")
    register(parser.add_subparsers(dest="command"))
    return parser


def test_selection_is_near_threshold_and_on_both_sides() -> None:
    sel = select_for_review(_corpus(), T, ReviewConfig(per_domain=10, n_strata=4))
    chem = [p.scores["visual_gain"]["delta_h_nats"] - 0.10 for p in sel["chemistry"]]
    assert len(chem) == 10
    assert sum(d < 0 for d in chem) == 5 and sum(d >= 0 for d in chem) == 5  # stratified: balanced sides
    assert max(abs(d) for d in chem) <= 0.08 + 1e-9  # within the 2·per_domain nearest (20 pages × 0.004)
    assert all(p.scores["visual_gain"]["n_images"] > 0 for ps in sel.values() for p in ps)
    assert all(p.scores["visual_gain"]["threshold"] == 0.10 for p in sel["chemistry"])
    assert len(sel["default"]) == 10


def test_page_files_round_trip_and_skip_other_tables(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pyarrow as pa
    import pyarrow.parquet as pq

    pages = _corpus()[:5] + [make_page(["not scored"], page_index=9)]
    write_scored_pages(pages, tmp_path / "visual_gain" / "pages-000.parquet")
    pq.write_table(pa.table({"chunk_id": ["a"], "n_tokens": [3]}), tmp_path / "shard-0.parquet")
    back = list(read_scored_pages(tmp_path))
    assert back == pages[:5]


def test_export_writes_self_contained_html(tmp_path) -> None:  # type: ignore[no-untyped-def]
    pages = _corpus()
    # a page whose text would end the embedding <script> early if it were not escaped (ΔH right at 0.1)
    pages[50] = replace(pages[50], blocks=make_page(["</script><b>x</b>", png_bytes((5, 5, 5))]).blocks)
    paths = export_review(pages, tmp_path, T, ReviewConfig(per_domain=30, batch_size=16, margin=1.0))
    assert [p.name for p in paths] == ["batch-000.html", "batch-001.html", "batch-002.html"]  # 42 pages
    index = json.loads((tmp_path / "index.json").read_text())
    assert index["per_domain"] == {"chemistry": 30, "default": 12}
    html = paths[0].read_text()
    assert not re.search(r"(src|href)=[\"']?(https?:)?//", html), "review page must not load anything remote"
    data = json.loads(re.search(r'<script id="review-data" type="application/json">(.*?)</script>', html, re.S)[1])
    assert data["batch"] == "batch-000" and len(data["items"]) == 16
    item = data["items"][0]
    assert item["render"].startswith("data:image/png;base64,") and item["crops"][0].startswith("data:image/png")
    assert {"delta_h_nats", "ppl_text", "ppl_inter", "n_images"} <= set(item["scores"])
    assert {it["domain"] for it in data["items"]} == {"chemistry", "default"}  # domains interleaved
    all_items = [
        it
        for p in paths
        for it in json.loads(
            re.search(r'<script id="review-data" type="application/json">(.*?)</script>', p.read_text(), re.S)[1]
        )["items"]
    ]
    assert any(it["text"] == "</script><b>x</b>" for it in all_items)  # escaped, survived the round trip


def _decisions_file(path, items: list[tuple[str, str, float, str]]) -> None:  # type: ignore[no-untyped-def]
    path.write_text(
        json.dumps(
            {
                "format": "scifolio.review.decisions/1",
                "batch": path.stem,
                "decisions": [
                    {"page_id": pid, "domain": dom, "delta_h_nats": dh, "threshold": 0.0, "decision": lab}
                    for pid, dom, dh, lab in items
                ],
            }
        )
    )


def test_fit_from_decisions_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    _decisions_file(
        tmp_path / "decisions-a.json",
        [
            ("p1", "chemistry", 0.01, "reject"),
            ("p2", "chemistry", 0.05, "reject"),
            ("p3", "chemistry", 0.09, "accept"),
            ("p4", "chemistry", 0.2, "accept"),
            ("p5", "chemistry", 0.06, "accept"),
        ],
    )
    # a second sitting re-decides p5: the last decision wins
    _decisions_file(tmp_path / "decisions-b.json", [("p5", "chemistry", 0.06, "reject")])
    decisions = load_decisions([tmp_path / "decisions-a.json", tmp_path / "decisions-b.json"])
    assert len(decisions) == 5
    new, fits = fit_from_decisions(decisions, T)
    assert fits["chemistry"].agreement == 1.0
    assert 0.06 < new.threshold_for("chemistry") < 0.09
    assert new.threshold_for("default") == 0.05  # no decisions: unchanged
    assert new.fit["chemistry"]["n"] == 5


def test_cli_export_then_fit(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    write_scored_pages(_corpus(), tmp_path / "build" / "visual_gain" / "pages-000.parquet")
    thr = T.save(tmp_path / "t.json")
    args = _parser().parse_args(
        [
            "review",
            "export",
            str(tmp_path / "build"),
            "--out",
            str(tmp_path / "review"),
            "--thresholds",
            str(thr),
            "--per-domain",
            "8",
            "--batch-size",
            "50",
        ]
    )
    assert args.func(args) == 0
    assert (tmp_path / "review" / "batch-000.html").exists()
    _decisions_file(
        tmp_path / "review" / "decisions-batch-000.json",
        [("a", "default", 0.02, "reject"), ("b", "default", 0.04, "reject"), ("c", "default", 0.08, "accept")],
    )
    out = tmp_path / "fitted.json"
    args = _parser().parse_args(
        [
            "review",
            "fit",
            str(tmp_path / "review" / "decisions-batch-000.json"),
            "--thresholds",
            str(thr),
            "--out",
            str(out),
        ]
    )
    assert args.func(args) == 0
    assert "default" in capsys.readouterr().out
    assert Thresholds.load(out).threshold_for("default") == pytest.approx(0.06)
    assert Thresholds.load(out).threshold_for("chemistry") == 0.10


def test_cli_export_with_nothing_scored_fails(tmp_path) -> None:  # type: ignore[no-untyped-def]
    args = _parser().parse_args(["review", "export", str(tmp_path), "--out", str(tmp_path / "r")])
    assert args.func(args) == 1


def test_help_is_available(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit):
        _parser().parse_args(["review", "fit", "--help"])
    assert "agreement" in capsys.readouterr().out
