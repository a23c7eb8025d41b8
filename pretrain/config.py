"""Pre-training configs: small frozen dataclasses, named runs are functions (torchtitan's config registry).

    from pretrain.config import RECIPES
    cfg = RECIPES["debug"](shards="out", models="tiny")

The DeepSpeed JSON is generated from ``TrainConfig`` by :func:`deepspeed_config`, so there is one source of truth
for batch size, accumulation, clipping, ZeRO stage and precision.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from formats.overrides import with_overrides
from formats.rundir import deepspeed_json
from pretrain.timeseries.config import EncoderConfig, ForecasterConfig


@dataclass(frozen=True)
class ModelConfig:
    """Which pretrained pieces to load and the shape of the trainable additions."""

    backbone: str
    """Hugging Face name or local path of the causal LM Φ (trainable)."""
    encoder: str
    """Hugging Face name or local path of the vision tower E_v (frozen: eval mode, no grad, not optimised)."""
    head_hidden: int = 0
    """Hidden width of the light head ψ (2-layer MLP); 0 means the backbone's hidden size."""
    feature_cache: str | None = None
    """Directory caching E_v features by (image sha256, size); None keeps an in-memory cache only. Unused under
    ZeRO-3 and multi-rank ZeRO-1/2, where every rank runs E_v on every micro-batch (``pretrain/model.py``)."""
    memory_cache_items: int = 4096
    """How many encoded images the in-memory cache keeps (E_v is frozen, so cached features are exact)."""


@dataclass(frozen=True)
class DataConfig:
    """Where samples come from and how they are packed."""

    shards: str
    """Build output directory (``scifolio build --out``, local or fsspec URL): ``manifest.json`` + ``shards/``."""
    weights: str | None = None
    """Sample-weights table (``formats/weights.py``); draw weight w = own × listed: a chunk is seen ⌊w⌋ (+1 with
    probability frac(w)) times per epoch."""
    seq_len: int = 256
    """Tokens per packed row; samples are concatenated and cut, attention never crosses a sample."""
    micro_batch: int = 2
    """Packed rows per micro-batch per rank."""
    pages_per_batch: int = 4
    """Page renders per micro-batch for the next-patch objective."""
    page_size: tuple[int, int] = (96, 72)
    """(height, width) in pixels a page render is resized to before E_v; multiples of the patch size."""
    crop_size: int = 64
    """Side in pixels a cropped figure/table/equation is resized to before E_v."""
    patch: int = 8
    """E_v's patch size in pixels (checked against the encoder's config at load)."""
    blank_std: float = 0.02
    """A patch whose grey-level std (pixels in [0, 1]) is at most this is blank and masked out (Eq 5)."""
    max_image_tokens: int = 64
    """Context slots an image occupies here: min(segment n_tokens, this); must be ≤ seq_len."""
    seed: int = 0
    """Seeds the per-epoch shuffles and weight sampling; identical on every rank."""
    num_workers: int = 0
    """DataLoader worker processes per rank (0 = read in the training process)."""
    series: str = "auto"
    """The time-series lane: ``auto`` = on when the shards hold series rows (``scifolio build`` of series files),
    else never built (no cost); ``off`` = series rows are skipped."""
    max_series_tokens: int = 32
    """Context slots a series occupies in a packed row: min(segment n_tokens, this); must be ≤ seq_len."""
    series_context: int = 256
    """Most points before the held-out tail the series encoder sees (the latest ones)."""
    series_horizon: int = 12
    """Points held out at the end of every series: the forecasting target (fewer for a series of < 2·this points:
    its last half)."""


@dataclass(frozen=True)
class ObjectiveConfig:
    """Eq 9 weights and the InfoNCE temperature."""

    lambda_text: float = 1.0
    """Weight of the next-token loss L_text."""
    lambda_vis: float = 1.0
    """Weight of the contrastive next-patch loss L_VP."""
    tau: float = 0.07
    """InfoNCE temperature τ in s_tj = cos(û, u) / τ."""
    gather: bool = True
    """Use every rank's targets as negatives (all-gather); off = per-rank InfoNCE."""
    lambda_ts: float = 1.0
    """Weight of the time-series forecasting loss L_TS (point L1 + pinball on the held-out tails) when the lane is on."""


