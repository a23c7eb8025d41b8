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

Batching: requests whose two caches have the same lengths (and the same K this round) share the
forwards; others run in separate groups (no padding). RL prompts of equal length batch fully.

    from posttrain.rollout.engines.speculative import SpeculativeEngine
    engine = SpeculativeEngine(policy, draft, k=4); engine.submit(requests); out = engine.step()

Run the tests: ``python -m pytest tests/posttrain/rollout/test_speculative_engine.py -q``
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from posttrain.objectives import speculative
from posttrain.rollout.engine import QueuedEngine, StepOutput
from posttrain.rollout.sampling import draw, sampling_logprobs, token_logprobs_of
from posttrain.rollout.types import Request, Trajectory

KV = list[tuple[Tensor, Tensor]]


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


@dataclass
class _Req:
    traj: Trajectory
    kv_p: KV | None = None
    """Policy KV covering the fed positions (prompt + tokens[:-1]); None = needs prefill."""
    kv_d: KV | None = None
    """Draft KV; may lag the policy's by one position (all drafts accepted last round)."""
    rounds: list[tuple[int, int]] = field(default_factory=list)


def _kv_len(kv: KV | None) -> int:
    return 0 if not kv else kv[0][0].shape[2]


def _crop(kv: KV, n: int) -> KV:
    return [(k[:, :, :n], v[:, :, :n]) for k, v in kv]


def _cat(kvs: list[KV]) -> KV | None:
    if not kvs[0]:
        return None
    return [(torch.cat([kv[i][0] for kv in kvs]), torch.cat([kv[i][1] for kv in kvs])) for i in range(len(kvs[0]))]


