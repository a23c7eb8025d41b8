"""A step-driven rollout engine on Hugging Face ``transformers`` (the CPU engine; SPEC §C1).

Each request keeps its own KV cache (per layer ``[1, H_kv, L, D]``). A step left-pads the running
requests' caches into one batch, feeds every request its last token in one forward (attention mask
hides the padding, ``position_ids`` are each request's true positions), samples one token per request
with that position's own seeded generator, and cuts each row's cache back out. New and resumed
requests are prefilled first (prompt + kept tokens, one forward each) and get their next token from
the prefill's last logits. Pausing drops the KV and hands the trajectories back; resuming re-prefills
under whatever weights are loaded then, so KV is never reused across versions.

    from posttrain.rollout.engines.hf import HFEngine
    engine = HFEngine(model, capacity=64); engine.submit(requests); out = engine.step()
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from posttrain.fit import right_pad
from posttrain.rollout.engine import ExpertsRecorder, QueuedEngine, StepOutput
from posttrain.rollout.sampling import draw, sampling_logprobs, token_logprobs_of, token_uniform, without_placeholder
from posttrain.rollout.types import Request, Trajectory

KV = list[tuple[Tensor, Tensor]]


def cache_of(config: Any, kv: KV | None) -> Any:
    """A ``DynamicCache`` for ``config`` holding the per-layer caches ``kv`` (None or ``[]``: empty) without copying
    them: ``DynamicCache(ddp_cache_data=kv)`` would ``cat`` every layer onto an empty tensor."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=config)
    for layer, (k, v) in zip(cache.layers, kv or ()):
        if type(layer) is DynamicLayer:  # adopt the tensors (the model's own update cats onto them, a new tensor)
            layer.lazy_initialization(k, v)
            layer.keys, layer.values = k, v
        else:
            layer.update(k, v)
    return cache


def forward_kv(
    model: Any,
    ids: Tensor,
    mask: Tensor | None,
    pos: Tensor | None,
    kv: KV | None,
    rec: Any = None,
    keep: int = 0,
    pixel_values: Tensor | None = None,
) -> tuple[Tensor, KV, Tensor | None]:
    """One forward of ``model`` over per-layer caches ``kv`` (None or ``[]``: none yet), inside the R3 recorder
    ``rec`` when given: (logits, the new per-layer caches, the routes ``rec.end()`` returned or None). ``keep`` > 0:
    the logits of the last ``keep`` positions only (a prefill then skips the LM head on the rest of the prompt).
    ``pixel_values``: the images of the fed rows' image tokens, in row order (a vision-language prefill)."""
    cache = cache_of(model.config, kv)
    if rec is not None:
        rec.begin()
    extra = {"logits_to_keep": keep} if keep else {}
    if pixel_values is not None:
        extra["pixel_values"] = pixel_values
    o = model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True, **extra)
    experts = rec.end() if rec is not None else None
    logits = without_placeholder(o.logits[:, -keep:] if keep else o.logits, model.config)
    return logits, [(layer.keys, layer.values) for layer in o.cache.layers], experts


def left_pad(kvs: list[KV], new: int) -> tuple[KV, Tensor | None, list[int]]:
    """Per-request caches (per layer ``(keys, values)`` ``[1, H, L_i, D]``, ``[]`` when L_i = 0) → one batch left-padded
    with zeros to the longest, its attention mask over the cache and ``new`` fed positions (None for a single row),
    and the L_i. Row i's fed positions are ``L_i …``; its cache is cut back out from ``max L − L_i``."""
    lens = [kv[0][0].shape[2] if kv else 0 for kv in kvs]
    lmax = max(lens)
    if len(kvs) == 1:
        return kvs[0], None, lens
    mask = (torch.arange(lmax + new) >= lmax - torch.tensor(lens)[:, None]).long()
    out = []
    for layer, pair in enumerate(next((kv for kv in kvs if kv), [])):
        bufs = [t.new_zeros(len(kvs), t.shape[1], lmax, t.shape[3]) for t in pair]
        for i, (kv, n) in enumerate(zip(kvs, lens)):
            for buf, t in zip(bufs, kv[layer] if n else ()):
                buf[i, :, lmax - n :] = t[0]
        out.append((bufs[0], bufs[1]))
    return out, mask, lens


