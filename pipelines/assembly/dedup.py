"""Near-duplicate documents: MinHash over word shingles of a document's text, LSH bands, one kept document.

    from pipelines.assembly.dedup import DedupConfig, first_pages_text, find_near_duplicates
    texts = [(doc_id, first_pages_text(pdf_bytes, config)) for doc_id, pdf_bytes in docs]
    kept, dropped = find_near_duplicates(texts, DedupConfig())      # dropped: Dropped(..., "near_duplicate")

Beam-free (``pipelines/jobs/dedup.py`` is the Beam transform over the same functions). The same paper as a
preprint and as a publisher's PDF has other bytes, fonts and line breaks but the same words: the text is
normalised to lower-case words (hyphenated line breaks joined), lines that repeat on several pages of the
document (running headers and footers: a journal's template) are removed, and the Jaccard similarity of
the documents' sets of ``shingle_words``-word shingles is estimated by MinHash (``datasketch``). Papers that
only share a template share few shingles and stay apart. Candidates meet in LSH bands and are verified on
the signature; clusters are connected components, and the kept document is the smallest doc_id of its
cluster, so the result does not depend on the order in which documents arrive.

``Decontaminator`` checks a document's text against benchmark texts by word n-gram overlap (13-grams, as
GPT-3's decontamination) and reports every hit.
"""

from __future__ import annotations

import hashlib
import os
import re
import select
import signal
import struct
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from formats.records import Dropped


