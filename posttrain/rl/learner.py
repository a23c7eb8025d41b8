"""The learner: shaped advantages (Eq 28), the detached-IS loss (Eq 29) with the BKL mask (Eq 12–13).

One ``train(batch)`` is one policy version: advantages come from ``advantages.shape`` over the batch's
groups (LOO → GEPO → LenReg, on the engine's behaviour logprobs); the trainer re-scores every sampled
token once with the current weights θ_V and masks tokens whose trainer/engine probabilities disagree
in binary KL (``policy_loss.bkl_mask_from_logprobs``); then ``n_minibatches`` AdamW steps on
``policy_loss`` with each token weighted against *its own* behaviour logprob (tokens of one response
may come from several versions). Reference-free unless ``kl_beta > 0`` (k3 estimator against the
initial policy). Logprobs use ``rollout.sampling.sampling_logprobs`` — the engine's distribution.

    learner = Learner(model, LearnerConfig(), temperature=1.0); metrics = learner.train(batch)
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import torch
from torch import Tensor

from posttrain import fit
from posttrain.objectives.advantages import ShapingConfig, shape
from posttrain.objectives.policy_loss import BklConfig, ClipConfig, bkl_mask_from_logprobs, policy_loss
from posttrain.rollout.sampling import sampling_logprobs, without_placeholder
from posttrain.rollout.scheduler import Batch
from posttrain.rollout.types import Trajectory


@dataclass(frozen=True)
class LearnerConfig:
    """Optimisation of one policy version."""

    lr: float = 1e-3
    """Peak learning rate (AdamW's; with Muon the update is rescaled per matrix so the same lr carries over)."""
    weight_decay: float = 0.0
    """Decoupled weight decay (AdamW and Muon)."""
    optimizer: Literal["adamw", "muon"] = "adamw"
    """``muon``: ``torch.optim.Muon`` on the hidden 2-D matrices (``adjust_lr_fn="match_rms_adamw"``, Moonlight's
    0.2·√max(A, B) scaling, so the AdamW lr applies), AdamW on embeddings, the head, norms and biases."""
    schedule: Literal["constant", "cosine"] = "constant"
    """Learning-rate schedule over the run's optimizer steps (``steps × n_minibatches``)."""
    min_lr_ratio: float = 0.2
    """cosine: the final lr as a fraction of ``lr`` (S1-MO: 1/5)."""
    warmup_steps: int = 0
    """Linear warm-up (optimizer steps) before the schedule."""
    n_minibatches: int = 8
    """Optimizer steps per pass over the batch (SPEC §C1: n = 8); the batch's trajectories are split evenly."""
    update_epochs: int = 1
    """Passes over the batch per version (each reshuffled into ``n_minibatches``)."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (0 = off)."""
    clip: ClipConfig = field(default_factory=ClipConfig)
    """Bounds of the detached importance weight (Eq 11)."""
    bkl_phi: float = 0.1
    """BKL mask threshold φ (Eq 13); ≤ 0 switches the mask off."""
    kl_beta: float = 0.0
    """KL penalty to the initial policy (k3 estimator); 0 = reference-free (default)."""
    shaping: ShapingConfig = field(default_factory=ShapingConfig)
    """Eq 28 advantage pipeline (LenReg on, GEPO off by default: the report gives no thresholds)."""
    replay_routes: bool = True
    """R3: replay the engine's recorded expert choices in the learner's forward (MoE policies). Off only to
    measure what routing replay prevents."""
    seed: int = 0
    """Seeds the minibatch order (a pure function of seed and version, so resume is exact)."""


@dataclass
class Packed:
    """A list of trajectories as right-padded tensors."""

    input_ids: Tensor  # [N, L] prompt + response, padded with 0
    attention_mask: Tensor  # [N, L]
    positions: Tensor  # [N, T] index of the logit that predicts response token t
    tokens: Tensor  # [N, T] response tokens (0 on padding)
    response_mask: Tensor  # [N, T] bool: real response token with loss_mask 1
    behaviour: Tensor  # [N, T] behaviour logprobs (0 on padding)
    versions: Tensor  # [N, T] int64 (-1 on padding)
    matched: Tensor  # [N, T] the engine's logprob of each token under the learner's weights version (0 if none)
    matched_mask: Tensor  # [N, T] bool: the engine saw this token at the learner's version (``matched`` is real)
    routes: list | None = None
    """Per row ``Trajectory.routed_experts`` (MoE policies, R3) or None: replayed in the learner's forward."""
    pixels: list | None = None
    """Per row its request's ``pixel_values`` (vision-language prompts) or None: the forward sees the engine's images."""

    def select(self, idx: Tensor) -> Packed:
        """The rows ``idx`` (a minibatch)."""
        tensors = [getattr(self, f)[idx] for f in _TENSOR_FIELDS]
        rows = {k: None if getattr(self, k) is None else [getattr(self, k)[i] for i in idx.tolist()] for k in _LISTS}
        return Packed(*tensors, **rows)

    def inputs(self) -> dict[str, Tensor]:
        """The model's inputs: ids, mask and the rows' images in row order (a Llava forward fills its image tokens
        with them in that order)."""
        px = [x for x in self.pixels or () if x is not None]
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask} | (
            {"pixel_values": torch.cat(px)} if px else {}
        )


