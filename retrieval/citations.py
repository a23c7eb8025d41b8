"""Citation resolver: the body sentences of a document that cite its figures, tables and equations, resolved to
that document's crops ("Fig. 3", "Figure 3(b)", "Figs. 3 and 4", "Figs. 3–5", "Table 2", "Eq. (5)", and the
German "Abb./Abbildung/Tab./Tabelle/Gl.").

Input is what the shards hold: a document's segments in document order (text segments whose lines are the
parser's text blocks, image segments naming a crop) and each crop's kind (figure, table, equation).

Numbering, per kind:
- from captions: a line starting with a label and a number ("Figure 3.", "Abbildung 2:", "Table 1", "Tab. 2")
  in the text segment right after a run of consecutive image segments (its first lines) or right before it (its
  last lines) numbers every crop of that run (subfigures share their caption); equations take the "(n)" that
  ends an adjacent line;
- else by order of appearance: when no crop of a kind has a caption number, the k-th crop of that kind is
  number k. When some do, crops of that kind without one stay unnumbered (a guess would mislabel them).

A citing sentence is a body sentence (caption lines excluded) with at least one reference; it resolves to the
crops its numbers name. References to numbers no crop carries are counted as unresolved.

    python -m retrieval.citations OUT     # per document: crops, their numbers and captions, citing sentences
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

# Reference labels per crop kind (body text and captions). Longest alternatives first.
LABELS: dict[str, str] = {
    "figure": r"Figures?|Figs?\.?|Abbildungen|Abbildung|Abbn?\.|Bild",
    "table": r"Tables?|Tabs?\.|Tabellen?",
    "equation": r"Equations?|Eqs?\.|Eqns?\.|Gleichungen?|Gln?\.",
}
_NUM = r"\(?(\d{1,3}(?:\.\d{1,3})?)(?!\d|\.\d)\)?(?:\s*\(?[a-z]\)|[a-z](?![a-z]))?"  # 3, (5), 3(b), 3b, (3a)
_SEP = r"\s*(?:,|;|and|und|&|or|oder|[-–—]|to|bis)\s*"
REF_RE = {
    kind: re.compile(rf"\b(?:{labels})\s*{_NUM}(?:{_SEP}{_NUM})*", re.IGNORECASE) for kind, labels in LABELS.items()
}
NUM_RE = re.compile(r"\(?(\d{1,3}(?:\.\d{1,3})?)(?!\d|\.\d)\)?(?:\s*\([a-z]\)|[a-z](?![a-z]))?")
CAPTION_RE = {
    kind: re.compile(rf"^\s*(?:{labels})\s*(\d{{1,3}}(?:\.\d{{1,3}})?)(?:\s*[.:|—–-]|\s+[A-ZÄÖÜ(]|\s*$)", re.IGNORECASE)
    for kind, labels in LABELS.items()
    if kind != "equation"
}
EQ_NUMBER_RE = re.compile(r"\((\d{1,3}(?:\.\d{1,3})?)\)\s*$")
KIND_OF = {"figure": "figure", "image": "figure", "chart": "figure", "table": "table", "equation": "equation"}
CAPTION_LINES = 3  # lines of the neighbouring text segment searched for a caption
# A sentence that starts like a caption ("Figure 5: CMB spectra …", "Table 2. …") is one, wherever the parser
# put it; it is not a citing sentence.
CAPTION_SENTENCE_RE = {
    kind: re.compile(rf"^\s*(?:{labels})\s*\d{{1,3}}(?:\.\d{{1,3}})?\s*[.:|]", re.IGNORECASE)
    for kind, labels in LABELS.items()
    if kind != "equation"
}
MAX_REFS = 4  # a sentence naming more items is a list (image credits, an index), not a description of one


@dataclass
class CitedCrop:
    """One crop of a document: its number per kind (0 = unnumbered), caption, and the sentences citing it."""

    sha256: str
    kind: str  # figure | table | equation (normalised)
    order: int  # position among the document's crops of this kind, from 1
    number: str = ""  # "3", "2.10" (chapter-wise numbering); "" = unnumbered
    caption: str = ""
    citing: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Citation:
    """A body sentence with references: ``refs`` (kind, number) pairs, ``targets`` the crops they resolve to."""

    doc_id: str
    sentence: str
    refs: tuple[tuple[str, str], ...]
    targets: tuple[str, ...]
    unresolved: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class DocCitations:
    doc_id: str
    crops: tuple[CitedCrop, ...]
    citations: tuple[Citation, ...]

    @property
    def unresolved(self) -> int:
        """References (kind, number) that no crop of the document carries."""
        return sum(len(c.unresolved) for c in self.citations)


def expand_numbers(match: str) -> list[str]:
    """Numbers of one reference match: "Figs. 3 and 4" → ["3", "4"]; "Figs. 3–5" → ["3", "4", "5"];
    "Fig. 2(a)" → ["2"]; "Abb. 2.3" → ["2.3"] (ranges expand between plain integers only)."""
    label_end = re.match(r"\D*", match).end()
    body = match[label_end:]
    nums: list[str] = []
    pos = 0
    for m in NUM_RE.finditer(body):
        n = m.group(1)
        between = body[pos : m.start()]
        ranged = nums and re.fullmatch(r"\s*(?:[-–—]|to|bis)\s*", between)
        if ranged and n.isdigit() and nums[-1].isdigit() and 0 < int(n) - int(nums[-1]) <= 20:
            nums.extend(str(i) for i in range(int(nums[-1]) + 1, int(n) + 1))
        else:
            nums.append(n)
        pos = m.end()
    return list(dict.fromkeys(nums))


def find_refs(sentence: str) -> list[tuple[str, str]]:
    """(kind, number) references in a sentence, in order, deduplicated."""
    found: list[tuple[int, str, str]] = []
    for kind, rx in REF_RE.items():
        for m in rx.finditer(sentence):
            found.extend((m.start(), kind, n) for n in expand_numbers(m.group(0)))
    found.sort()
    return list(dict.fromkeys((k, n) for _, k, n in found))


def strip_refs(sentence: str) -> str:
    """The sentence without its reference tokens ("As Fig. 3 shows, ..." → "As shows, ..."): a query that does
    not give the answer's number away."""
    for rx in REF_RE.values():
        sentence = rx.sub(" ", sentence)
    return re.sub(r"\s+", " ", re.sub(r"\(\s*\)", " ", sentence)).strip()


