"""A verifiable multimodal task from a corpus build: "which caption belongs to this figure?" and "which expression
does this equation show?" (issue 37, item 3).

    scifolio posttrain tasks figures --shards out/ --out tasks/figures            # DIR/train.jsonl, DIR/test.jsonl
    scifolio eval --model VLM --task jsonl --data tasks/figures/test.jsonl --n 4 --k 1,4 --out fig.json

Reads ``scifolio build``'s output through ``formats.shards`` (manifest order) and, for every cropped figure and
table whose caption the build kept, writes one multiple-choice row: the crop as an OpenAI-style ``image_url`` part
holding a PNG data URL (rows are self-contained: a jsonl copied or read from ``gs://`` needs no image files beside
it), then the question with ``choices`` captions, lettered A, B, ...; the answer is the letter (``--verifier
exact``). Distractors are other crops' captions, of the same kind and the same split first (then any kind in the
split, then the whole corpus; rows that needed the corpus are counted), drawn and shuffled with a fixed seed.
A display equation whose text the build kept (``ShardImage.text``: the backend's LaTeX, or the glyphs of the PDF's
text layer, or OCR; the row's ``text_from`` says which) gets the same question about its expression, with other
equations' texts as the distractors (those read the same way first, same split before the corpus; never a figure
caption, which would give the answer away; a row that cannot fill its options is skipped as ``too_few_options``).
Pools are built once per corpus and a row's distractors drawn from them in O(choices): 200,000 crops take 6.5 s.
``train.jsonl`` and ``test.jsonl`` hold disjoint documents (a seeded shuffle of the documents with a caption).

How a caption is found: shards keep captions as text (``pipelines.assembly.interleave``), not linked to their
crop. Each document's chunks are stitched back into one stream (a chunk's first ``overlap`` tokens repeat the end
of the previous chunk: the repeated text and images are matched and dropped), split into paragraphs, and a crop's
caption is the paragraph right after it (a table's: right before it first) when that paragraph starts with a label
of the crop's kind ("Figure 3", "Fig. 2", "Scheme 1"; "Table 4"). Everything else is skipped and counted with its
reason: ``no_caption``, ``caption_too_long``, ``caption_taken`` (the paragraph is already another crop's caption),
``equation_text_unknown`` (no text was read for it, or a shard older than schema 4), ``equation_text_too_short``
(under ``min_equation_chars``: "x = 1" asks little), ``equation_text_taken`` (the document already asks about the
same text), ``kind_missing_png`` (a segment names an image its row lacks), ``kind_not_asked`` (a kind left out of
``kinds``), ``too_few_captions`` (fewer than ``choices`` distinct texts in the corpus). Documents stream one at a
time; the captioned crops (their PNGs included) are held until the rows are written.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from formats import fs
from formats.chat_images import data_url
from formats.manifest import MANIFEST_NAME, Manifest
from formats.shards import ChunkRow, ShardFile, list_shards

LETTERS = "ABCDEFGHIJ"
KINDS = ("figure", "table", "equation")
"""The crop kinds the task can ask about."""
_PARAGRAPH = re.compile(r"\n\s*\n")
_IMAGE = re.compile(r"^\x00(\w+)\x00$")
_EQUATION_NUMBER = re.compile(r"\s*\(\s*\d+[a-z]?\s*\)$")
LABELS = {
    "figure": re.compile(r"^(fig(ure)?s?\.?|scheme|chart|plate|graph)\s*[a-z]?\d+", re.IGNORECASE),
    "table": re.compile(r"^tab(le)?s?\.?\s*[a-z]?\d+", re.IGNORECASE),
}
"""The caption labels of each crop kind (a caption is a paragraph that starts with one)."""


@dataclass(frozen=True)
class FigureTaskConfig:
    seed: int = 0
    """Seeds the document split, the distractors and the order of the choices."""
    test_fraction: float = 0.2
    """Share of the documents (with at least one captioned crop) in ``test.jsonl``; at least one when there are two."""
    choices: int = 4
    """Options per question (the answer and ``choices - 1`` distractors)."""
    max_caption_chars: int = 600
    """Longer captions (and equation texts) are skipped (``caption_too_long``)."""
    min_equation_chars: int = 8
    """Equation texts shorter than this (spaces left out) are skipped (``equation_text_too_short``)."""
    kinds: tuple[str, ...] = KINDS
    """The crop kinds asked about; others are skipped as ``kind_not_asked``."""


@dataclass(frozen=True)
class CaptionedCrop:
    """A crop and the text that belongs to it: a figure's or table's caption, an equation's expression."""

    doc_id: str
    sha256: str
    kind: str
    png: bytes
    caption: str
    text_from: str = ""
    """For an equation, where its text came from (``latex``, ``backend``, ``text-layer-math``, ``ocr``)."""


