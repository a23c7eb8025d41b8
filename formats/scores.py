"""Typed stage scores stored on a page (``Page.scores``) and in shard page provenance.

The visual-gain stage writes one :class:`VisualGainScore` per page under ``Page.scores["visual_gain"]``; the
threshold decision adds ``threshold``, ``domain`` and ``kept``. Every reader (review export, thresholds, report,
manifest summary) goes through this class instead of dict keys.

    from formats.scores import VisualGainScore
    vg = VisualGainScore.of(page)        # None when the page was not scored
    print(vg.delta_h_nats, vg.kept)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

VISUAL_GAIN = "visual_gain"


@dataclass(frozen=True)
class VisualGainScore:
    """SPEC §A2 numbers of one page, plus the threshold decision once made."""

    delta_h_nats: float
    """ΔH = ln PPL_text − ln PPL_interleaved, nats per text token (0 when the page has no text)."""
    delta_h_bits: float | None = None
    """ΔH / ln 2 (derived from ``delta_h_nats`` when not given)."""
    page_bits: float | None = None
    """ΔH in bits × text tokens (derived when not given)."""
    n_text_tokens: int = 0
    n_images: int = 0
    ppl_text: float | None = None
    ppl_inter: float | None = None
    n_windows: int = 0
    model: str | None = None
    threshold: float | None = None
    domain: str | None = None
    kept: bool | None = None

    def __post_init__(self) -> None:
        if self.delta_h_bits is None:
            object.__setattr__(self, "delta_h_bits", self.delta_h_nats / math.log(2))
        if self.page_bits is None:
            object.__setattr__(self, "page_bits", self.delta_h_bits * self.n_text_tokens)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> VisualGainScore:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def of(cls, page: Any) -> VisualGainScore | None:
        """The score stored on a page (``Page`` or ``PageInfo``: anything with ``scores``), or None."""
        d = (page.scores or {}).get(VISUAL_GAIN)
        return None if d is None else cls.from_dict(d)

    def decided(self, threshold: float, domain: str, kept: bool) -> VisualGainScore:
        return replace(self, threshold=threshold, domain=domain, kept=kept)

    def on(self, page: Any) -> Any:
        """A copy of ``page`` (a frozen dataclass with ``scores``) carrying this score."""
        return replace(page, scores={**page.scores, VISUAL_GAIN: self.to_dict()})
