"""One supervised fitting loop: ``fit(model, batches, loss_fn, FitConfig)`` (masked cross-entropy by default).

Used by the RL learner's minibatch steps (``rl/learner.py``), the lemma agent's behavioural cloning (``lemma/train.py``,
the cold start), on-policy distillation's SFT warm-up and toy teachers (``rl/distill.py``), the Memory Decoder's base,
memory and router (``memdec/train.py``), the online draft (``rl/draft.py``) and SFT (``sft.py``, on a DeepSpeed
engine); ``progress_bar`` is their loops' bar.

    python -c "from posttrain.fit import FitConfig, fit; from posttrain.tiny.lm import causal_lm; import torch; \
m = causal_lm(16, 32); x = torch.randint(0, 16, (4, 8)); \
print(fit(m, [{'input_ids': x, 'attention_mask': torch.ones_like(x), 'loss_mask': torch.ones_like(x)}] * 3))"
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor


@dataclass(frozen=True)
class FitConfig:
    """The optimizer of a fit (when the caller does not pass its own)."""

    lr: float = 1e-3
    optimizer: Literal["adamw", "adam"] = "adamw"
    """``adamw`` (torch defaults: weight decay 0.01) or ``adam``."""
    grad_clip: float = 0.0
    """Global gradient-norm clip (0 = off)."""


def lr_factor(step: int, total: int, kind: str = "constant", min_ratio: float = 0.0, warmup: int = 0) -> float:
    """The one learning-rate schedule: the multiplier of the peak rate after ``step`` optimizer steps of ``total``:
    linear warm-up over ``warmup`` steps, then ``constant``, ``cosine`` or ``linear`` decay to ``min_ratio``."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if kind == "constant":
        return 1.0
    span = max(1, total - warmup)
    progress = min(step - warmup, span) / span
    if kind == "linear":
        return 1.0 - (1.0 - min_ratio) * progress
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def schedule(
    optimizer: torch.optim.Optimizer, total: int, kind: str = "constant", min_ratio: float = 0.0, warmup: int = 0
) -> torch.optim.lr_scheduler.LambdaLR:
    """``optimizer``'s learning rate on ``lr_factor`` (stepped once per optimizer step)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total, kind, min_ratio, warmup))


def right_pad(rows: Sequence[Sequence[int]], pad: int = 0) -> tuple[Tensor, Tensor]:
    """Ragged rows of ids → ``[N, longest]`` int64 ids right-padded with ``pad``, and their 0/1 attention mask."""
    ids = torch.full((len(rows), max(len(r) for r in rows)), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


def progress_bar(total: int | None, enabled: bool = True, **kw: Any) -> Any:
    """The progress bar of post-training's loops (tqdm on stderr; ``enabled`` False: a bar that draws nothing)."""
    from tqdm import tqdm

    return tqdm(total=total, disable=not enabled, file=sys.stderr, dynamic_ncols=True, **kw)


def masked_ce(model: torch.nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """Mean next-token cross-entropy over the positions ``batch["loss_mask"]`` marks (rows weighted by
    ``batch["weight"]`` when given)."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
    lp = torch.log_softmax(logits[:, :-1].float(), -1)
    nll = -lp.gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    m = batch["loss_mask"][:, 1:].float()
    if "weight" in batch:
        m = m * batch["weight"][:, None]
    return (nll * m).sum() / m.sum().clamp(min=1)


def fit(
    model: torch.nn.Module,
    batches: Iterable[Any],
    loss_fn: Callable[[torch.nn.Module, Any], Tensor] = masked_ce,
    cfg: FitConfig = FitConfig(),
    optimizers: list[torch.optim.Optimizer] | None = None,
    stop: Callable[[list[float]], bool] | None = None,
    schedulers: Iterable[Any] = (),
    on_step: Callable[[Any, float], None] | None = None,
) -> list[float]:
    """One optimizer step per batch of ``loss_fn(model, batch)`` with ``cfg``'s optimizer, or ``optimizers`` (e.g. an
    RL learner's, or restored from a checkpoint: their state carries on) and their ``schedulers`` (stepped after
    each); ``on_step(batch, loss)`` after each step (logs, checkpoints); ``stop(losses)`` ends the fit early.
    ``model`` may be a DeepSpeed engine: its own backward and step (accumulation, clipping, ZeRO, its schedule).
    Returns the losses; the model is left in eval mode."""
    deepspeed = callable(getattr(model, "backward", None))
    if optimizers is None and not deepspeed:
        make = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
        optimizers = [make(model.parameters(), lr=cfg.lr)]
    model.train()
    losses: list[float] = []
    for batch in batches:
        loss = loss_fn(model, batch)
        if deepspeed:
            model.backward(loss)
            model.step()
        else:
            for o in optimizers or ():
                o.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            for o in optimizers or ():
                o.step()
            for s in schedulers:
                s.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(batch, losses[-1])
        if stop is not None and stop(losses):
            break
    model.eval()
    return losses
