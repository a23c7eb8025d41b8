"""Time-series lane configs (SPEC C10): small frozen dataclasses; named runs are functions (``RECIPES``).

    from pretrain.timeseries.config import RECIPES
    cfg = RECIPES["debug"](**{"train.steps": 50})      # dotted keys go through formats.overrides

``debug`` is the benchmark model (M1 yearly, Airline): trains in a few minutes on 2 cores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from formats.overrides import with_overrides


@dataclass(frozen=True)
class EncoderConfig:
    """The series encoder: normalise → patch (adaptive L) → local CNN → Q-Former → channel Transformer → body."""

    d_model: int = 32
    """Width of every encoder block."""
    budget: int = 64
    """Most tokens a series becomes (after channel aggregation); a multiple of ``queries``."""
    queries: int = 4
    """Q: Q-Former queries per patch, so patches = budget / Q and L = ceil(Q·T / budget)."""
    cnn_positions: int = 16
    """The local CNN's features are average-pooled to at most this many positions per patch (keeps the Q-Former's
    cost per patch bounded whatever L is)."""
    chunk_points: int = 262_144
    """Temporal chunking: CNN + Q-Former run over whole patches, about this many time steps (× channels × series)
    at a time (at least one patch), so activation memory stays bounded whatever T is."""
    channel_layers: int = 1
    """Layers of the channel-wise Transformer (attends across channels at each token position)."""
    body_layers: int = 2
    """Layers of the body Transformer over the token sequence."""
    heads: int = 4
    """Attention heads everywhere."""
    channel_mixing: str = "transformer"
    """``transformer`` (the design) or ``mean``: average the channels before encoding (the baseline it replaces)."""
    llm_dim: int = 32
    """Width of the LLM's embedding space the tokens are projected into."""
    dropout: float = 0.0
    """Dropout in the Transformers."""

    def __post_init__(self) -> None:
        if self.budget % self.queries:
            raise ValueError(f"budget {self.budget} must be a multiple of queries {self.queries}")
        if self.channel_mixing not in ("transformer", "mean"):
            raise ValueError(f"channel_mixing must be transformer or mean, not {self.channel_mixing!r}")


@dataclass(frozen=True)
class ForecasterConfig:
    """Two Q-Formers → fixed-size condition → causal Transformer → value head (point + quantiles)."""

    d_model: int = 32
    """Width of the forecaster."""
    text_queries: int = 4
    """Queries of the Q-Former over the LLM's hidden states (instruction)."""
    series_queries: int = 8
    """Queries of the Q-Former over the series tokens."""
    layers: int = 2
    """Causal Transformer layers."""
    heads: int = 4
    """Attention heads."""
    out_patch: int = 6
    """Values emitted per decoder step; a horizon H takes ceil(H / out_patch) steps, cut to exactly H."""
    quantiles: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    """Quantile levels of the value head (``q0.1 … q0.9`` columns of ``forecast``)."""
    text_bytes: int = 96
    """Instruction bytes the lane-alone text stand-in embeds (``scifolio pretrain`` passes LLM hidden states)."""


@dataclass(frozen=True)
class TrainConfig:
    """Training on windows cut from the training series."""

    steps: int = 300
    """Optimizer steps in total (a resumed run continues up to this)."""
    batch: int = 64
    """Windows per step."""
    lr: float = 2e-3
    """AdamW learning rate (cosine to 10%)."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    context: int = 64
    """Most past values a training window shows the model."""
    min_context: int = 6
    """Fewest past values a training window shows."""
    horizon: int = 6
    """Future values scored per training window (fewer where a series ends first)."""
    holdout: int = 0
    """Points cut from the end of every series before training (the eval protocol's H: train never sees them)."""
    save_every: int = 250
    """Checkpoint every N steps (and at the end)."""
    log_every: int = 25
    """metrics.jsonl line every N steps."""


@dataclass(frozen=True)
class TimeseriesConfig:
    """One time-series lane run (``scifolio timeseries train``)."""

    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    """Series encoder."""
    forecaster: ForecasterConfig = field(default_factory=ForecasterConfig)
    """Forecaster and horizon handling."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Optimisation."""
    seed: int = 0
    """Seeds init and window sampling."""
    threads: int = 1
    """torch intra-op threads (tiny models on a shared machine want 1)."""


def debug(**overrides: Any) -> TimeseriesConfig:
    """The benchmark model: d=32, 2+2 layers, budget 64 tokens, 300 steps of 64 windows (~2 min on M1 yearly, 2 cores)."""
    return with_overrides(TimeseriesConfig(), overrides)


def small(**overrides: Any) -> TimeseriesConfig:
    """A bigger shape for longer series (budget 1,024 tokens as in SPEC C10's worked example)."""
    cfg = TimeseriesConfig(
        encoder=EncoderConfig(d_model=128, budget=1024, queries=4, body_layers=4, llm_dim=256),
        forecaster=ForecasterConfig(d_model=128, layers=4, out_patch=16, series_queries=32),
        train=TrainConfig(steps=20000, batch=64, lr=5e-4, context=2048, horizon=96),
        threads=0,
    )
    return with_overrides(cfg, overrides)


RECIPES: dict[str, Callable[..., TimeseriesConfig]] = {"debug": debug, "small": small}
