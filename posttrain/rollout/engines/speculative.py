"""Speculative decoding in the rollout engine: a draft proposes K tokens, the policy verifies them in one forward.

Each ``step`` runs one verification round per running request (SPEC §C4, Eq 21–24): the draft samples
K tokens autoregressively from q (K cheap forwards), the policy scores the last kept token plus the K
drafts in ONE forward (K+1 distributions p), and ``speculative.verify`` accepts draft j with probability
min(1, p_j/q_j), resamples the first rejected position from norm(max(0, p − q)) and, when all K pass,
draws a bonus token from p_K. Every emitted token is distributed exactly as the policy's sampling
distribution (temperature/top-p applied to both models), so this is lossless; the recorded logprob of
each token is the policy's (target's), its version the policy's ``version``.

KV of both models covers every *fed* position (prompt + generated tokens except the last). After a
round both caches are cropped back to the accepted prefix (the rejected drafts' positions are dropped);
a draft that had all K tokens accepted is one position short and catches up at the next round by feeding
two tokens. ``pause`` drops both caches (tokens, logprobs and versions are kept); ``resume`` re-prefills
both models under the weights loaded then; ``update_weights`` swaps the policy, ``update_draft`` the draft
(versioned separately as ``draft_version``).

Randomness: a round's draws come from a generator seeded by (seed, attempt, n_tokens at the round's
start), so a run is reproducible and a pause between rounds does not change the draws.

Batching: requests with the same K this round and draft lag share the forwards (caches left-padded as the HF engine's,
a mask, true ``position_ids``); per-request generators make a request's tokens independent of its batch.

    from posttrain.rollout.engines.speculative import SpeculativeEngine
    engine = SpeculativeEngine(policy, draft, k=4); engine.submit(requests); out = engine.step()

Run the tests: ``python -m pytest tests/posttrain/rollout/test_speculative_engine.py -q``
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from posttrain.objectives import speculative
from posttrain.rollout.engine import QueuedEngine, StepOutput
from posttrain.rollout.engines.hf import KV, forward_kv, left_pad
from posttrain.rollout.sampling import draw, sampling_logprobs, token_logprobs_of
from posttrain.rollout.types import Request, Trajectory


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding and online draft training (SPEC §C4)."""

    enabled: bool = False
    """Roll out with a draft model proposing tokens the policy verifies."""
    k: int = 4
    """Draft tokens proposed per verification round."""
    eta: float = 3.0
    """λ_k = exp(−η·ᾱ_k): mix of KL (unaligned draft) and TV (aligned) in the draft's loss."""
    decay: float = 0.9
    """EMA decay of the running per-position acceptance ᾱ_k."""
    draft_lr: float = 3e-3
    """Adam learning rate of the online draft update."""
    draft_steps: int = 4
    """Optimizer steps on the draft per RL iteration (on the states just collected)."""
    draft_scale: float = 0.5
    """Debug drafts (no ``draft_path``): hidden size and layers of the draft relative to the tiny policy's."""
    draft_path: str | None = None
    """Hugging Face checkpoint of the draft (same tokenizer as the policy); None builds a tiny one."""
    feature_draft: bool = False
    """Draft with a ``FeatureDraft`` of the policy (EAGLE-style: the policy's features + one block) instead of a
    separate LM; works with any policy, no ``draft_path``."""


@dataclass
class _Req:
    traj: Trajectory
    kv_p: KV | None = None
    """Policy KV covering the fed positions (prompt + tokens[:-1]); None = needs prefill."""
    kv_d: KV | None = None
    """Draft KV; may lag the policy's by one position (all drafts accepted last round). A draft that reads features
    keeps only positions it read true features for: it lags by the drafts accepted last round."""
    feat: Tensor | None = None
    """Policy features ``[1, 1 + lag, d]`` the feature-reading draft has not read yet (of the positions before the
    tokens it reads next)."""


def _kv_len(kv: KV | None) -> int:
    return 0 if not kv else kv[0][0].shape[2]


def _row(kv: KV, i: int, start: int, n: int) -> KV:
    return [(k[i : i + 1, :, start : start + n], v[i : i + 1, :, start : start + n]) for k, v in kv]