def stitch(chunks: Sequence[ChunkRow], overlap: int) -> str:
    """One document's chunks (any order) → its text with each image as its own paragraph ``\\x00sha256\\x00``; the
    overlap a chunk repeats from the previous one is found by matching and kept once."""
    text = ""
    for c in sorted(chunks, key=lambda c: c.chunk_index):
        part, page = "", None
        for s in c.segments:
            sep = "\n\n" if page is not None and s.page_index != page else ""
            part += f"\n\n\x00{s.image_sha256}\x00\n\n" if s.kind == "image" else sep + s.text
            page = s.page_index
        text = _merge(text, part, overlap) if overlap else text + part
    return text


def _merge(text: str, part: str, overlap: int) -> str:
    """``text + part`` with the longest prefix of ``part`` that ``text`` ends with written once (looked for in the
    last characters ``overlap`` tokens can span; an image in the overlap is one marker)."""
    at = text.find(part[:1], max(0, len(text) - min(len(part), 64 * overlap + 1024))) if part else -1
    while at >= 0:
        if part.startswith(text[at:]):
            return text[:at] + part
        at = text.find(part[0], at + 1)
    return text + part


def documents(out: str) -> Iterator[list[ChunkRow]]:
    """Each document's chunks (segments and images only), streamed in shard order: a build writes a document's
    chunks one after another, so one document is held at a time (a document whose chunks are not adjacent comes
    back in pieces, each stitched on its own)."""
    group: list[ChunkRow] = []
    for path in list_shards(out):
        for c in ShardFile(path).iter_chunks(("segments", "images")):
            if group and c.doc_id != group[0].doc_id:
                yield group
                group = []
            group.append(c)
    if group:
        yield group


def captioned_crops(out: str, cfg: FigureTaskConfig = FigureTaskConfig()) -> tuple[list[CaptionedCrop], Counter]:
    """Every captioned figure/table crop of a build output ``out``, and the crops skipped by reason."""
    overlap = 0
    if fs.exists(fs.join(out, MANIFEST_NAME)):
        overlap = int(Manifest.read(out).config.get("overlap") or 0)
    crops, skipped = [], Counter()
    seen: dict[str, set[str]] = {}
    taken: dict[str, set[str]] = {}
    for chunks in documents(out):
        doc_id = chunks[0].doc_id
        images = {i.sha256: i for c in chunks for i in c.images}
        paras = [
            " ".join(p.split()) if not _IMAGE.match(p.strip()) else p.strip()
            for p in _PARAGRAPH.split(stitch(chunks, overlap))
        ]
        paras = [p for p in paras if p]
        doc_seen, doc_taken = seen.setdefault(doc_id, set()), taken.setdefault(doc_id, set())
        for i, p in enumerate(paras):
            m = _IMAGE.match(p)
            if not m or m.group(1) in doc_seen:
                continue
            doc_seen.add(sha := m.group(1))
            kind = images[sha].kind if sha in images else "missing_png"
            if kind in KINDS and kind not in cfg.kinds:
                skipped["kind_not_asked"] += 1
                continue
            if kind == "equation":
                crop, reason = _equation(doc_id, images[sha], doc_taken, cfg)
                if crop is None:
                    skipped[reason] += 1
                else:
                    crops.append(crop)
                continue
            if kind not in LABELS:
                skipped[f"kind_{kind or 'unknown'}"] += 1
                continue
            order = (i - 1, i + 1) if kind == "table" else (i + 1, i - 1)
            near = [paras[j] for j in order if 0 <= j < len(paras) and not _IMAGE.match(paras[j])]
            caption = next((t for t in near if LABELS[kind].match(t)), None)
            if caption is None:
                skipped["no_caption"] += 1
            elif len(caption) > cfg.max_caption_chars:
                skipped["caption_too_long"] += 1
            elif caption in doc_taken:
                skipped["caption_taken"] += 1
            else:
                doc_taken.add(caption)
                crops.append(CaptionedCrop(doc_id, sha, kind, images[sha].png, caption))
    return crops, skipped