_LISTS = ("routes", "pixels")
_TENSOR_FIELDS = tuple(f.name for f in fields(Packed) if f.name not in _LISTS)


def pack(trajs: list[Trajectory], version: int | None = None) -> Packed:
    """Right-padded tensors of ``trajs``; ``version``: the learner version they are trained at, whose engine
    logprobs (``Trajectory.engine_logprobs_at``) fill ``matched`` for the matched-weights BKL mask."""
    n = len(trajs)
    ids, att = fit.right_pad([t.prompt_ids + t.token_ids for t in trajs])
    T = max(max(t.n_tokens for t in trajs), 1)
    pos, tok = torch.zeros(n, T, dtype=torch.long), torch.zeros(n, T, dtype=torch.long)
    rmask, mmask = torch.zeros(n, T, dtype=torch.bool), torch.zeros(n, T, dtype=torch.bool)
    beh, matched = torch.zeros(n, T, dtype=torch.float32), torch.zeros(n, T, dtype=torch.float32)
    ver = torch.full((n, T), -1, dtype=torch.long)
    for i, t in enumerate(trajs):
        if version is not None:
            for j, lp in enumerate(t.engine_logprobs_at(version)):
                if lp is not None:
                    matched[i, j], mmask[i, j] = lp, True
        k, p = t.n_tokens, len(t.prompt_ids)
        pos[i, :k] = torch.arange(p - 1, p - 1 + k)
        tok[i, :k] = torch.tensor(t.token_ids)
        rmask[i, :k] = torch.tensor(t.loss_mask, dtype=torch.bool)
        beh[i, :k] = torch.tensor(t.logprobs)
        ver[i, :k] = torch.tensor(t.versions)
    routes = [t.routed_experts for t in trajs] if any(t.routed_experts for t in trajs) else None
    pixels = [t.request.pixel_values for t in trajs]
    return Packed(ids, att, pos, tok, rmask, beh, ver, matched, mmask, routes, pixels)


def padded(rows: list[list[float]], like: Tensor) -> Tensor:
    """Per-row values (each row as long as its trajectory's tokens, or shorter) right-padded with 0 to ``like``."""
    out = torch.zeros_like(like)
    for i, a in enumerate(rows):
        out[i, : min(len(a), out.shape[1])] = torch.tensor(a[: out.shape[1]], dtype=out.dtype)
    return out


def token_logprobs(
    model: torch.nn.Module, p: Packed, temperature: float = 1.0, top_p: float = 1.0, stats: dict[str, int] | None = None
) -> Tensor:
    """log π(y_t) of each response token under ``model`` with the engine's sampling transform: ``[N, T]``.

    When the trajectories carry routed experts (an MoE policy sampled with R3 recording), the forward replays
    the engine's expert choices (``posttrain.objectives.r3``; gate weights still from the live router logits); ``stats``
    then counts ``r3_replayed_tokens`` and ``r3_changed_routes`` (routes the live router would have changed)."""
    if p.routes is not None:
        from posttrain.objectives.r3 import replay_trajectories

        # Right padding: every row's prompt starts at column 0.
        with replay_trajectories(model, p.routes, p.input_ids.shape[1], [0] * p.input_ids.shape[0]) as replay:
            logits = model(**p.inputs(), use_cache=False).logits
        if stats is not None:
            stats["r3_replayed_tokens"] = stats.get("r3_replayed_tokens", 0) + replay.replayed_tokens
            stats["r3_changed_routes"] = stats.get("r3_changed_routes", 0) + replay.changed_routes
    else:
        logits = model(**p.inputs(), use_cache=False).logits
    idx = p.positions.unsqueeze(-1).expand(-1, -1, logits.shape[-1])
    at = without_placeholder(logits.gather(1, idx), model.config)  # [N, T, V]: the logits behind each response token
    return sampling_logprobs(at, temperature, top_p).gather(-1, p.tokens.unsqueeze(-1)).squeeze(-1)