_SENT_END = re.compile(r"(?<=[.!?])\s+(?=[A-ZÄÖÜ(\[])")
_ABBREV = re.compile(
    r"\b(?:Figs?|Abbn?|Tabs?|Eqs?|Eqns?|Gln?|Ref|Refs|Sec|Secs|Nr|No|vs|ca|al|bzw|vgl|z\.B|i\.e|e\.g|resp)\.$"
)


def sentences(text: str) -> list[str]:
    """Sentences of a text (lines joined; a period after an abbreviation such as "Fig." or "et al." ends none)."""
    flat = re.sub(r"-\n(?=[a-zäöü])", "", text)  # words hyphenated at a line end
    flat = re.sub(r"\s+", " ", flat).strip()
    if not flat:
        return []
    out: list[str] = []
    start = 0
    for m in _SENT_END.finditer(flat):
        piece = flat[start : m.start()]
        if _ABBREV.search(piece):
            continue
        out.append(piece.strip())
        start = m.end()
    out.append(flat[start:].strip())
    return [s for s in out if s]


def _caption_number(line: str, kind: str) -> str:
    m = EQ_NUMBER_RE.search(line) if kind == "equation" else CAPTION_RE[kind].match(line)
    return m.group(1) if m else ""


def _lines(text: str) -> list[str]:
    return [ln.strip() for ln in (text or "").split("\n") if ln.strip()]


