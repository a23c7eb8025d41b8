"""A tiny corpus whose body text cites its figures, built through ``scifolio build`` (the citation resolver's and
the text channels' test input): an English paper ("Fig. 2(a)", "Figs. 3 and 4", "Table 1", "Eq. (1)") and a
German one ("Abbildung 2", "Abb. 3 und 4", "Tab. 1"), each figure with its caption below it and a topic of its
own so that text queries have one right answer."""

from __future__ import annotations

from pathlib import Path

from tests.pipelines.pdfs import _raster_png, draw_table, prose

# (body sentence citing the figure of this page, caption topic) per page; page 0 also holds Table 1 + Eq. (1).
PAPERS = {
    "en": (
        "Figure",
        [
            "As Fig. 1 shows, the grain size of the oxide film rises with the anneal time.",
            "Fig. 2(a) compares the carrier mobility on sapphire and silicon substrates.",
            "Figs. 3 and 4 show the magnetic hysteresis loops measured at low temperature.",
            "The fitted activation barrier is listed in Table 1 and follows Eq. (1).",
        ],
        ["grain size growth", "carrier mobility", "hysteresis loop at 4 K", "hysteresis loop at 300 K"],
    ),
    "de": (
        "Abbildung",
        [
            "Abb. 1 zeigt den Aufbau der Vakuumkammer mit der Pumpe.",
            "Abbildung 2 zeigt die Leitfähigkeit der dotierten Schichten über der Temperatur.",
            "Wie Abb. 3 und 4 zeigen, steigt die Ladungsträgerdichte mit der Dotierung.",
            "Die Parameter der Anpassung stehen in Tab. 1.",
        ],
        ["Vakuumkammer", "Leitfähigkeit", "Ladungsträgerdichte dünn", "Ladungsträgerdichte dick"],
    ),
}


def write_cited_paper(path: Path, lang: str, seed: int) -> Path:
    import pymupdf

    label, body, topics = PAPERS[lang]
    doc = pymupdf.open()
    for p in range(4):
        page = doc.new_page(width=612, height=792)
        text = f"{body[p]} The measurement series {seed}.{p} was repeated three times on fresh samples."
        page.insert_textbox(pymupdf.Rect(72, 60, 540, 140), text, fontsize=10)
        page.insert_image(pymupdf.Rect(150, 150, 462, 340), stream=_raster_png(seed=seed * 10 + p))
        page.insert_text((150, 358), f"{label} {p + 1}. {topics[p]} of sample {seed}.", fontsize=9)
        # unrelated prose between figures, so the text around one figure does not reach the next one's
        page.insert_textbox(pymupdf.Rect(72, 560, 540, 780), prose(seed * 100 + p, 100), fontsize=10)
        if p == 0:  # a ruled table with its caption above it, and a numbered equation
            page.insert_text((150, 412), "Table 1. Fitted parameters." if lang == "en" else "Tabelle 1. Parameter.")
            draw_table(page, 420, seed)
            page.insert_text((200, 530), "sigma(T) = sigma_0 exp(-E_a / k_B T)        (1)", fontsize=12)
    doc.save(path)
    doc.close()
    return path


def build_cited_corpus(root: Path, tokenizer: str) -> Path:
    """Write the two papers and build them with ``scifolio build`` (pymupdf backend, in-memory runner); returns
    the build output directory."""
    from pipelines.cli import main

    pdfs = root / "pdfs"
    pdfs.mkdir(parents=True)
    write_cited_paper(pdfs / "en.pdf", "en", 1)
    write_cited_paper(pdfs / "de.pdf", "de", 2)
    out = root / "out"
    argv = ["build", str(pdfs), "--out", str(out), "--tokenizer", tokenizer, "--backend", "pymupdf"]
    assert main([*argv, "--no-progress", "--direct_running_mode=in_memory", "--direct_num_workers=1"]) == 0
    return out