class Learner:
    """Owns the trainable policy and its optimizer; ``version`` counts completed ``train`` calls."""

    def __init__(
        self,
        model: torch.nn.Module,
        config: LearnerConfig = LearnerConfig(),
        temperature: float = 1.0,
        top_p: float = 1.0,
        version: int = 0,
        total_versions: int = 1,
    ) -> None:
        """``total_versions``: the run's learner steps (the cosine schedule's length)."""
        self.model = model
        self.config = config
        self.temperature = temperature
        self.top_p = top_p
        self.version = version
        self.optimizers = make_optimizers(model, config)
        self.total_updates = max(1, total_versions * config.n_minibatches * config.update_epochs)
        self.schedulers = [
            fit.schedule(o, self.total_updates, config.schedule, config.min_lr_ratio, config.warmup_steps)
            for o in self.optimizers
        ]
        self.reference = copy.deepcopy(model).eval().requires_grad_(False) if config.kl_beta > 0 else None

    def weights(self) -> dict[str, Tensor]:
        """The state the engine loads (detached copies, so later steps cannot change it in place)."""
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def logprobs(self, trajs: list[Trajectory]) -> Tensor:
        """Trainer logprobs of the trajectories' tokens, no grad (tests compare these with the engine's)."""
        p = pack(trajs)
        with torch.no_grad():
            return token_logprobs(self.model.eval(), p, self.temperature, self.top_p)

    def train(self, batch: Batch) -> dict[str, float]:
        """Shape, mask and take ``n_minibatches`` optimizer steps; ``version`` += 1. Returns metrics."""
        cfg = self.config
        if batch.version != self.version:
            raise ValueError(f"batch collected for version {batch.version}, learner is at {self.version}")
        groups = batch.groups
        trajs = [t for g in groups for t in g]
        p = pack(trajs, self.version)
        if batch.advantages is not None:  # the stage's own per-token credit
            return self.update(p, padded(batch.advantages, p.behaviour))
        B, G, T = len(groups), max(len(g) for g in groups), p.tokens.shape[1]
        bi, gj = torch.tensor([(b, j) for b, g in enumerate(groups) for j in range(len(g))]).T
        rewards, gmask = torch.zeros(B, G), torch.zeros(B, G, dtype=torch.bool)
        rewards[bi, gj], gmask[bi, gj] = torch.tensor([float(t.reward) for t in trajs]), True
        beh3, tm3 = torch.zeros(B, G, T), torch.zeros(B, G, T, dtype=torch.bool)
        beh3[bi, gj], tm3[bi, gj] = p.behaviour, p.response_mask
        shaped = shape(rewards, beh3, tm3, gmask, cfg.shaping)
        metrics = self.update(p, shaped.advantages[bi, gj])
        metrics["group_entropy"] = float(shaped.entropy.mean())
        return metrics

    def update(self, p: Packed, adv: Tensor | Callable[[Tensor], Tensor]) -> dict[str, float]:
        """The policy update on packed trajectories with per-token advantages ``adv`` ``[N, T]``: BKL mask from
        trainer vs engine logprobs at matched weights, ``update_epochs`` × ``n_minibatches`` optimizer steps of
        Eq 29 (+ KL to the reference when ``kl_beta``); ``version`` += 1. ``train`` calls it after shaping, agentic
        RL with its session credit, OPD with ``adv`` a function of the proximal logprobs (the batch-start policy's,
        computed here): ``adv(lp_prox)`` → ``[N, T]``."""
        cfg = self.config
        n = p.tokens.shape[0]
        if not cfg.replay_routes:
            p.routes = None
        self.model.train()
        r3: dict[str, int] = {}
        with torch.no_grad():
            lp_now = token_logprobs(self.model, p, self.temperature, self.top_p, stats=r3)
            keep = p.response_mask.clone()
            # BKL (Eq 12–13) compares trainer and engine at the SAME weights (SPEC C3): each token against the
            # engine's logprob under this learner version (sampled now, or re-prefilled after the last sync).
            # Tokens the engine never saw at this version are not tested; their drift is the IS weight's job.
            compared = p.response_mask & p.matched_mask
            if cfg.bkl_phi > 0:
                ok = bkl_mask_from_logprobs(lp_now, p.matched, BklConfig(cfg.bkl_phi))
                keep &= ok | ~compared
            ref = None if self.reference is None else token_logprobs(self.reference, p, self.temperature, self.top_p)

        if callable(adv):
            adv = adv(lp_now)
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + self.version)
        k = min(cfg.n_minibatches, n)  # each epoch a fresh order, cut into k minibatches
        chunks = [c for _ in range(cfg.update_epochs) for c in torch.randperm(n, generator=gen).chunk(k) if len(c)]
        clip_fracs, kls = [], []

        def minibatch_loss(model: torch.nn.Module, idx: Tensor) -> Tensor:
            sub = p.select(idx)
            lp = token_logprobs(model, sub, self.temperature, self.top_p)
            loss, st = policy_loss(lp, sub.behaviour, adv[idx], sub.response_mask, keep[idx], cfg.clip)
            clip_fracs.append(float(st.clip_fraction))
            if ref is not None:
                m = keep[idx]
                d = (ref[idx] - lp).masked_fill(~m, 0.0)
                k3 = (d.exp() - 1 - d).masked_fill(~m, 0.0).sum() / m.sum().clamp(min=1)
                loss = loss + cfg.kl_beta * k3
                kls.append(float(k3.detach()))
            return loss

        fit_cfg = fit.FitConfig(grad_clip=cfg.grad_clip)
        losses = fit.fit(self.model, chunks, minibatch_loss, fit_cfg, self.optimizers, schedulers=self.schedulers)
        self.version += 1
        self.last_mask = {"compared": compared, "kept": keep, "response": p.response_mask}
        """The last update's BKL bookkeeping (``[N, T]`` bools), for diagnostics and tests."""
        n_resp = int(p.response_mask.sum())
        gap = (lp_now - p.behaviour).abs()[p.response_mask]
        matched_gap = (lp_now - p.matched).abs()[compared]
        out = {
            "loss": sum(losses) / len(losses),
            "clip_fraction": sum(clip_fracs) / len(clip_fracs),
            "kept_tokens": float(keep.sum()),
            "bkl_masked_fraction": 1.0 - int(keep.sum()) / max(n_resp, 1),
            "bkl_compared_fraction": int(compared.sum()) / max(n_resp, 1),
            # behaviour gap: drift across versions + engine mismatch (what the IS weight corrects)
            "mismatch_abs_mean": float(gap.sum() / max(n_resp, 1)),
            "mismatch_abs_max": float(gap.max()) if gap.numel() else 0.0,
            # the same weights on both sides: engine vs trainer numerics only (what BKL and R3 are about)
            "matched_mismatch_abs_max": float(matched_gap.max()) if matched_gap.numel() else 0.0,
            "kl": sum(kls) / len(kls) if kls else 0.0,
            "lr": self.schedulers[0].get_last_lr()[0],
        }
        if p.routes is not None:
            out |= {k: float(r3.get(k, 0)) for k in ("r3_replayed_tokens", "r3_changed_routes")}
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizers": [o.state_dict() for o in self.optimizers],
            "schedulers": [s.state_dict() for s in self.schedulers],
            "version": self.version,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        for o, st in zip(self.optimizers, state["optimizers"], strict=True):
            o.load_state_dict(st)
        for sch, st in zip(self.schedulers, state["schedulers"], strict=True):
            sch.load_state_dict(st)
        self.version = int(state["version"])


