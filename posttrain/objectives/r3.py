"""R3, routing replay for Mixture-of-Experts policies (SPEC C3).

The rollout engine and the learner run the same weights through different kernels (and, with partial
rollout, a few versions apart), so a token whose router scores nearly tie can be sent to different experts
on the two sides: the learner's logprob is then that of another network. R3 records the engine's expert
choices per token and layer and makes the learner's forward use them, while the gate weights are still
computed from the learner's LIVE router logits (softmax gathered at the replayed ids, renormalised exactly
as the model does), so the router keeps receiving a gradient. This is xtuner's
``module/router/greedy.py`` behaviour, done here with forward hooks on the transformers router modules:
no model code is forked.

Supported routers are the transformers 5 ``*TopKRouter`` modules whose forward is
``logits = h W^T; p = softmax(logits); (v, i) = topk(p, k); v /= sum(v) if norm_topk_prob`` and returns
``(logits, weights, indices)`` (Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE, ...). Attaching checks this formula
against the router's own output once, so a router that computes weights differently fails loudly instead of
being replayed wrongly.

Layout of routed experts: an int tensor ``[tokens, layers, top_k]``; row p holds the experts chosen when the
token at position p of the sequence was fed through the model. ``-1`` means "not recorded: route live"
(padding, or the last sampled token, which the engine never feeds back).

    PYTHONPATH=. python -m pytest tests/posttrain/test_r3.py -q
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager

import torch
from torch import nn

UNRECORDED = -1


def find_routers(model: nn.Module) -> list[nn.Module]:
    """The model's top-k router modules in layer order (module registration order)."""
    routers = [
        m
        for m in model.modules()
        if type(m).__name__.endswith("TopKRouter")
        and isinstance(getattr(m, "top_k", None), int)
        and isinstance(getattr(m, "weight", None), torch.Tensor)
    ]
    if not routers:
        raise ValueError(f"{type(model).__name__} has no *TopKRouter module: R3 needs a Mixture-of-Experts model")
    return routers


def _renormalises(router: nn.Module) -> bool:
    # Mixtral's router always renormalises and has no flag; Qwen2/3-MoE and OLMoe carry norm_topk_prob.
    return bool(getattr(router, "norm_topk_prob", True))


def replay_gate_weights(router_logits: torch.Tensor, expert_ids: torch.Tensor, renormalise: bool) -> torch.Tensor:
    """Gate weights for given expert ids from live router logits, as the router computes them for its own choice.

    ``router_logits`` [N, E] (with grad), ``expert_ids`` [N, k] (int64, all valid) → [N, k] in the logits' dtype.
    """
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float)
    weights = probs.gather(-1, expert_ids)
    if renormalise:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype)


def check_router_formula(router: nn.Module, hidden_size: int | None = None) -> None:
    """Raise if ``replay_gate_weights`` does not reproduce the router's own weights for its own choices."""
    weight = router.weight
    hidden = hidden_size or weight.shape[-1]
    gen = torch.Generator(device="cpu").manual_seed(0)
    probe = torch.randn(8, hidden, generator=gen).to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        out = router(probe)
        if not (isinstance(out, tuple) and len(out) == 3):
            raise TypeError(f"{type(router).__name__} does not return (logits, weights, indices)")
        logits, weights, ids = out
        mine = replay_gate_weights(logits, ids.long(), _renormalises(router))
    if not torch.allclose(mine.float(), weights.float(), atol=1e-6, rtol=1e-5):
        raise ValueError(f"{type(router).__name__} computes gate weights differently from R3's replay formula")


class _RouterHooks(AbstractContextManager):
    """A forward hook (``self._hook(layer)``) on each of ``self.routers`` while the context is entered."""

    routers: list[nn.Module]
    _handles: list

    def __enter__(self) -> _RouterHooks:
        self._handles += [router.register_forward_hook(self._hook(layer)) for layer, router in enumerate(self.routers)]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


class RoutingRecorder(_RouterHooks):
    """Engine side: capture each forward's top-k expert ids per router layer.

    ``pop()`` returns the ids of every forward since the last pop as ``[tokens, layers, top_k]`` (int16 on CPU),
    tokens in the order the router saw them (``hidden.reshape(-1, H)``: batch-major, then position), so a
    batched decode step of B requests gives B rows and a [B, T] prefill gives B*T rows.
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype = torch.int16):
        self.routers = find_routers(model)
        self.dtype = dtype
        self._calls: list[list[torch.Tensor]] = [[] for _ in self.routers]
        self._handles: list = []
        self.active = True
        """Hooks record only while this is true (the engine hook toggles it around each forward)."""

    def _hook(self, layer: int):
        def hook(_module, _inputs, output):
            if self.active:
                self._calls[layer].append(output[2].detach().to("cpu", self.dtype))

        return hook

    def clear(self) -> None:
        for calls in self._calls:
            calls.clear()

    def pop(self) -> torch.Tensor:
        """Ids recorded since the last pop, ``[tokens, layers, top_k]``; empty if nothing ran."""
        counts = {len(calls) for calls in self._calls}
        if len(counts) != 1:
            raise RuntimeError(f"router layers saw different numbers of forwards: {sorted(counts)}")
        if counts == {0}:
            return torch.empty(0, len(self.routers), self.routers[0].top_k, dtype=self.dtype)
        per_layer = [torch.cat(calls, dim=0) for calls in self._calls]
        self.clear()
        return torch.stack(per_layer, dim=1)


class EngineRoutingRecorder:
    """The rollout engines' R3 hook (``posttrain.rollout.engine.ExpertsRecorder``): ``engine.experts_recorder = it``.

    Hooks stay installed for the recorder's life but record only between ``begin()`` and ``end()``; ``end()``
    returns the routes of that one forward as ``[batch, seq, layers, top_k]`` aligned with its ``input_ids``.
    ``close()`` removes the hooks.
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype = torch.int16):
        self._recorder = RoutingRecorder(model, dtype)
        self._recorder.active = False
        self._recorder.__enter__()
        self._shape: tuple[int, int] | None = None
        # The MoE block (the router's parent) sees hidden states [batch, seq, H] before flattening them.
        block = _parent_of(model, self._recorder.routers[0])
        self._shape_hook = block.register_forward_pre_hook(self._capture_shape)

    def _capture_shape(self, _module, args):
        if self._recorder.active and self._shape is None:
            self._shape = tuple(args[0].shape[:2])

    def begin(self) -> None:
        self._recorder.clear()
        self._shape = None
        self._recorder.active = True

    def end(self) -> torch.Tensor:
        self._recorder.active = False
        routes = self._recorder.pop()
        if self._shape is None:
            raise RuntimeError("no MoE forward ran between begin() and end()")
        b, t = self._shape
        if routes.shape[0] != b * t:
            raise RuntimeError(f"recorded {routes.shape[0]} tokens' routes for a [{b}, {t}] forward")
        return routes.reshape(b, t, routes.shape[1], routes.shape[2])

    def close(self) -> None:
        self._recorder.__exit__(None, None, None)
        self._shape_hook.remove()


