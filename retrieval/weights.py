"""Sample weights from quality queries: reranked hits above a score raise the sampling ratio of their images
and of the chunks that contain them; everything else keeps weight 1.0.

Derivation (bounded, monotone, documented here once):
- image weight  w_img(s) = 1 + (w_max − 1) · (s − s_min) / (1 − s_min)   for a quality score s ≥ s_min,
  i.e. 1.0 at the threshold rising linearly to w_max at s = 1; images below s_min or never hit: 1.0.
- chunk weight  w_chunk = max over its images of w_img (1.0 without scored images). Max, not mean: one
  high-quality figure is what makes a chunk worth seeing more often, and a mean would let decorative images
  in the same chunk dilute it. Bounded in [1, w_max]; the loader multiplies it into the sampling ratio.

    scifolio index weights --queries queries.txt --shards out/shards --out weights.parquet --reranker M ...
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

WEIGHTS_SCHEMA_FIELDS = ("level", "id", "weight", "score")


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


def collect_scores(searcher, queries: Iterable[tuple[str, str]], cfg: WeightConfig) -> dict[str, float]:
    """Run every quality query with rerank and return the best score per crop (hits of every query)."""
    lists = []
    for kind, q in queries:
        if kind == "image":
            res = searcher.image(Path(q).read_bytes(), k=cfg.k, rerank=True)
        else:
            res = searcher.text(q, k=cfg.k, rerank=True)
        lists.append([(h.sha256, h.score) for h in res.hits])
    return best_scores(lists)


def iter_chunk_images(shards_dir: str | os.PathLike[str]) -> Iterable[tuple[str, list[str]]]:
    """(chunk_id, image sha256s) for every row of every shard (only the two columns are read)."""
    import pyarrow.parquet as pq

    from retrieval.crops import list_shards

    for path in list_shards(shards_dir):
        pf = pq.ParquetFile(path)
        for batch in pf.iter_batches(batch_size=64, columns=["chunk_id", "segments"]):
            for rec in batch.to_pylist():
                ids = [s["image_sha256"] for s in rec["segments"] or [] if s["kind"] == "image" and s["image_sha256"]]
                yield rec["chunk_id"], ids


def write_weights(
    path: str | os.PathLike[str], scores: Mapping[str, float], img_w: Mapping[str, float], chunk_w: Mapping[str, float]
) -> int:
    """One parquet table: rows ``(level="image"|"chunk", id, weight, score)``; ids not listed weigh 1.0.
    ``score`` is the image's best reranker score (NaN on chunk rows: their weight derives from their images).
    Returns rows written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [("image", sha, w, scores[sha]) for sha, w in sorted(img_w.items())]
    rows += [("chunk", cid, w, float("nan")) for cid, w in sorted(chunk_w.items())]
    table = pa.table(
        {
            "level": pa.array([r[0] for r in rows], pa.string()),
            "id": pa.array([r[1] for r in rows], pa.string()),
            "weight": pa.array([r[2] for r in rows], pa.float32()),
            "score": pa.array([r[3] for r in rows], pa.float32()),
        },
        metadata={"scifolio.default_weight": "1.0"},
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    pq.write_table(table, tmp)
    os.replace(tmp, path)
    return table.num_rows


def read_weights(path: str | os.PathLike[str], level: str = "chunk") -> dict[str, float]:
    """id -> weight for one level; what the pre-training loader reads (missing ids: 1.0)."""
    import pyarrow.parquet as pq

    t = pq.read_table(path).to_pylist()
    return {r["id"]: float(r["weight"]) for r in t if r["level"] == level}