def make_optimizers(model: torch.nn.Module, cfg: LearnerConfig) -> list[torch.optim.Optimizer]:
    """AdamW on everything, or Muon on the hidden matrices + AdamW on the rest (``LearnerConfig.optimizer``).

    Muon orthogonalises 2-D updates, which suits the hidden weight matrices only: embeddings and the output head
    (tied or not) are lookup tables / classifiers, and norms and biases are vectors, so they stay on AdamW."""
    params = [(n, q) for n, q in model.named_parameters() if q.requires_grad]
    if cfg.optimizer == "adamw":
        return [torch.optim.AdamW([q for _, q in params], lr=cfg.lr, weight_decay=cfg.weight_decay)]
    if cfg.optimizer != "muon":
        raise ValueError(f"learner.optimizer={cfg.optimizer!r} (adamw | muon)")
    io = {id(m.weight) for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None}
    hidden = [q for _, q in params if q.ndim == 2 and id(q) not in io]
    rest = [q for _, q in params if not (q.ndim == 2 and id(q) not in io)]
    muon = torch.optim.Muon(hidden, lr=cfg.lr, weight_decay=cfg.weight_decay, adjust_lr_fn="match_rms_adamw")
    return [muon, torch.optim.AdamW(rest, lr=cfg.lr, weight_decay=cfg.weight_decay)]