def _round_seed(t: Trajectory) -> int:
    """A round's seed: (seed, attempt, n_tokens at the round's start)."""
    return (t.request.params.seed * 0x9E3779B97F4A7C15 + t.attempt * 1_000_003 + t.n_tokens * 97_531 + 17) % (2**63 - 1)


class SpeculativeEngine(QueuedEngine):
    """``RolloutEngine`` whose steps are speculative verification rounds (policy + draft causal LMs)."""

    def __init__(
        self,
        model: torch.nn.Module,
        draft: torch.nn.Module,
        k: int = 4,
        capacity: int = 64,
        version: int = 0,
        draft_version: int = 0,
        verifier=speculative.verify,  # noqa: ANN001 - tests swap in a biased verifier (negative control)
    ) -> None:
        if k < 1:
            raise ValueError("k must be ≥ 1")
        super().__init__(capacity, version)
        self.model = model.eval()
        self.draft = draft.eval()
        self.k = k
        self.draft_version = draft_version
        self.verifier = verifier
        self.reads_features = getattr(draft, "reads_features", False)
        """An EAGLE-style draft (``FeatureDraft``): each policy forward of this engine leaves the policy's features
        (its final norm's output) in ``_feat`` for the draft."""
        self._feat: Tensor | None = None
        self._experts: Tensor | None = None
        self.experts_recorder = None
        """R3 hook on the policy (``ExpertsRecorder``): the routes of every policy forward, recorded per trajectory
        for the positions it keeps (prefill, and per round the last kept token + the accepted drafts)."""
        self.steps = 0
        """Verification rounds run (batched)."""
        self.policy_forwards = 0
        """Policy forward passes (prefills + verification forwards)."""
        self.rounds = 0
        """Per-request verification rounds."""
        self.proposed = 0
        """Draft tokens proposed over all rounds."""
        self.reached = 0
        """Draft tokens that were tested (up to and including the first rejection of each round)."""
        self.accepted = 0
        """Draft tokens accepted over all rounds."""
        self.emitted = 0
        """Tokens emitted by verification rounds (accepted + residual/bonus)."""
        self.round_log: list[Tensor] = []
        """``n_accepted`` of each batched round with a full K (fed to an ``AcceptanceTracker``); emptied by
        ``take_round_log``."""
        self.round_groups: list[tuple[tuple[int, int], tuple[str, ...]]] = []
        """Per ``round_log`` entry: the group's key (draft lag, K) and its request ids in order, so engines split over
        workers can merge their entries into the groups one engine would have batched (``posttrain.ray_actors``)."""

    # -- protocol --------------------------------------------------------------------------------------------
    def submit(self, requests: Sequence[Request]) -> None:
        for r in requests:
            if r.params.return_routed_experts and self.experts_recorder is None:
                raise ValueError(f"{r.request_id} asks for routed experts (R3) but the engine has no experts_recorder")
            self._queue.append(Trajectory(request=r, routed_experts=[] if r.params.return_routed_experts else None))

    def take_round_log(self) -> list[Tensor]:
        """The verification outcomes logged since the last call (what ``DraftTrainer.observe`` folds in)."""
        log, self.round_log, self.round_groups = self.round_log, [], []
        return log

    def update_draft(self, state: Mapping[str, Any], version: int) -> None:
        """Load new draft weights (synced like the policy's, between pause and resume)."""
        self._load_weights(self.draft, state)
        self.draft_version = int(version)

    @property
    def acceptance(self) -> float:
        """Per-position acceptance a so far: accepted / tested draft tokens (drafts after a round's first
        rejection are never tested). With i.i.d. acceptance a round emits (1 − a^{K+1})/(1 − a) tokens."""
        return self.accepted / max(1, self.reached)

    @torch.no_grad()
    def step(self) -> StepOutput:
        out = StepOutput()
        self._admit(_Req)
        if not self._running:
            return out
        fresh = [r for r in self._running if r.kv_p is None]
        out.n_prefilled_tokens += sum(len(r.traj.prompt_ids) + r.traj.n_tokens for r in fresh)
        self._prefill(fresh)
        groups: dict[tuple[int, int], list[_Req]] = {}
        for r in self._running:
            groups.setdefault((_kv_len(r.kv_p) - _kv_len(r.kv_d), min(self.k, r.traj.remaining - 1)), []).append(r)
        before = [r.traj.n_tokens for r in self._running]
        for (lag, kk), rs in groups.items():
            self._round(rs, kk, lag)
        self.steps += 1
        out.n_decoded = len(self._running)
        out.new_tokens = {r.traj.request_id: r.traj.token_ids[n:] for r, n in zip(self._running, before)}
        self._retire(out)
        return out

    # -- internals -------------------------------------------------------------------------------------------
    def _forward(self, model: torch.nn.Module, ids: Tensor, kv: KV | None, mask=None, pos=None) -> tuple[Tensor, KV]:  # noqa: ANN001
        rec = self.experts_recorder if model is self.model else None
        # hooked for this forward only: the policy may be shared (the learner, a plain engine, other engines)
        hook = None
        if model is self.model and self.reads_features:
            hook = model.base_model.norm.register_forward_hook(lambda _m, _i, out: setattr(self, "_feat", out))
        try:
            logits, kv, self._experts = forward_kv(model, ids, mask, pos, kv, rec)
        finally:
            if hook is not None:
                hook.remove()
        if model is self.model:
            self.policy_forwards += 1
        return logits, kv

    def _record(self, traj: Trajectory, row: int, start: int, count: int) -> None:
        """Routes of the last policy forward's ``row`` for its first ``count`` fed positions, which are positions
        ``start…`` of the trajectory; a re-prefill after a resume replaces known rows (see ``ExpertsRecorder``)."""
        if traj.routed_experts is None:
            return
        routes = self._experts[row, :count].tolist()
        del traj.routed_experts[start:]
        traj.routed_experts.extend(routes)

    def _prefill(self, fresh: list[_Req]) -> None:
        """Feed prompt + tokens except the last (that one is fed by the next round) to both models."""
        by_len: dict[int, list[_Req]] = {}
        for r in fresh:
            by_len.setdefault(len(r.traj.prompt_ids) + r.traj.n_tokens, []).append(r)
        for n, rs in by_len.items():
            if n <= 1:
                for r in rs:
                    r.kv_p, r.kv_d, r.feat = [], [], torch.zeros(1, 1, self.model.config.hidden_size)
                continue
            ids = torch.tensor([(r.traj.prompt_ids + r.traj.token_ids)[:-1] for r in rs])
            logits, kv_p = self._forward(self.model, ids, None)
            for i, r in enumerate(rs):
                self._record(r.traj, i, 0, n - 1)
            if self.reads_features:  # position j reads the feature of j − 1 (none before the first)
                feats = self._feat
                _, _, kv_d = self.draft.step(ids, torch.cat([torch.zeros_like(feats[:, :1]), feats[:, :-1]], 1), None)
            else:
                _, kv_d = self._forward(self.draft, ids, None)
            for i, r in enumerate(rs):
                t = r.traj
                if t.n_tokens:  # resumed: kept tokens' logprobs under the weights loaded now (matched-weights BKL)
                    p0, pr = len(t.prompt_ids) - 1, t.request.params
                    rows = logits[i, p0 : p0 + t.n_tokens]
                    t.rescore(token_logprobs_of(rows, t.token_ids, pr.temperature, pr.top_p), self._version)
                r.kv_p = [(k[i : i + 1], v[i : i + 1]) for k, v in kv_p]
                r.kv_d = [(k[i : i + 1], v[i : i + 1]) for k, v in kv_d]
                if self.reads_features:
                    r.feat = feats[i : i + 1, -1:]

    def _round(self, rs: list[_Req], kk: int, lag: int) -> None:
        b = len(rs)
        seqs = [r.traj.prompt_ids + r.traj.token_ids for r in rs]
        gens = [torch.Generator().manual_seed(_round_seed(r.traj)) for r in rs]

        def uniforms() -> Tensor:  # one per request, from its own generator
            return torch.cat([torch.rand(1, generator=g) for g in gens])

        # Draft: catch up on the 1 + lag kept tokens it has not seen, then propose kk tokens one at a time.
        kv_d, mask, lens_d = left_pad([r.kv_d for r in rs], 1 + lag)
        feed = torch.tensor([s[len(s) - 1 - lag :] for s in seqs])
        pos = torch.tensor(lens_d)[:, None] + torch.arange(1 + lag)
        drafts = torch.zeros(b, kk, dtype=torch.long)
        qs, feat = [], torch.cat([r.feat for r in rs]) if self.reads_features else None
        for j in range(kk):
            if feat is None:
                logits, kv_d = self._forward(self.draft, feed, kv_d, mask, pos)
            else:  # true features for the catch-up positions, then the draft's own
                logits, f_hat, kv_d = self.draft.step(feed, feat, kv_d, mask, pos)
                feat = f_hat[:, -1:]
            logq = self._logp(rs, logits[:, -1])
            drafts[:, j] = draw(logq, uniforms())  # inverse CDF: exact, ~10× cheaper than multinomial on 49k tokens
            qs.append(logq.softmax(dim=-1))  # = exp(logq), fast (see sampling.draw)
            feed, pos = drafts[:, j : j + 1], pos[:, -1:] + 1
            mask = None if mask is None else torch.cat([mask, mask.new_ones(b, 1)], dim=1)
        # Policy: last kept token + kk drafts in one forward → kk+1 distributions.
        kv_p, mask, lens_p = left_pad([r.kv_p for r in rs], kk + 1)
        ids = torch.cat([torch.tensor([[s[-1]] for s in seqs]), drafts], dim=1)
        logits, kv_p = self._forward(self.model, ids, kv_p, mask, torch.tensor(lens_p)[:, None] + torch.arange(kk + 1))
        logp, feats = self._logp(rs, logits), self._feat
        if kk == 0:  # one token left: plain sampling from the policy
            zero = torch.zeros(b, dtype=torch.long)
            res = speculative.Verified(draw(logp[:, 0], uniforms()).unsqueeze(1), zero + 1, zero)
        else:
            res = self.verifier(drafts, torch.stack(qs, dim=1), logp.softmax(dim=-1), generator=gens)
        n_acc_all = res.n_accepted.tolist()
        for i, (r, n_acc) in enumerate(zip(rs, n_acc_all)):
            toks = res.tokens[i, : n_acc + 1].tolist()
            self.rounds += 1
            self.proposed += kk
            self.reached += min(n_acc + 1, kk)
            self.accepted += n_acc
            self.emitted += len(toks)
            t = r.traj
            kept = 0
            while kept < len(toks) and not t.finished:
                self._append(t, toks[kept], float(logp[i, kept, toks[kept]]))
                kept += 1
            self._record(t, i, lens_p[i], kept)  # fed this round: the last kept token, then the drafts kept after it
            # Keep KV of the fed positions only: the kept prefix of seq + accepted drafts (the draft's may lag by one).
            keep = lens_p[i] + 1 + n_acc
            r.kv_p = _row(kv_p, i, max(lens_p) - lens_p[i], keep)
            if kk:  # a feature-reading draft keeps only the positions it read true features for
                r.kv_d = _row(kv_d, i, max(lens_d) - lens_d[i], lens_p[i] + 1 if self.reads_features else keep)
                if self.reads_features:
                    r.feat = feats[i : i + 1, : n_acc + 1]
        if kk == self.k:
            self.round_log.append(torch.tensor(n_acc_all))
            self.round_groups.append(((lag, kk), tuple(r.traj.request_id for r in rs)))

    def _logp(self, rs: list[_Req], logits: Tensor) -> Tensor:
        """Float32 sampling log-probs of each row's ``logits`` ``[B, ..., V]`` under its request's temperature/top-p."""
        params = [(r.traj.request.params.temperature, r.traj.request.params.top_p) for r in rs]
        if len(set(params)) == 1:
            return sampling_logprobs(logits, *params[0])
        return torch.stack([sampling_logprobs(lg, *pr) for lg, pr in zip(logits, params)])
