"""Sample weights from quality queries: hits above a score raise the sampling ratio of their images and of the
chunks that contain them; everything else keeps weight 1.0.

The score of a hit is the reranker's over the fused candidates when a reranker is given, else the fused score
itself: the RRF sum over the channels that ran (``retrieval.channels``: dense text, BM25, CLIP; for image
queries the image vector and the caption's channels) divided by its maximum (first in every channel), so 1.0
means every channel ranked the crop first. A single channel's score is its similarity, clipped to [0, 1].

Derivation (bounded, monotone, documented here once):
- image weight  w_img(s) = 1 + (w_max − 1) · (s − s_min) / (1 − s_min)   for a quality score s ≥ s_min,
  i.e. 1.0 at the threshold rising linearly to w_max at s = 1; images below s_min or never hit: 1.0.
- chunk weight  w_chunk = max over its images of w_img (1.0 without scored images). Max, not mean: one
  high-quality figure is what makes a chunk worth seeing more often, and a mean would let decorative images
  in the same chunk dilute it. Bounded in [1, w_max]; the pre-training loader multiplies it into the row's own
  sample_weight (the one definition of a weight is in formats/weights.py).

    scifolio index weights --queries queries.txt --shards out --out weights.parquet --reranker M ...
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from formats.shards import ShardFile, list_shards
from formats.weights import SampleWeights


@dataclass(frozen=True)
class WeightConfig:
    min_score: float = 0.5
    """Reranker score at or above which a hit counts as high quality (weight starts rising from 1.0)."""
    max_weight: float = 3.0
    """Weight of a crop scored 1.0; caps every image and chunk weight."""
    k: int = 50
    """Hits reranked per quality query."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_score < 1.0:
            raise ValueError("min_score must be in [0, 1)")
        if self.max_weight < 1.0:
            raise ValueError("max_weight must be >= 1 (weights only ever raise a sample's ratio)")


def image_weight(score: float, cfg: WeightConfig) -> float:
    """Weight of one crop from its best quality score (see module docstring)."""
    if score < cfg.min_score:
        return 1.0
    frac = (min(score, 1.0) - cfg.min_score) / (1.0 - cfg.min_score)
    return 1.0 + (cfg.max_weight - 1.0) * frac


def best_scores(hit_lists: Iterable[Iterable[tuple[str, float]]]) -> dict[str, float]:
    """Best (max) score per sha256 over every query's reranked (sha256, score) hits."""
    best: dict[str, float] = {}
    for hits in hit_lists:
        for sha, s in hits:
            if s > best.get(sha, float("-inf")):
                best[sha] = float(s)
    return best


def image_weights(scores: Mapping[str, float], cfg: WeightConfig) -> dict[str, float]:
    """Weights of images scored at or above ``min_score`` (the rest default to 1.0 and are not listed)."""
    return {sha: image_weight(s, cfg) for sha, s in scores.items() if s >= cfg.min_score}


def chunk_weight(image_ids: Iterable[str], img_w: Mapping[str, float]) -> float:
    return max((img_w.get(i, 1.0) for i in image_ids), default=1.0)


def chunk_weights(chunk_images: Iterable[tuple[str, list[str]]], img_w: Mapping[str, float]) -> dict[str, float]:
    """Weights of chunks that contain at least one weighted image; (chunk_id, [image sha256]) pairs in."""
    out: dict[str, float] = {}
    for chunk_id, ids in chunk_images:
        w = chunk_weight(ids, img_w)
        if w > 1.0:
            out[chunk_id] = w
    return out


def parse_query_line(line: str) -> tuple[str, str] | None:
    """("text", query) or ("image", path) for a line of a queries file; blank lines and # comments: None.
    ``image:PATH`` forces an image query; a bare line that names an existing image file is one too."""
    line = line.strip()
    if not line or line.startswith("#"):
        return None
    if line.startswith("image:"):
        return "image", line[len("image:") :].strip()
    if line.lower().endswith((".png", ".jpg", ".jpeg", ".webp", ".bmp")) and Path(line).is_file():
        return "image", line
    return "text", line


def quality_scores(res) -> list[tuple[str, float]]:
    """(sha256, score in [0, 1]) of a search result: reranker scores as they are, fused RRF scores divided by
    their maximum, a single channel's similarity clipped (see module docstring)."""
    from retrieval.channels import rrf_max

    if res.reranked:
        return [(h.sha256, h.score) for h in res.hits]
    if len(res.channels) > 1:
        top = rrf_max(len(res.channels))
        return [(h.sha256, h.score / top) for h in res.hits]
    return [(h.sha256, min(1.0, max(0.0, h.score))) for h in res.hits]


def collect_scores(
    searcher, queries: Iterable[tuple[str, str]], cfg: WeightConfig, channels_seen: set | None = None
) -> dict[str, float]:
    """Run every quality query (reranked when the searcher has a reranker, else scored by fusion) and return the
    best score per crop over every query's hits. ``channels_seen`` collects the channels that produced them."""
    rerank = searcher.reranker is not None
    lists = []
    for kind, q in queries:
        if kind == "image":
            res = searcher.image(Path(q).read_bytes(), k=cfg.k, rerank=rerank)
        else:
            res = searcher.text(q, k=cfg.k, rerank=rerank)
        if channels_seen is not None:
            channels_seen.update(res.channels)
        lists.append(quality_scores(res))
    return best_scores(lists)


def iter_chunk_images(out: str | os.PathLike[str]) -> Iterable[tuple[str, list[str]]]:
    """(chunk_id, image sha256s) for every chunk of a build output directory (segments only are read)."""
    for path in list_shards(out):
        for chunk in ShardFile(path).iter_chunks(parts=("segments",), batch_size=64):
            yield chunk.chunk_id, chunk.image_ids()


def write_weights(
    path: str | os.PathLike[str], scores: Mapping[str, float], img_w: Mapping[str, float], chunk_w: Mapping[str, float]
) -> int:
    """The sample-weights table (``formats/weights.py``): chunk rows are applied by pre-training, image rows with
    their best reranker score are provenance. Returns rows written."""
    return SampleWeights(chunks=dict(chunk_w), images=dict(img_w), scores={k: scores[k] for k in img_w}).write(path)
