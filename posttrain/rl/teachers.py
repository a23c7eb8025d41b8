"""Teachers for on-policy distillation: a local Hugging Face causal LM as a load()/run_batch() scorer that returns only
the sampled tokens' logprobs (SPEC §C8: O(H) numbers per response cross the wire, never logits).

    scorer = TeacherScorer(TeacherConfig(path="runs/expert-reasoning/policy")); model = scorer.load()
    lp = scorer.run_batch(input_ids, attention_mask, model)       # [B, L]; position 0 is 0
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from posttrain.objectives.distill import sampled_logprobs


@dataclass(frozen=True)
class TeacherConfig:
    """A teacher served in-process from a local Hugging Face causal-LM directory."""

    path: str
    """Local model directory (``save_pretrained`` output); nothing is downloaded."""
    device: str = "cpu"
    """torch device to run on."""
    dtype: str = "float32"
    """torch dtype name for the weights."""


class TeacherScorer:
    """load()/run_batch() teacher: sampled-token logprobs of response tokens, O(H) per response."""

    def __init__(self, config: TeacherConfig) -> None:
        self.config = config

    def load(self) -> Any:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            self.config.path, dtype=getattr(torch, self.config.dtype), local_files_only=True
        )
        return model.to(self.config.device).eval()

    @torch.no_grad()
    def run_batch(self, input_ids: Tensor, attention_mask: Tensor, model: Any) -> Tensor:
        """``[B, L]`` prompt+response ids → ``[B, L]`` log π_T(x_t | x_<t); position 0 (no prefix) is 0.

        Callers slice the response positions; only these numbers, never logits, leave the teacher.
        """
        dev = self.config.device
        logits = model(input_ids=input_ids.to(dev), attention_mask=attention_mask.to(dev)).logits
        lp = sampled_logprobs(logits[:, :-1], input_ids[:, 1:].to(dev))
        return torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1).cpu()