def _parent_of(model: nn.Module, child: nn.Module) -> nn.Module:
    for module in model.modules():
        if any(c is child for c in module.children()):
            return module
    raise ValueError("router has no parent module")


class RoutingReplay(_RouterHooks):
    """Learner side: make each router use recorded expert ids, gate weights from its live logits.

    ``experts``: ``[B, T, layers, top_k]`` or ``[B*T, layers, top_k]`` matching the forward's tokens; entries
    ``-1`` (a whole row of them) route live. Every forward inside the context (a gradient-checkpointing
    recompute included) must have that many tokens.
    """

    def __init__(self, model: nn.Module, experts: torch.Tensor, check: bool = True):
        self.routers = find_routers(model)
        if experts.dim() == 4:
            experts = experts.reshape(-1, experts.shape[-2], experts.shape[-1])
        if experts.dim() != 3 or experts.shape[1] != len(self.routers):
            raise ValueError(f"experts must be [tokens, {len(self.routers)} layers, top_k], got {tuple(experts.shape)}")
        if experts.shape[2] != self.routers[0].top_k:
            raise ValueError(f"experts has top_k={experts.shape[2]}, the model routes {self.routers[0].top_k}")
        if check:
            for router in self.routers:
                check_router_formula(router)
        self.experts = experts.long()
        self._handles: list = []
        self.replayed_tokens = 0
        self.changed_routes = 0  # (token, layer) pairs where the live top-k set differs from the replayed one

    def _hook(self, layer: int):
        renormalise = _renormalises(self.routers[layer])

        def hook(_module, _inputs, output):
            logits, _weights, live_ids = output
            ids = self.experts[:, layer, :].to(live_ids.device)
            if ids.shape[0] != live_ids.shape[0]:
                raise ValueError(f"replaying {ids.shape[0]} tokens' routes on a forward of {live_ids.shape[0]}")
            recorded = (ids >= 0).all(dim=-1, keepdim=True)
            ids = torch.where(recorded, ids, live_ids.long())
            with torch.no_grad():
                self.changed_routes += int(
                    (ids.sort(dim=-1).values != live_ids.long().sort(dim=-1).values).any(dim=-1).sum()
                )
                if layer == 0:
                    self.replayed_tokens += int(recorded.sum())
            return logits, replay_gate_weights(logits, ids, renormalise), ids.to(live_ids.dtype)

        return hook


def batch_routes(
    routes: Sequence[torch.Tensor | None], seq_len: int, offsets: Sequence[int], layers: int, top_k: int
) -> torch.Tensor:
    """Place per-sequence routes ``[n_i, layers, top_k]`` into a padded batch ``[B, seq_len, layers, top_k]``.

    Row i's routes start at column ``offsets[i]`` (its left padding); everything else is ``-1`` (route live).
    A ``None`` entry routes that whole row live.
    """
    out = torch.full((len(routes), seq_len, layers, top_k), UNRECORDED, dtype=torch.long)
    for i, (r, off) in enumerate(zip(routes, offsets, strict=True)):
        if r is None:
            continue
        n = min(r.shape[0], seq_len - off)
        out[i, off : off + n] = torch.as_tensor(r[:n]).long()
    return out


def replay_trajectories(
    model: nn.Module, routed: Sequence[Sequence | torch.Tensor | None], seq_len: int, offsets: Sequence[int]
) -> RoutingReplay:
    """Replay context for a learner batch ``[B, seq_len]`` built from ``Trajectory.routed_experts`` lists.

    ``routed[i]`` covers positions from the start of row i's prompt (which sits at column ``offsets[i]``, its
    left padding); rows or positions without routes route live.
    """
    routers = find_routers(model)
    layers, top_k = len(routers), routers[0].top_k
    tensors = [None if r is None or len(r) == 0 else torch.as_tensor(r, dtype=torch.long) for r in routed]
    return RoutingReplay(model, batch_routes(tensors, seq_len, offsets, layers, top_k))