@dataclass(eq=False)
class _Running:
    traj: Trajectory
    kv: list[tuple[Tensor, Tensor]] | None = None
    """Per layer (keys, values) ``[1, H, L, D]`` covering every fed position; None = needs prefill."""
    batch: _Batch | None = None
    """The padded decode batch ``kv`` is a view of (reused while the bucket's rows stay the same)."""


@dataclass(eq=False)
class _Batch:
    """A decode bucket's left-padded cache after its forward: the next step feeds it as is (mask one column longer)
    while the same rows, in the same order, still hold exactly these views, instead of padding them again."""

    kv: KV
    mask: Tensor | None
    lens: list[int]
    rows: list[tuple[_Running, KV]]

    def fits(self, rows: list[_Running]) -> bool:
        return len(rows) == len(self.rows) and all(a is b and a.kv is v for a, (b, v) in zip(rows, self.rows))


class HFEngine(QueuedEngine):
    """``RolloutEngine`` over a causal LM (any ``AutoModelForCausalLM`` that takes a ``DynamicCache``)."""

    def __init__(self, model: torch.nn.Module, capacity: int = 64, version: int = 0) -> None:
        super().__init__(capacity, version)
        self.model = model.eval()
        self.experts_recorder: ExpertsRecorder | None = None
        """R3 hook (see ``ExpertsRecorder``); required by requests with ``return_routed_experts``."""
        self.steps = 0
        """Decode steps taken (the benchmark's clock)."""
        self.pad_waste = 1.5
        """Length bucketing of a decode step: padded KV ≤ pad_waste × real KV + pad_slack per bucket."""
        self.pad_slack = 512

    # -- protocol methods -----------------------------------------------------------------------------
    def submit(self, requests: Sequence[Request]) -> None:
        for r in requests:
            rec = [] if r.params.return_routed_experts else None
            self._queue.append(Trajectory(request=r, routed_experts=rec))

    @torch.no_grad()
    def step(self) -> StepOutput:
        out = StepOutput()
        self._admit(_Running)
        if not self._running:
            return out
        fresh = [r for r in self._running if r.kv is None]
        warm = [r for r in self._running if r.kv is not None]
        rows: list[tuple[_Running, Tensor]] = []
        # Prefill new and resumed requests (every fed position), batched by similar length with left padding.
        for bucket in self._buckets(fresh, lambda r: len(r.traj.prompt_ids) + r.traj.n_tokens):
            rows += self._prefill(bucket)
            out.n_prefilled_tokens += sum(len(r.traj.prompt_ids) + r.traj.n_tokens for r in bucket)
        for bucket in self._buckets(warm):
            rows += self._decode(bucket)
        self._sample(rows)
        self.steps += 1
        out.n_decoded = len(self._running)
        out.new_tokens = {r.traj.request_id: r.traj.token_ids[-1:] for r in self._running}
        self._retire(out)
        return out

    # -- internals ------------------------------------------------------------------------------------
    def _forward(self, ids: Tensor, mask: Tensor | None, pos: Tensor | None, kv: KV | None, **kw: Any):  # noqa: ANN202
        """``forward_kv`` of the engine's model in its R3 recorder (``kw``: ``keep``, ``pixel_values``)."""
        return forward_kv(self.model, ids, mask, pos, kv, self.experts_recorder, **kw)

    def _buckets(self, warm: list[_Running], length=None) -> list[list[_Running]]:  # noqa: ANN001
        """Split the decode batch by KV length so one long request does not pad every row to its length:
        rows sorted by length, a new bucket whenever padding would exceed ``pad_waste`` × the real KV
        (plus ``pad_slack`` positions). Long-tailed lengths otherwise make the padded attention/KV copy
        cost grow with the longest request, not the mean."""
        buckets: list[list[_Running]] = []
        cur: list[_Running] = []
        total = 0
        length = length or (lambda r: r.kv[0][0].shape[2])
        for r in sorted(warm, key=length):
            n = length(r)
            if cur and (len(cur) + 1) * n > self.pad_waste * (total + n) + self.pad_slack:
                buckets.append(cur)
                cur, total = [], 0
            cur.append(r)
            total += n
        if cur:
            buckets.append(cur)
        return buckets

    def _prefill(self, fresh: list[_Running]) -> list[tuple[_Running, Tensor]]:
        seqs = [r.traj.prompt_ids + r.traj.token_ids for r in fresh]
        # left-padded rows: the reversed rows right-padded, flipped back
        ids, mask = (t.flip(-1) for t in right_pad([q[::-1] for q in seqs]))
        lmax = ids.shape[1]
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        one = len(seqs) == 1  # no padding: the plain unmasked forward
        keep = max(r.traj.n_tokens for r in fresh) + 1  # the last prompt position and every kept token's
        px = [r.traj.request.pixel_values for r in fresh if r.traj.request.pixel_values is not None]
        px = torch.cat(px) if px else None  # the images of a vision-language prompt, at prefill only
        logits, kv, experts = self._forward(
            ids, None if one else mask, None if one else pos, None, keep=keep, pixel_values=px
        )
        rows = []
        for i, (r, q) in enumerate(zip(fresh, seqs)):
            off = lmax - len(q)
            r.kv = [(k[i : i + 1, :, off:], v[i : i + 1, :, off:]) for k, v in kv]
            self._record(r.traj, experts[i : i + 1] if experts is not None else None, 0, len(q), offset=off)
            t = r.traj
            if t.n_tokens:  # resumed: the kept tokens' logprobs under the weights loaded now (matched-weights BKL)
                p0, pr = keep - t.n_tokens - 1, t.request.params  # p0: the last prompt position in the kept logits
                lps = token_logprobs_of(logits[i, p0 : p0 + t.n_tokens], t.token_ids, pr.temperature, pr.top_p)
                t.rescore(lps, self._version)
            rows.append((r, logits[i, -1]))
        return rows

    def _decode(self, warm: list[_Running]) -> list[tuple[_Running, Tensor]]:
        b = warm[0].batch
        kv, mask, lens = (b.kv, b.mask, b.lens) if b is not None and b.fits(warm) else left_pad([r.kv for r in warm], 1)
        lmax = max(lens)
        ids = torch.tensor([[r.traj.token_ids[-1]] for r in warm])
        pos = torch.tensor([[n] for n in lens])
        logits, new, experts = self._forward(ids, mask, pos, kv)
        rows = []
        for i, (r, n) in enumerate(zip(warm, lens)):
            r.kv = [(k[i : i + 1, :, lmax - n :], v[i : i + 1, :, lmax - n :]) for k, v in new]
            self._record(r.traj, experts[i : i + 1] if experts is not None else None, n, n + 1)
            rows.append((r, logits[i, -1]))
        nxt = None if mask is None else torch.cat([mask, mask.new_ones(len(warm), 1)], 1)
        batch = _Batch(new, nxt, [n + 1 for n in lens], [(r, r.kv) for r in warm])
        for r in warm:
            r.batch = batch
        return rows

    def _record(self, traj: Trajectory, experts: Tensor | None, start: int, stop: int, offset: int = 0) -> None:
        """Record the routes of fed positions [start, stop) (``offset`` = left padding); a re-prefill after a resume
        replaces known positions' routes (see ``ExpertsRecorder``)."""
        if traj.routed_experts is None:
            return
        if experts is None:
            raise RuntimeError(f"{traj.request_id} asks for routed experts but the engine has no experts_recorder")
        traj.routed_experts[start:stop] = experts[0, offset : offset + stop - start].tolist()

    def _sample(self, rows: list[tuple[_Running, Tensor]]) -> None:
        # One sampling transform per (temperature, top_p) among the rows, one inverse-CDF draw for all of them.
        by_params: dict[tuple[float, float], list[int]] = {}
        for i, (r, _) in enumerate(rows):
            p = r.traj.request.params
            by_params.setdefault((p.temperature, p.top_p), []).append(i)
        logits = torch.stack([lg for _, lg in rows])
        for (temperature, top_p), idx in by_params.items():
            logp = sampling_logprobs(logits[idx], temperature, top_p)
            trajs = [rows[i][0].traj for i in idx]
            u = torch.tensor(
                [token_uniform(t.request.params.seed, t.attempt, t.n_tokens) for t in trajs], dtype=torch.float64
            )
            toks = draw(logp, u)
            chosen = logp.gather(-1, toks.unsqueeze(-1)).squeeze(-1)
            for t, tok, lp in zip(trajs, toks.tolist(), chosen.tolist()):
                self._append(t, tok, lp)
