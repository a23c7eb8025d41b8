"""Per-domain visual-gain thresholds, the domain of a document, and the keep/drop decision (SPEC §A2).

A page is kept when ΔH (nats/token) ≥ threshold[domain]. Thresholds live in a small JSON file (the
packaged ``thresholds.json`` is an uncalibrated default); ``scifolio review fit`` rewrites it from human
decisions with ``fit_threshold`` (the threshold that maximises agreement with accept/reject labels).

Domain: the document's metadata when it says (``domain``, ``subject``/``keywords``/``journal``, arXiv
categories), else a keyword-lexicon classifier over the page text (cheap, transparent, no model).

    python -m pytest tests/visual_gain/test_thresholds.py -q
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from formats.records import Dropped, Page
from formats.scores import VisualGainScore

DOMAINS: tuple[str, ...] = ("life_sciences", "chemistry", "materials_science", "default")
DEFAULT_PATH = Path(__file__).with_name("thresholds.json")
FORMAT = "scifolio.visual_gain.thresholds/1"
STAGE = "visual_gain"

# Word stems per domain; a match counts once per occurrence in lower-cased text (word-start anchored).
LEXICON: dict[str, tuple[str, ...]] = {
    "life_sciences": (
        "protein",
        "gene",
        "genom",
        "cell",
        "enzym",
        "dna",
        "rna",
        "mrna",
        "mice",
        "mouse",
        "patient",
        "clinical",
        "tissue",
        "neuron",
        "bacteri",
        "virus",
        "viral",
        "antibod",
        "receptor",
        "transcript",
        "mutation",
        "species",
        "biolog",
        "immun",
        "tumor",
        "tumour",
        "plasma",
        "in vivo",
        "in vitro",
        "organism",
    ),
    "chemistry": (
        "synthes",
        "molecul",
        "reaction",
        "catalys",
        "ligand",
        "solvent",
        "spectr",
        "nmr",
        "yield",
        "compound",
        "reagent",
        "titrat",
        "oxidat",
        "reduct",
        "acid",
        "chemical",
        "chemistr",
        "mol",
        "bond",
        "organic",
        "polymer",
        "chromatograph",
        "ion",
    ),
    "materials_science": (
        "alloy",
        "crystal",
        "lattice",
        "grain",
        "thin film",
        "microstructur",
        "diffraction",
        "xrd",
        "sem image",
        "annealing",
        "band gap",
        "bandgap",
        "dielectric",
        "semiconductor",
        "ceramic",
        "perovskite",
        "phase diagram",
        "tensile",
        "hardness",
        "substrate",
        "dopant",
        "doping",
        "nanoparticle",
        "composite",
        "material",
    ),
}
# metadata keys that may name the field, in the order they are trusted
META_KEYS = ("domain", "subject", "subjects", "categories", "arxiv_category", "keywords", "journal", "title")
# arXiv category prefixes → domain
ARXIV = {
    "q-bio": "life_sciences",
    "physics.bio-ph": "life_sciences",
    "physics.chem-ph": "chemistry",
    "cond-mat.mtrl-sci": "materials_science",
}
ALIASES = {
    "life sciences": "life_sciences",
    "biology": "life_sciences",
    "medicine": "life_sciences",
    "chemistry": "chemistry",
    "materials science": "materials_science",
    "materials": "materials_science",
    "default": "default",
}


def classify_text(text: str, min_hits: int = 3) -> str:
    """Lexicon classifier: the domain with the most stem hits, if it has ≥ ``min_hits`` and is unique."""
    low = text.lower()
    hits = {d: sum(len(re.findall(r"\b" + re.escape(s), low)) for s in stems) for d, stems in LEXICON.items()}
    best = max(hits.values())
    winners = [d for d, h in hits.items() if h == best]
    return winners[0] if best >= min_hits and len(winners) == 1 else "default"


def domain_of(meta: Mapping[str, Any] | None = None, text: str = "") -> str:
    """The domain of a document: from its metadata when it says, else from the page text."""
    meta = meta or {}
    for key in META_KEYS:
        value = meta.get(key)
        if not value:
            continue
        values = [str(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
        for v in values:
            if v in DOMAINS:
                return v
            if v.strip().lower().replace("-", " ").replace("_", " ") in ALIASES:
                return ALIASES[v.strip().lower().replace("-", " ").replace("_", " ")]
            for prefix, dom in ARXIV.items():
                if v.startswith(prefix):
                    return dom
        if key in ("keywords", "journal", "title", "subject", "subjects"):
            guess = classify_text(" ".join(values), min_hits=1)
            if guess != "default":
                return guess
    return classify_text(text) if text else "default"


def page_text(page: Page) -> str:
    return "\n".join(b.text for kind, b in page.content() if kind == "text")


def page_domain(page: Page, doc_meta: Mapping[str, Any] | None = None) -> str:
    """Document metadata first, then the page's own metadata, then its text."""
    merged = {**(page.meta or {}), **(doc_meta or {})}
    return domain_of(merged, page_text(page))