def resolve_document(doc_id: str, segments: Sequence, kinds: dict[str, str]) -> DocCitations:
    """Resolve one document. ``segments``: objects with ``kind`` (text|image), ``text``, ``image_sha256`` in
    document order (a document's chunks concatenated; overlap repeats are harmless). ``kinds``: sha256 → crop
    kind (figure, table, equation; other names of a figure are folded into it)."""
    crops: dict[str, CitedCrop] = {}
    per_kind: dict[str, int] = {}
    caption_lines: set[str] = set()
    segs = list(segments)
    i = 0
    while i < len(segs):
        if segs[i].kind != "image":
            i += 1
            continue
        j = i
        while j < len(segs) and segs[j].kind == "image":  # a run of images (subfigures) shares its caption
            j += 1
        run: list[CitedCrop] = []
        for s in segs[i:j]:
            sha = s.image_sha256
            if sha in crops or not sha:
                continue
            kind = KIND_OF.get(kinds.get(sha, "figure"), "figure")
            per_kind[kind] = per_kind.get(kind, 0) + 1
            crops[sha] = CitedCrop(sha256=sha, kind=kind, order=per_kind[kind])
            run.append(crops[sha])
        after = _lines(segs[j].text) if j < len(segs) and segs[j].kind == "text" else []
        before = _lines(segs[i - 1].text) if i > 0 and segs[i - 1].kind == "text" else []
        for crop in run:
            # Figures are captioned below, tables above: look on the usual side first.
            sides = [after[:CAPTION_LINES], before[-CAPTION_LINES:][::-1]]
            if crop.kind == "table":
                sides.reverse()
            for lines in sides:
                hit = next(((ln, n) for ln in lines if (n := _caption_number(ln, crop.kind))), None)
                if hit:
                    crop.caption, crop.number = hit[0], hit[1]
                    if crop.kind != "equation":
                        caption_lines.add(hit[0])
                    break
        i = j
    for kind in set(c.kind for c in crops.values()):
        of_kind = [c for c in crops.values() if c.kind == kind]
        if not any(c.number for c in of_kind):
            for c in of_kind:
                c.number = str(c.order)
    by_number: dict[tuple[str, str], list[str]] = {}
    for c in crops.values():
        if c.number:
            by_number.setdefault((c.kind, c.number), []).append(c.sha256)
    citations: list[Citation] = []
    seen: set[str] = set()
    for s in segs:
        if s.kind != "text":
            continue
        body = "\n".join(ln for ln in _lines(s.text) if ln not in caption_lines)
        for sent in sentences(body):
            refs = find_refs(sent)
            if any(rx.match(sent) for rx in CAPTION_SENTENCE_RE.values()) or len(refs) > MAX_REFS:
                continue
            if not refs or sent in seen:  # chunk overlap repeats text: one citation per sentence
                continue
            seen.add(sent)
            targets = tuple(dict.fromkeys(sha for r in refs for sha in by_number.get(r, ())))
            unresolved = tuple(r for r in refs if r not in by_number)
            citations.append(Citation(doc_id, sent, tuple(refs), targets, unresolved))
            for sha in targets:
                crops[sha].citing.append(sent)
    return DocCitations(doc_id, tuple(crops.values()), tuple(citations))


@dataclass(frozen=True)
class _Seg:
    kind: str
    text: str
    image_sha256: str


def resolve_chunks(chunks: Iterable) -> list[DocCitations]:
    """Resolve every document of some shard chunks (read with parts segments + images; a document's chunks in
    chunk order). Only text, image references and kinds are kept, never image bytes."""
    docs: dict[str, list[tuple[int, list[_Seg]]]] = {}
    kinds: dict[str, dict[str, str]] = {}
    for ch in chunks:
        segs = [_Seg(s.kind, s.text or "", s.image_sha256 or "") for s in ch.segments]
        docs.setdefault(ch.doc_id, []).append((ch.chunk_index, segs))
        kinds.setdefault(ch.doc_id, {}).update({im.sha256: im.kind for im in ch.images})
    return [
        resolve_document(doc, [seg for _, segs in sorted(parts, key=lambda p: p[0]) for seg in segs], kinds[doc])
        for doc, parts in docs.items()
    ]


def crop_citations(docs: Iterable[DocCitations]) -> dict[str, tuple[str, tuple[str, ...]]]:
    """sha256 → (caption, citing sentences) over documents; a crop shown by several documents (a logo, a shared
    table) gathers the citing sentences of all of them and keeps the first caption found."""
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for d in docs:
        for c in d.crops:
            cap, citing = out.get(c.sha256, ("", ()))
            out[c.sha256] = (cap or c.caption, tuple(dict.fromkeys((*citing, *c.citing))))
    return out


def resolve_shards(out: str) -> list[DocCitations]:
    """Every document of a build output directory (shard files read one at a time)."""
    from formats.shards import ShardFile, list_shards

    docs: list[DocCitations] = []
    for path in list_shards(out):
        docs.extend(resolve_chunks(ShardFile(path).iter_chunks(parts=("segments", "images"))))
    return docs


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        print("usage: python -m retrieval.citations OUT", file=sys.stderr)
        return 2
    for d in resolve_shards(argv[0]):
        print(
            f"doc {d.doc_id[:12]}: {len(d.crops)} crops, {len(d.citations)} citing sentences, {d.unresolved} unresolved"
        )
        for c in d.crops:
            print(f"  {c.kind} {c.number or '-'} {c.sha256[:10]} caption={c.caption[:60]!r} citing={len(c.citing)}")
        for c in d.citations:
            print(f"    {c.refs} -> {[t[:6] for t in c.targets]} {c.sentence[:90]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
