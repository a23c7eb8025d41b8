"""The citation resolver on a corpus built through ``scifolio build`` and on its pure functions."""

from __future__ import annotations

from pathlib import Path

import pytest
from cited_corpus import PAPERS

from retrieval.citations import find_refs, resolve_shards, sentences, strip_refs


@pytest.mark.parametrize(
    "text, refs",
    [
        ("Fig. 2(a) compares", [("figure", "2")]),
        ("Figs. 3 and 4 show", [("figure", "3"), ("figure", "4")]),
        ("Figs. 3–5 show", [("figure", "3"), ("figure", "4"), ("figure", "5")]),
        ("Figure 3(b) and Table 2 follow Eq. (5).", [("figure", "3"), ("table", "2"), ("equation", "5")]),
        ("Abbildung 2 zeigt; vgl. Abb. 2.3 und Tabelle 4", [("figure", "2"), ("figure", "2.3"), ("table", "4")]),
        ("Wie Abb. 3 und 4 zeigen, steht in Tab. 1", [("figure", "3"), ("figure", "4"), ("table", "1")]),
        ("in figure 6 we vary the depth", [("figure", "6")]),
        ("In 2019 we used 1234 samples and a figure of merit.", []),
    ],
)
def test_references_in_a_sentence(text: str, refs: list) -> None:
    assert find_refs(text) == refs


def test_stripping_the_references_leaves_the_description() -> None:
    assert strip_refs("As Fig. 3(b) shows, the loops widen.") == "As shows, the loops widen."
    assert strip_refs("Figs. 3 and 4 show the loops.") == "show the loops."


def test_sentence_split_keeps_abbreviations_inside() -> None:
    assert sentences("See Fig. 2 and Abb. 3 for the set-\nup. The loop widens.\nNext line") == [
        "See Fig. 2 and Abb. 3 for the setup.",
        "The loop widens.",
        "Next line",
    ]


def test_a_built_corpus_resolves_its_citations_to_the_cited_crops(cited_out: Path) -> None:
    docs = resolve_shards(str(cited_out))
    assert len(docs) == 2
    for d in docs:
        figures = sorted((c for c in d.crops if c.kind == "figure"), key=lambda c: c.order)
        lang = "en" if figures[0].caption.startswith("Figure") else "de"
        label, body, topics = PAPERS[lang]
        # numbers come from the captions below each figure, in order
        assert [(c.number, c.caption.split(".")[0]) for c in figures] == [(str(i), f"{label} {i}") for i in range(1, 5)]
        by_sentence = {c.sentence: c for c in d.citations}
        fig = {c.number: c.sha256 for c in figures}
        table = next(c for c in d.crops if c.kind == "table")
        assert table.number == "1" and table.caption.startswith(("Table 1", "Tabelle 1"))
        if lang == "en":
            assert by_sentence[body[1]].targets == (fig["2"],)  # "Fig. 2(a)"
            assert by_sentence[body[2]].targets == (fig["3"], fig["4"])  # "Figs. 3 and 4"
            eq = by_sentence[body[3]]  # "Table 1 and ... Eq. (1)": no equation crop in this build
            assert eq.targets == (table.sha256,) and eq.unresolved == (("equation", "1"),)
        else:
            assert by_sentence[body[1]].targets == (fig["2"],)  # "Abbildung 2"
            assert by_sentence[body[2]].targets == (fig["3"], fig["4"])  # "Abb. 3 und 4"
            assert by_sentence[body[3]].targets == (table.sha256,)  # "Tab. 1"
            assert d.unresolved == 0
        assert by_sentence[body[0]].targets == (fig["1"],)
        # a crop's citing sentences are the body sentences that name it; captions are not citing sentences
        assert figures[2].citing == [body[2]] and figures[3].citing == [body[2]]
        assert not any(c.sentence.startswith(f"{label} {i}.") for c in d.citations for i in range(1, 5))