def _round_seed(seed: int, attempt: int, position: int) -> int:
    return (seed * 0x9E3779B97F4A7C15 + attempt * 1_000_003 + position * 97_531 + 17) % (2**63 - 1)


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
        self.model = model.eval()
        self.draft = draft.eval()
        self.k = k
        self._capacity = capacity
        self._version = version
        self.draft_version = draft_version
        self.verifier = verifier
        self._queue: deque[Trajectory] = deque()
        self._running: list[_Req] = []
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
        """Per ``round_log`` entry: the group's two KV lengths and its request ids in order, so engines split over
        workers can merge their entries into the groups one engine would have batched (``posttrain.ray_actors``)."""

    # -- protocol --------------------------------------------------------------------------------------------
    def submit(self, requests: Sequence[Request]) -> None:
        for r in requests:
            if r.params.return_routed_experts and self.experts_recorder is None:
                raise ValueError(f"{r.request_id} asks for routed experts (R3) but the engine has no experts_recorder")
            self._queue.append(Trajectory(request=r, routed_experts=[] if r.params.return_routed_experts else None))

    def update_weights(self, state: Mapping[str, Any], version: int) -> None:
        self._load_weights(self.model, state)
        self._version = int(version)

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
        for r in fresh:
            seq = r.traj.prompt_ids + r.traj.token_ids
            out.n_prefilled_tokens += len(seq)
        self._prefill(fresh)
        groups: dict[tuple[int, int, int], list[_Req]] = {}
        for r in self._running:
            kk = min(self.k, r.traj.remaining - 1)
            groups.setdefault((_kv_len(r.kv_p), _kv_len(r.kv_d), kk), []).append(r)
        before = [r.traj.n_tokens for r in self._running]
        for (_, _, kk), rs in groups.items():
            self._round(rs, kk)
        self.steps += 1
        out.n_decoded = len(self._running)
        out.new_tokens = {r.traj.request_id: r.traj.token_ids[n:] for r, n in zip(self._running, before)}
        self._retire(out)
        return out

    # -- internals -------------------------------------------------------------------------------------------
    def _forward(self, model: torch.nn.Module, ids: Tensor, kv: KV | None) -> tuple[Tensor, KV]:
        from transformers import DynamicCache

        cfg = model.config
        cache = DynamicCache(ddp_cache_data=kv, config=cfg) if kv else DynamicCache(config=cfg)
        rec = self.experts_recorder if model is self.model else None
        if rec is not None:
            rec.begin()
        o = model(input_ids=ids, cache=cache, use_cache=True)
        self._experts = rec.end() if rec is not None else None
        if model is self.model:
            self.policy_forwards += 1
        return o.logits, [(layer.keys, layer.values) for layer in o.cache.layers]

    def _record(self, traj: Trajectory, row: int, start: int, count: int) -> None:
        """Routes of the last policy forward's ``row`` for its first ``count`` fed positions, which are positions
        ``start…`` of the trajectory. A re-prefill after a resume replaces known rows (the routes behind the
        current KV and the rescored logprobs: the learner's replay at that version reproduces this forward)."""
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
                    r.kv_p, r.kv_d = [], []
                continue
            ids = torch.tensor([(r.traj.prompt_ids + r.traj.token_ids)[:-1] for r in rs])
            logits, kv_p = self._forward(self.model, ids, None)
            for i, r in enumerate(rs):
                self._record(r.traj, i, 0, n - 1)
            _, kv_d = self._forward(self.draft, ids, None)
            for i, r in enumerate(rs):
                t = r.traj
                if t.n_tokens:  # resumed: kept tokens' logprobs under the weights loaded now (matched-weights BKL)
                    p0, pr = len(t.prompt_ids) - 1, t.request.params
                    rows = logits[i, p0 : p0 + t.n_tokens].double()
                    t.rescore(token_logprobs_of(rows, t.token_ids, pr.temperature, pr.top_p), self._version)
                r.kv_p = [(k[i : i + 1], v[i : i + 1]) for k, v in kv_p]
                r.kv_d = [(k[i : i + 1], v[i : i + 1]) for k, v in kv_d]

    def _round(self, rs: list[_Req], kk: int) -> None:
        b = len(rs)
        seqs = [r.traj.prompt_ids + r.traj.token_ids for r in rs]
        n_p = _kv_len(rs[0].kv_p)  # = len(seq) - 1
        n_d = _kv_len(rs[0].kv_d)
        gens = []
        for r in rs:
            p = r.traj.request.params
            gens.append(torch.Generator().manual_seed(_round_seed(p.seed, r.traj.attempt, r.traj.n_tokens)))
        # Draft: catch up on the kept tokens it has not seen, then propose kk tokens one at a time.
        kv_d = _cat([r.kv_d for r in rs])
        feed = torch.tensor([s[n_d:] for s in seqs])
        drafts = torch.zeros(b, kk, dtype=torch.long)
        qs = []
        for j in range(kk):
            logits, kv_d = self._forward(self.draft, feed, kv_d)
            logq = torch.stack([self._logp(r, logits[i, -1]) for i, r in enumerate(rs)])
            q = logq.exp()
            for i in range(b):
                # Inverse-CDF draw (exact, like multinomial): ~0.2 ms against ~1–3 ms for torch.multinomial on a
                # 49k-token float64 row, paid K times a round (SmolLM2's vocabulary).
                drafts[i, j] = draw(logq[i : i + 1], torch.rand(1, generator=gens[i], dtype=torch.float64))[0]
            qs.append(q)
            feed = drafts[:, j : j + 1]
        # Policy: last kept token + kk drafts in one forward → kk+1 distributions.
        kv_p = _cat([r.kv_p for r in rs])
        ids = torch.cat([torch.tensor([[s[-1]] for s in seqs]), drafts], dim=1)
        logits, kv_p = self._forward(self.model, ids, kv_p)
        logp = torch.stack(
            [torch.stack([self._logp(r, logits[i, j]) for j in range(kk + 1)]) for i, r in enumerate(rs)]
        )
        p = logp.exp()
        q = torch.stack(qs, dim=1) if qs else p.new_zeros(b, 0, p.shape[-1])
        n_acc_all = []
        for i, r in enumerate(rs):
            if kk == 0:  # one token left: plain sampling from the policy
                n_acc, toks = 0, [int(torch.multinomial(p[i, 0].double(), 1, generator=gens[i]))]
            else:
                res = self.verifier(drafts[i : i + 1], q[i : i + 1].double(), p[i : i + 1].double(), generator=gens[i])
                n_acc = int(res.n_accepted[0])
                toks = res.tokens[0, : n_acc + 1].tolist()
            n_acc_all.append(n_acc)
            self.rounds += 1
            self.proposed += kk
            self.reached += min(n_acc + 1, kk)
            self.accepted += n_acc
            self.emitted += len(toks)
            t = r.traj
            kept = 0
            for j, tok in enumerate(toks):
                if t.finished:
                    break
                self._append(t, tok, float(logp[i, j, tok]))
                kept += 1
            self._record(t, i, n_p, kept)  # fed this round: the last kept token, then the drafts kept after it
            # Keep KV of the fed positions only: the kept prefix of seq + accepted drafts.
            keep = n_p + 1 + n_acc
            r.kv_p = _crop([(k[i : i + 1], v[i : i + 1]) for k, v in kv_p], keep)
            r.kv_d = _crop([(k[i : i + 1], v[i : i + 1]) for k, v in kv_d], keep) if kv_d else []
        if kk == self.k:
            self.round_log.append(torch.tensor(n_acc_all))
            self.round_groups.append(((n_p, n_d), tuple(r.traj.request_id for r in rs)))

    def _logp(self, r: _Req, logits: Tensor) -> Tensor:
        p = r.traj.request.params
        return sampling_logprobs(logits.double(), p.temperature, p.top_p)