def _equation(doc_id: str, image: Any, doc_taken: set[str], cfg: FigureTaskConfig) -> tuple[CaptionedCrop | None, str]:
    """An equation crop with its known text, or (None, why not); a text asked about is added to ``doc_taken``."""
    text = _EQUATION_NUMBER.sub("", " ".join((image.text or "").split()))  # "(3)" would answer by number alone
    if not text:
        return None, "equation_text_unknown"
    if len(text.replace(" ", "")) < cfg.min_equation_chars:
        return None, "equation_text_too_short"
    if len(text) > cfg.max_caption_chars:
        return None, "caption_too_long"
    if text in doc_taken:
        return None, "equation_text_taken"
    doc_taken.add(text)
    return CaptionedCrop(doc_id, image.sha256, "equation", image.png, text, image.text_from), ""


def split_documents(doc_ids: Iterable[str], cfg: FigureTaskConfig) -> tuple[set[str], set[str]]:
    """(train, test) document ids: a seeded shuffle, ``test_fraction`` of them (at least one of two or more) to test."""
    docs = sorted(set(doc_ids))
    random.Random(cfg.seed).shuffle(docs)
    n_test = max(1, round(cfg.test_fraction * len(docs))) if len(docs) >= 2 else 0
    return set(docs[n_test:]), set(docs[:n_test])


def question_row(crop: CaptionedCrop, distractors: Sequence[str], seed: int) -> dict[str, Any]:
    """One multiple-choice row: the crop as a data URL, the captions (or expressions) lettered in a seeded order, the
    letter as answer."""
    options = [crop.caption, *distractors]
    random.Random(f"{seed}:{crop.doc_id}:{crop.sha256}").shuffle(options)
    listed = "\n".join(f"{LETTERS[i]}) {c}" for i, c in enumerate(options))
    ask = "Which expression does this equation show?" if crop.kind == "equation" else f"Which caption belongs to this {crop.kind}?"  # fmt: skip
    question = f"{ask}\n{listed}\nAnswer with the letter only."
    content = [{"type": "image_url", "image_url": {"url": data_url(crop.png)}}, {"type": "text", "text": question}]
    row = {
        "id": f"{crop.doc_id[:16]}-{crop.sha256[:16]}",
        "messages": [{"role": "user", "content": content}],
        "answer": LETTERS[options.index(crop.caption)],
        "kind": crop.kind,
        "doc_id": crop.doc_id,
        "image_sha256": crop.sha256,
    }
    return row | ({"text_from": crop.text_from} if crop.kind == "equation" else {})


