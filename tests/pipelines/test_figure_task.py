"""``pipelines.assembly.figure_task``: chunks stitched back across their overlap, captions found by label next to
their crop, and multiple-choice rows whose answer letter names the true caption, split by document."""

from __future__ import annotations

import base64
import re

from formats.shards import ChunkRow, Segment, ShardImage
from pipelines.assembly.figure_task import CaptionedCrop, FigureTaskConfig, build_rows, captioned_crops, stitch


def _text(t: str, page: int = 0) -> Segment:
    return Segment("text", len(t.split()), page, text=t)


def _img(sha: str, page: int = 0) -> Segment:
    return Segment("image", 4, page, image_sha256=sha)


def test_stitch_drops_the_repeated_overlap_text_and_images() -> None:
    doc = "d" * 64
    chunks = [
        ChunkRow(doc, 0, (_text("Intro text.\n\n"), _img("aa"))),
        ChunkRow(doc, 1, (_img("aa"), _text("Figure 1: Flux vers"))),  # the image repeated whole
        ChunkRow(doc, 2, (_text("Figure 1: Flux versus time.\n\nMore text ab"),)),  # a cut word repeated
        ChunkRow(doc, 3, (_text("text about it."), _img("bb", page=1), _text("Table 1: Sizes.", page=1))),
    ]
    got = stitch(list(reversed(chunks)), overlap=16)
    paragraphs = [p for p in re.split(r"\n\s*\n", got) if p]
    assert paragraphs == ["Intro text.", "\x00aa\x00", "Figure 1: Flux versus time.", "More text about it.", "\x00bb\x00",
                          "Table 1: Sizes."]  # fmt: skip
    assert stitch(chunks, overlap=0).count("\x00aa\x00") == 2  # no overlap configured: nothing is matched away


def _shard(tmp_path, rows):
    from formats.shards import write_shard

    (tmp_path / "shards").mkdir()
    write_shard(tmp_path / "shards" / "shard-00000-of-00001.parquet", rows)
    return str(tmp_path)


def test_captions_by_label_beside_their_crop_and_skips_with_reasons(tmp_path) -> None:
    im = {k: ShardImage(k, f"png-{k}".encode(), 10, 10, kind) for k, kind in
          [("f1", "figure"), ("t1", "table"), ("e1", "equation"), ("f2", "figure"), ("f3", "figure")]}  # fmt: skip
    im |= {  # equations with their known text (schema 4): asked about when long enough, once per text
        "e2": ShardImage("e2", b"png-e2", 10, 10, "equation", text="E = \\frac{1}{2} m v^2 (2)", text_from="latex"),
        "e3": ShardImage("e3", b"png-e3", 10, 10, "equation", text="x = 1", text_from="ocr"),
        "e4": ShardImage("e4", b"png-e4", 10, 10, "equation", text="E  =  \\frac{1}{2} m v^2", text_from="ocr"),
    }
    row = ChunkRow(
        "a" * 64,
        0,
        (
            _img("f1"),
            _text("Figure 1: Growth of the film.\n\nTable 1: Lattice constants."),
            _img("t1"),
            _text("Body."),
            _img("e1"),
            _img("f2"),
            _text("No label here."),
            _img("f3"),
            _text("Fig. 3 Spectrum."),
            _img("f1"),
            _img("e2"),
            _img("e3"),
            _img("e4"),
        ),  # fmt: skip
        images=tuple(im.values()),
    )
    crops, skipped = captioned_crops(_shard(tmp_path, [row]))
    assert [(c.sha256, c.kind, c.caption) for c in crops] == [
        ("f1", "figure", "Figure 1: Growth of the film."),
        ("t1", "table", "Table 1: Lattice constants."),  # a table's caption above it
        ("f3", "figure", "Fig. 3 Spectrum."),
        ("e2", "equation", "E = \\frac{1}{2} m v^2"),  # its number "(2)" left out
    ]
    assert crops[0].png == b"png-f1" and crops[-1].text_from == "latex"
    assert skipped == {
        "equation_text_unknown": 1,
        "equation_text_too_short": 1,
        "equation_text_taken": 1,  # e4: e2's text with other spacing
        "no_caption": 1,
    }
    crops, skipped = captioned_crops(str(tmp_path), FigureTaskConfig(kinds=("equation",)))
    assert [c.sha256 for c in crops] == ["e2"] and skipped["kind_not_asked"] == 4