@dataclass(frozen=True)
class FitResult:
    """A threshold fitted to human decisions."""

    threshold: float
    agreement: float  # fraction of decisions the threshold reproduces
    n: int
    n_accept: int


def fit_threshold(delta_h: Sequence[float], accepted: Sequence[bool]) -> FitResult:
    """The threshold t maximising agreement of ``accept ⇔ ΔH ≥ t`` with the labels.

    Candidates are the midpoints between consecutive distinct ΔH values plus one below the minimum and
    one above the maximum; ties between equally good cut points go to the middle one of the best run,
    so an error-free labelling lands in the middle of the gap between the classes.
    """
    if len(delta_h) != len(accepted) or not delta_h:
        raise ValueError("need one label per ΔH value and at least one decision")
    xs = sorted(set(float(x) for x in delta_h))
    cands = [xs[0] - 1e-6] + [(a + b) / 2 for a, b in zip(xs, xs[1:])] + [xs[-1] + 1e-6]
    pairs = list(zip((float(x) for x in delta_h), (bool(a) for a in accepted)))
    scores = [sum((x >= t) == a for x, a in pairs) for t in cands]
    best = max(scores)
    best_idx = [i for i, s in enumerate(scores) if s == best]
    t = cands[best_idx[len(best_idx) // 2]]
    return FitResult(t, best / len(pairs), len(pairs), sum(a for _, a in pairs))


@dataclass(frozen=True)
class Thresholds:
    """Per-domain ΔH thresholds (nats/token) and the keep/drop rule."""

    by_domain: Mapping[str, float]
    """domain → threshold; "default" is used for any domain not listed."""
    keep_text_only: bool = False
    """Keep pages without visuals (their ΔH is 0 by definition); SPEC's rule alone would drop them."""
    fit: Mapping[str, Any] = field(default_factory=dict)
    """The last review fit per domain (n, agreement), kept for the record."""

    @classmethod
    def load(cls, path: str | Path | None = None) -> Thresholds:
        data = json.loads(Path(path or DEFAULT_PATH).read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"{path}: not a thresholds file (format {data.get('format')!r}, want {FORMAT!r})")
        by = {str(k): float(v) for k, v in data["thresholds"].items()}
        if "default" not in by:
            raise ValueError(f"{path}: thresholds need a 'default' entry")
        return cls(by, bool(data.get("keep_text_only", False)), data.get("fit", {}))

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "format": FORMAT,
            "unit": "delta_h_nats_per_token",
            "thresholds": dict(self.by_domain),
            "keep_text_only": self.keep_text_only,
            "fit": dict(self.fit),
        }
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        return path

    def threshold_for(self, domain: str) -> float:
        return float(self.by_domain.get(domain, self.by_domain["default"]))

    def decide(self, page: Page, domain: str) -> Page | Dropped:
        """Keep (the page, with threshold/domain/kept recorded) or a ``Dropped`` carrying the numbers."""
        vg = VisualGainScore.of(page)
        if vg is None:
            raise ValueError(f"page {page.page_id} has no visual_gain scores; run the scorer first")
        t = self.threshold_for(domain)
        if vg.n_images == 0:
            kept, reason = self.keep_text_only, "no_visuals"
        elif vg.n_text_tokens == 0:
            kept, reason = False, "no_text"  # ΔH is undefined without text; never counts as a gain
        else:
            kept, reason = vg.delta_h_nats >= t, "below_threshold"
        if not kept:
            return Dropped(page.page_id, STAGE, reason, vg.decided(t, domain, False).to_dict())
        return vg.decided(t, domain, True).on(page)
