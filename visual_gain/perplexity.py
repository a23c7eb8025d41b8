"""Pure visual-gain math (SPEC §A2): per-token NLLs of the same text tokens in two passes → ΔH.

    PPL_text  = exp(mean NLL of x, text only)
    PPL_inter = exp(mean NLL of the same x, visuals interleaved)
    ΔH        = ln PPL_text − ln PPL_inter            (nats / token)
    bits      = ΔH / ln 2;  page bits = bits × |x|

Works on sums so long pages scored in windows aggregate exactly (mean over all tokens, not a mean of
window means). No torch here: the scorer reduces tensors to floats first.

    python -m pytest tests/visual_gain/test_perplexity.py -q
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

LN2 = math.log(2.0)


def ppl_from_nll(nll_sum: float, n_tokens: int) -> float:
    """Perplexity of ``n_tokens`` tokens whose NLLs (nats) sum to ``nll_sum``."""
    if n_tokens <= 0:
        raise ValueError("perplexity of zero tokens is undefined")
    return math.exp(nll_sum / n_tokens)


def delta_h_nats(ppl_text: float, ppl_inter: float) -> float:
    """ΔH = ln PPL_text − ln PPL_inter, nats per token (positive when the visuals help)."""
    return math.log(ppl_text) - math.log(ppl_inter)


def nats_to_bits(nats: float) -> float:
    return nats / LN2


def page_bits(delta_h_bits: float, n_tokens: int) -> float:
    """Information the visuals add to the whole page, in bits."""
    return delta_h_bits * n_tokens


@dataclass(frozen=True)
class VisualGain:
    """The visual-gain numbers of one page (stored on the page as ``formats.scores.VisualGainScore``)."""

    ppl_text: float
    ppl_inter: float
    delta_h_nats: float
    delta_h_bits: float
    page_bits: float
    n_text_tokens: int
    n_images: int

    @classmethod
    def from_ppl(cls, ppl_text: float, ppl_inter: float, n_text_tokens: int, n_images: int) -> VisualGain:
        dh = delta_h_nats(ppl_text, ppl_inter)
        bits = nats_to_bits(dh)
        return cls(ppl_text, ppl_inter, dh, bits, page_bits(bits, n_text_tokens), n_text_tokens, n_images)

    @classmethod
    def from_sums(cls, nll_sum_text: float, nll_sum_inter: float, n_text_tokens: int, n_images: int) -> VisualGain:
        """From NLL sums over the *same* ``n_text_tokens`` tokens in the two passes."""
        return cls.from_ppl(
            ppl_from_nll(nll_sum_text, n_text_tokens),
            ppl_from_nll(nll_sum_inter, n_text_tokens),
            n_text_tokens,
            n_images,
        )

    @classmethod
    def from_nlls(cls, nll_text: Sequence[float], nll_inter: Sequence[float], n_images: int) -> VisualGain:
        if len(nll_text) != len(nll_inter):
            raise ValueError(f"the two passes scored different token counts: {len(nll_text)} vs {len(nll_inter)}")
        return cls.from_sums(math.fsum(nll_text), math.fsum(nll_inter), len(nll_text), n_images)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