def build_rows(
    crops: Sequence[CaptionedCrop], cfg: FigureTaskConfig = FigureTaskConfig()
) -> tuple[dict[str, list[dict[str, Any]]], Counter]:
    """``{"train": rows, "test": rows}`` from captioned crops, and counts (skips, cross-split distractors). An
    equation's distractors are other equations' texts only."""
    if not 2 <= cfg.choices <= len(LETTERS):
        raise ValueError(f"choices must be in 2..{len(LETTERS)}, got {cfg.choices}")
    counts = Counter()
    if len({c.caption for c in crops}) < cfg.choices:
        counts["too_few_captions"] = len(crops)
        return {"train": [], "test": []}, counts
    train, test = split_documents((c.doc_id for c in crops), cfg)
    split_of = {d: "train" for d in train} | {d: "test" for d in test}
    out: dict[str, list[dict[str, Any]]] = {"train": [], "test": []}
    pools = _Pools(crops, split_of)
    for crop in crops:
        split = split_of[crop.doc_id]
        rng = random.Random(f"{cfg.seed}:distractors:{crop.doc_id}:{crop.sha256}")
        picked: list[str] = []
        for key, cross_split in pools.keys(crop, split):
            picked += pools.draw(key, {crop.caption, *picked}, cfg.choices - 1 - len(picked), rng)
            if len(picked) == cfg.choices - 1:
                counts["distractors_from_other_split"] += cross_split
                break
        else:
            counts["too_few_options"] += 1
            continue
        out[split].append(question_row(crop, picked, cfg.seed))
    return out, counts


class _Pools:
    """Distractor pools of a corpus, built once (sorted caption lists and their sets by key), so a row's distractors
    are drawn in O(choices) instead of a scan of every crop."""

    def __init__(self, crops: Sequence[CaptionedCrop], split_of: dict[str, str]) -> None:
        keyed: dict[tuple, set[str]] = {}
        for c in crops:
            for key, _ in self.keys(c, split_of[c.doc_id]):
                keyed.setdefault(key, set()).add(c.caption)
        self.sets = keyed
        self.lists = {k: sorted(v) for k, v in keyed.items()}

    @staticmethod
    def keys(crop: CaptionedCrop, split: str) -> list[tuple[tuple, bool]]:
        """Where a row's distractors come from, nearest first, and whether the pool reaches into the other split.
        A figure or table: same kind and split, then any caption of the split, then the corpus's. An equation: other
        equations only, text read the same way first, from the whole corpus before any other reading (a LaTeX answer
        among text-layer glyphs would stand out)."""
        if crop.kind == "equation":
            return [(("eq", split, crop.text_from), False), (("eq", None, crop.text_from), True),
                    (("eq", split), False), (("eq", None), True)]  # fmt: skip
        return [(("cap", split, crop.kind), False), (("cap", split), False), (("cap", None), True)]

    def draw(self, key: tuple, exclude: set[str], m: int, rng: random.Random) -> list[str]:
        """Up to ``m`` distinct captions of pool ``key`` outside ``exclude``, drawn with ``rng``."""
        pool, members = self.lists[key], self.sets[key]
        if len(pool) - len(exclude & members) <= m:  # a small pool: all it has
            return [x for x in pool if x not in exclude]
        out: list[str] = []
        while len(out) < m:
            x = pool[rng.randrange(len(pool))]
            if x not in exclude and x not in out:
                out.append(x)
        return out


def write_figure_task(shards: str, out: str, cfg: FigureTaskConfig = FigureTaskConfig()) -> dict[str, Any]:
    """``out/train.jsonl``, ``out/test.jsonl`` and ``out/summary.json`` from the build output ``shards``; returns
    the summary (rows and documents per split, crops skipped by reason)."""
    import json

    crops, skipped = captioned_crops(shards, cfg)
    rows, counts = build_rows(crops, cfg)
    fs.makedirs(out)
    for split, split_rows in rows.items():
        fs.write_jsonl(fs.join(out, f"{split}.jsonl"), split_rows)
    summary = {
        "shards": str(shards),
        "rows": {s: len(r) for s, r in rows.items()},
        "documents": {s: len({r["doc_id"] for r in rows[s]}) for s in rows},
        "kinds": dict(Counter(r["kind"] for s in rows.values() for r in s)),
        "crops_captioned": len(crops),
        "skipped": dict(skipped + Counter({k: counts[k] for k in ("too_few_captions", "too_few_options")})),
        "distractors_from_other_split": counts["distractors_from_other_split"],
        "config": {
            "seed": cfg.seed,
            "test_fraction": cfg.test_fraction,
            "choices": cfg.choices,
            "kinds": list(cfg.kinds),
        },
    }
    fs.write_text(fs.join(out, "summary.json"), json.dumps(summary, indent=2))
    return summary