def test_equation_rows_ask_for_the_expression_among_other_equations_only() -> None:
    figures = [CaptionedCrop(f"doc{d}", f"f{d}", "figure", b"\x89PNG", f"Figure 1: thing {d}.") for d in range(4)]
    eqs = [
        CaptionedCrop(f"doc{d}", f"e{d}", "equation", b"\x89PNG", f"a_{d} = b^{d} + c", "text-layer-math") for d in range(4)
    ]  # fmt: skip
    latex = CaptionedCrop("doc0", "L0", "equation", b"\x89PNG", "\\sum_i a_i = 1", "latex")
    rows, counts = build_rows(figures + eqs + [latex], FigureTaskConfig(seed=1, test_fraction=0.5, choices=3))
    got = [r for s in rows.values() for r in s if r["kind"] == "equation" and r["text_from"] != "latex"]
    assert len(got) == 4 and counts["too_few_options"] == 0
    for r in got:  # text read the same way first: the LaTeX expression is never a text-layer row's distractor
        text = r["messages"][0]["content"][1]["text"]
        assert text.startswith("Which expression does this equation show?")
        options = [line[3:] for line in text.splitlines() if line[:3] in ("A) ", "B) ", "C) ")]
        assert all(o.startswith("a_") for o in options)  # never a figure caption
        assert options["ABC".index(r["answer"])] == f"a_{r['image_sha256'][1]} = b^{r['image_sha256'][1]} + c"
        assert r["text_from"] == "text-layer-math"
    # two equations in the corpus cannot fill 3 options: skipped and counted, the figures still asked
    rows, counts = build_rows(figures + eqs[:2], FigureTaskConfig(seed=1, test_fraction=0.5, choices=3))
    assert counts["too_few_options"] == 2 and sum(len(r) for r in rows.values()) == 4


def test_rows_split_by_document_answer_names_the_true_caption() -> None:
    crops = [
        CaptionedCrop(f"doc{d}", f"sha{d}{i}", "figure", b"\x89PNG", f"Figure {i}: thing {d}-{i}.")
        for d in range(5)
        for i in range(2)
    ]
    cfg = FigureTaskConfig(seed=3, test_fraction=0.4, choices=4)
    rows, counts = build_rows(crops, cfg)
    assert (len(rows["train"]), len(rows["test"])) == (6, 4)
    train_docs, test_docs = ({r["doc_id"] for r in rows[s]} for s in ("train", "test"))
    assert len(test_docs) == 2 and not train_docs & test_docs
    by_sha = {c.sha256: c for c in crops}
    letters = set()
    for r in rows["train"] + rows["test"]:
        parts = r["messages"][0]["content"]
        assert parts[0]["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(b"\x89PNG").decode()
        options = [line[3:] for line in parts[1]["text"].splitlines() if line[:3] in ("A) ", "B) ", "C) ", "D) ")]
        assert len(options) == len(set(options)) == 4
        assert options["ABCD".index(r["answer"])] == by_sha[r["image_sha256"]].caption
        letters.add(r["answer"])
    assert len(letters) > 1  # the choices are shuffled
    assert build_rows(crops, cfg)[0] == rows  # fixed seed, same rows
    assert build_rows(crops, FigureTaskConfig(seed=4))[0] != rows
    assert counts["distractors_from_other_split"] == 0
    few, counts = build_rows(crops[:3], cfg)
    assert few == {"train": [], "test": []} and counts["too_few_captions"] == 3