@dataclass(frozen=True)
class SeriesLaneConfig:
    """The time-series encoder + forecaster trained beside the text model (SPEC C10); ``llm_dim`` is set to the
    backbone's hidden size when the model is built."""

    encoder: EncoderConfig = field(default_factory=lambda: EncoderConfig(budget=32))
    """Series encoder (its tokens are projected into the LLM's embedding space)."""
    forecaster: ForecasterConfig = field(default_factory=ForecasterConfig)
    """Forecaster: Q-Former over the LLM's hidden states at the series' positions + Q-Former over the series tokens."""


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with linear warmup then cosine decay to ``min_lr_ratio`` × lr."""

    lr: float = 3e-4
    """Peak learning rate."""
    weight_decay: float = 0.1
    """Decoupled weight decay (AdamW)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """Adam moments."""
    warmup_steps: int = 10
    """Optimizer steps of linear warmup from 0."""
    decay_steps: int = 1000
    """Optimizer steps from the end of warmup to the cosine floor."""
    min_lr_ratio: float = 0.1
    """Floor of the cosine as a fraction of lr."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (DeepSpeed ``gradient_clipping``); 0 disables."""
    ds_cpu_adam: bool = False
    """Use DeepSpeed's fused CPU Adam (JIT-compiled on first use) instead of torch.optim.AdamW."""


@dataclass(frozen=True)
class TrainConfig:
    """One run: model, data, objective, optimizer and the engine settings."""

    model: ModelConfig
    """What to load."""
    data: DataConfig
    """What to read."""
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    """Loss weights."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and schedule."""
    series: SeriesLaneConfig = field(default_factory=SeriesLaneConfig)
    """The time-series lane's shape (built only when ``data.series`` finds series rows)."""
    out_dir: str = "out/pretrain"
    """Checkpoints (``ckpt/``), metrics (``metrics.jsonl``) and TensorBoard events (``tb/``)."""
    max_steps: int = 50
    """Optimizer steps to run in total (a resumed run continues up to this)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step."""
    zero_stage: int = 2
    """ZeRO stage 0–3."""
    precision: str = "fp32"
    """"fp32" or "bf16"."""
    save_every: int = 0
    """Checkpoint every N optimizer steps (and always at the end); 0 = only at the end."""
    log_every: int = 1
    """Print/write metrics every N optimizer steps."""
    tensorboard: bool = True
    """Write TensorBoard scalars beside the JSONL."""
    log_spans: bool = False
    """Log which (chunk_id, start, end) token spans each step consumed: proof of no repeat/skip on resume."""
    seed: int = 0
    """Seeds the trainable additions' init and torch RNG."""


def deepspeed_config(cfg: TrainConfig, world_size: int, load_universal: bool = False) -> dict[str, Any]:
    """The DeepSpeed JSON for ``cfg`` (the optimizer and scheduler are client objects, built in train.py).

    ``load_universal``: the checkpoint to resume is DeepSpeed's universal form (saved at another world size)."""
    return deepspeed_json(
        cfg.data.micro_batch, cfg.grad_accum, world_size, cfg.optim.grad_clip, cfg.precision, cfg.zero_stage,
        load_universal,
    )  # fmt: skip


def debug(shards: str = "out", models: str = "tiny", **overrides: Any) -> TrainConfig:
    """2 layers, d=64 (the models ``scifolio models tiny`` writes): what tests and smoke runs use."""
    models_dir = Path(models)
    cfg = TrainConfig(
        model=ModelConfig(backbone=str(models_dir / "pretrain-lm"), encoder=str(models_dir / "pretrain-vision")),
        data=DataConfig(shards=shards, seq_len=128, micro_batch=2, pages_per_batch=4),
        optim=OptimConfig(lr=2e-3, warmup_steps=5, decay_steps=200, weight_decay=0.0),
        max_steps=50,
    )
    return with_overrides(cfg, overrides)


def small(shards: str = "out", models: str = "tiny", **overrides: Any) -> TrainConfig:
    """A laptop-sized real run: pass real model names/paths through ``backbone=``/``encoder=`` overrides."""
    cfg = debug(shards, models)
    cfg = TrainConfig(
        model=cfg.model,
        data=DataConfig(
            shards=shards,
            seq_len=2048,
            micro_batch=4,
            pages_per_batch=8,
            page_size=(448, 336),
            crop_size=224,
            patch=14,
            max_image_tokens=256,
        ),
        optim=OptimConfig(lr=1e-4, warmup_steps=200, decay_steps=20000),
        max_steps=20000,
        grad_accum=8,
        precision="bf16",
        save_every=1000,
    )
    return with_overrides(cfg, overrides)


RECIPES: dict[str, Callable[..., TrainConfig]] = {"debug": debug, "small": small}