@dataclass(frozen=True)
class DedupConfig:
    """Near-duplicate detection over the first pages' text layer."""

    threshold: float = 0.75
    """Estimated Jaccard similarity of two documents' shingle sets at or above which they are duplicates."""
    num_perm: int = 128
    """MinHash permutations (signature length): the estimate's standard error is about 1/sqrt(num_perm)."""
    shingle_words: int = 5
    """Words per shingle. Long enough that shared phrasing of a field or a template is rare across papers."""
    first_pages: int = 3
    """Pages whose text layer is read before parsing (the cheap signature; a paper's first pages suffice)."""
    min_words: int = 50
    """Documents with fewer words (scans without a text layer, covers) get no signature and are never merged."""
    seed: int = 1
    """MinHash seed: signatures are comparable only under the same seed and num_perm."""
    text_timeout_s: float = 2.0
    """Reading the first pages' text runs in a killed-on-timeout child process (a hostile PDF can make MuPDF
    spin forever; a normal paper's first pages read in well under 0.1 s); such a document gets no signature here
    and meets the parser's page timeout later, so a hanging file costs this plus one page timeout."""

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.shingle_words < 1 or self.num_perm < 2:
            raise ValueError("need shingle_words >= 1 and num_perm >= 2")

    @property
    def bands(self) -> tuple[int, int]:
        """(bands b, rows per band r) with b·r <= num_perm whose S-curve threshold (1/b)^(1/r) is closest to
        ``threshold`` (ties: more bands, i.e. fewer missed duplicates; verification removes false positives)."""
        best = min(
            ((b, self.num_perm // b) for b in range(1, self.num_perm + 1)),
            key=lambda br: (abs((1 / br[0]) ** (1 / br[1]) - self.threshold), -br[0]),
        )
        return best


# ----------------------------------------------------------------------------------------------- text
_HYPHEN_BREAK = re.compile(r"(\w)-\s*\n\s*(\w)")
_WORD = re.compile(r"[^\W_]+")


def strip_repeated_lines(pages: Sequence[str], min_pages: int = 2) -> list[str]:
    """Remove lines that occur on ``min_pages`` or more pages (running headers/footers, a journal's template).
    Digits are ignored when comparing, so "Page 3" and "Page 4" are one line. A one-page text is returned as is."""
    if len(pages) < min_pages:
        return list(pages)

    def key(line: str) -> str:
        return re.sub(r"\d+", "#", " ".join(line.split()).lower())

    seen = Counter(k for page in pages for k in {key(line) for line in page.splitlines() if line.strip()})
    repeated = {k for k, n in seen.items() if n >= min_pages}
    return ["\n".join(line for line in page.splitlines() if key(line) not in repeated) for page in pages]


def normalize_words(text: str) -> list[str]:
    """Lower-case words of ``text`` (NFKC, ligatures unfolded), hyphenated line breaks joined."""
    text = unicodedata.normalize("NFKC", text)
    text = _HYPHEN_BREAK.sub(r"\1\2", text)
    return _WORD.findall(text.lower())


def shingles(words: Sequence[str], n: int) -> set[bytes]:
    if len(words) < n:
        return {" ".join(words).encode()} if words else set()
    return {" ".join(words[i : i + n]).encode() for i in range(len(words) - n + 1)}


def document_words(pages: Sequence[str]) -> list[str]:
    """The words a document is compared by: its pages' text without repeated lines, normalised."""
    return normalize_words("\n".join(strip_repeated_lines(pages)))


# ----------------------------------------------------------------------------------------- signatures
def signature(pages: Sequence[str], config: DedupConfig) -> bytes | None:
    """The MinHash signature of a document's text (given per page), or None when it has too few words."""
    from datasketch import MinHash

    words = document_words(pages)
    if len(words) < config.min_words:
        return None
    mh = MinHash(num_perm=config.num_perm, seed=config.seed)
    mh.update_batch(sorted(shingles(words, config.shingle_words)))
    return np.asarray(mh.hashvalues, dtype=np.uint64).tobytes()


def similarity(a: bytes, b: bytes) -> float:
    """Estimated Jaccard similarity of two signatures (fraction of equal MinHash values)."""
    x, y = np.frombuffer(a, dtype=np.uint64), np.frombuffer(b, dtype=np.uint64)
    return float(np.mean(x == y))


def band_keys(sig: bytes, config: DedupConfig) -> list[str]:
    """One key per LSH band: two documents that share a key are candidates."""
    b, r = config.bands
    values = np.frombuffer(sig, dtype=np.uint64)
    return [f"{i}:{hashlib.sha1(values[i * r : (i + 1) * r].tobytes()).hexdigest()[:16]}" for i in range(b)]


def bucket_pairs(members: Iterable[tuple[str, bytes]], config: DedupConfig) -> list[tuple[str, str, float]]:
    """Verified duplicate pairs (smaller doc_id first, similarity) among the documents of one LSH bucket."""
    items = sorted(dict(members).items())
    out = []
    for i, (a, sa) in enumerate(items):
        for b, sb in items[i + 1 :]:
            s = similarity(sa, sb)
            if s >= config.threshold:
                out.append((a, b, s))
    return out


def resolve(pairs: Iterable[tuple[str, str, float]]) -> dict[str, tuple[str, float]]:
    """Duplicate pairs → {dropped doc_id: (kept doc_id, similarity to its closest kept-side neighbour)}.

    Clusters are the connected components of the pairs; each keeps its smallest doc_id. Input order does not
    matter (union by smallest id, pairs deduplicated)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    best: dict[str, float] = {}
    for a, b, s in pairs:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
        for d in (a, b):
            best[d] = max(best.get(d, 0.0), s)
    return {d: (find(d), best[d]) for d in sorted(parent) if find(d) != d}


def near_duplicate(doc_id: str, kept: str, sim: float) -> Dropped:
    return Dropped(doc_id, "dedup", "near_duplicate", {"kept": kept, "similarity": round(sim, 4)})


def find_near_duplicates(
    docs: Iterable[tuple[str, Sequence[str] | None]], config: DedupConfig
) -> tuple[list[str], list[Dropped]]:
    """In memory: (doc_id, first pages' text per page, or None) → (kept doc ids sorted, Dropped per duplicate)."""
    sigs = {}
    ids = set()
    for doc_id, pages in docs:
        ids.add(doc_id)
        if pages is not None and (sig := signature(pages, config)) is not None:
            sigs[doc_id] = sig
    buckets: dict[str, list[tuple[str, bytes]]] = {}
    for doc_id, sig in sigs.items():
        for key in band_keys(sig, config):
            buckets.setdefault(key, []).append((doc_id, sig))
    pairs = {(a, b): s for members in buckets.values() if len(members) > 1 for a, b, s in bucket_pairs(members, config)}
    dup = resolve((a, b, s) for (a, b), s in pairs.items())
    return sorted(ids - set(dup)), [near_duplicate(d, k, s) for d, (k, s) in sorted(dup.items())]


# -------------------------------------------------------------------------------- first pages' text
def _pages_text(data: bytes, n_pages: int) -> list[str]:
    import pymupdf

    with pymupdf.open(stream=data, filetype="pdf") as doc:
        if doc.needs_pass and not doc.authenticate(""):
            return []
        return [doc[i].get_text() for i in range(min(n_pages, doc.page_count))]


def first_pages_text(data: bytes, config: DedupConfig) -> list[str] | None:
    """The text layer of the first ``config.first_pages`` pages (one string per page), read with PyMuPDF in a
    forked child that is killed after ``config.text_timeout_s``; None when the file does not open, has no
    pages, or its text cannot be read in time (the parser then deals with it)."""
    import pymupdf  # noqa: F401  (loaded here, before the fork: the child would pay ~0.3 s to import it)

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: read, send, exit without running the parent's atexit handlers or finalisers
        code = 1
        try:
            os.close(r)
            import pickle

            body = pickle.dumps(_pages_text(data, config.first_pages))
            os.write(w, struct.pack("<Q", len(body)))
            view = memoryview(body)
            while view:
                view = view[os.write(w, view) :]
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    import time

    deadline = time.monotonic() + config.text_timeout_s
    buf = bytearray()
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                return None
            chunk = os.read(r, 1 << 20)
            if not chunk:
                break
            buf.extend(chunk)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    if len(buf) < 8 or len(buf) - 8 != struct.unpack("<Q", buf[:8])[0]:
        return None  # the child failed (an unreadable file): no signature
    import pickle

    pages = pickle.loads(bytes(buf[8:]))
    return pages or None


# ----------------------------------------------------------------------------------- decontamination
@dataclass(frozen=True)
class ContaminationHit:
    """A document shares word n-grams with a benchmark text."""

    doc_id: str
    benchmark: str
    """The benchmark text's name."""
    shared_ngrams: int
    """Distinct n-grams of the benchmark text found in the document."""
    fraction: float
    """shared_ngrams / the benchmark text's distinct n-grams."""


class Decontaminator:
    """Word n-gram overlap with a list of benchmark texts (name → text); build once, ``check`` per document."""

    def __init__(self, benchmarks: Mapping[str, str], n: int = 13, min_shared: int = 1) -> None:
        self.n = n
        self.min_shared = min_shared
        self._grams: dict[bytes, set[str]] = {}
        self._sizes: dict[str, int] = {}
        for name, text in benchmarks.items():
            grams = shingles(normalize_words(text), n)
            self._sizes[name] = len(grams)
            for g in grams:
                self._grams.setdefault(g, set()).add(name)

    def check(self, doc_id: str, text: str) -> list[ContaminationHit]:
        """Every benchmark text sharing at least ``min_shared`` n-grams with ``text``, by name."""
        shared: Counter[str] = Counter()
        for g in shingles(normalize_words(text), self.n):
            for name in self._grams.get(g, ()):
                shared[name] += 1
        return [
            ContaminationHit(doc_id, name, k, round(k / self._sizes[name], 4))
            for name, k in sorted(shared.items())
            if k >= self.min_shared
        ]
