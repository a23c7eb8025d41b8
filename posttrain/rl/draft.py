"""Online training of the speculative draft on the policy's own distributions (SPEC §C4, Eq 22–24).

At each RL iteration the draft is fitted to the CURRENT policy's next-token distributions at the rollout
states just collected (prompt + generated tokens of the batch), the policy's gradients stopped:
``L = mean_k λ_k·KL(p‖q) + (1−λ_k)·TV(p, q)`` with ``λ_k = exp(−η·ᾱ_k)`` from the running acceptance of
draft position k (``AcceptanceTracker`` fed by the engine's verification rounds). A response's generated
positions are cut into windows of K consecutive tokens; position j of a window stands for draft position j
of a round. The draft's weights are versioned (``version``) and synced to the engine like the policy's.

    from posttrain.rl.draft import DraftTrainer
    dt = DraftTrainer(draft, SpeculativeConfig(enabled=True)); dt.observe(engine.take_round_log()); dt.update(trajs, policy)

Run the tests: ``python -m pytest tests/posttrain/rl/test_draft_online.py -q``
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from posttrain.fit import fit, right_pad
from posttrain.objectives.speculative import AcceptanceTracker, hybrid_draft_loss
from posttrain.rollout.engines.speculative import SpeculativeConfig
from posttrain.rollout.types import Trajectory


class DraftTrainer:
    """Owns the trainable draft, its optimizer, the running acceptance and the draft version."""

    def __init__(self, draft: torch.nn.Module, cfg: SpeculativeConfig) -> None:
        self.draft, self.cfg = draft, cfg
        self.opt = torch.optim.Adam(draft.parameters(), lr=cfg.draft_lr)
        self.tracker = AcceptanceTracker(cfg.k, decay=cfg.decay)
        self.version = 0

    def observe(self, round_log: list[Tensor]) -> None:
        """Fold the engine's verification outcomes (``n_accepted`` per full-K round, ``engine.take_round_log()``)
        into ᾱ_k; clears the list it was given."""
        for n_acc in round_log:
            self.tracker.update(n_acc)
        round_log.clear()

    def _windows(self, trajs: Sequence[Trajectory]) -> tuple[Tensor, Tensor, list[tuple[int, int, int]]]:
        """Right-padded ids ``[B, L]``, mask, and (row, start, n) per window of ≤K generated positions.

        Position ``t`` of a window is the state predicting generated token ``t`` (logits at index prompt+t−1)."""
        ids, mask = right_pad([t.prompt_ids + t.token_ids for t in trajs if t.n_tokens])
        wins = []
        k = self.cfg.k
        for i, t in enumerate(x for x in trajs if x.n_tokens):
            n_prompt = len(t.prompt_ids)
            for start in range(0, t.n_tokens, k):
                wins.append((i, n_prompt - 1 + start, min(k, t.n_tokens - start)))
        return ids, mask, wins

    def update(self, trajs: Sequence[Trajectory], policy: torch.nn.Module, temperature: float = 1.0) -> dict[str, Any]:
        """``draft_steps`` Adam steps of the hybrid loss on these states; bumps ``version``."""
        ids, mask, wins = self._windows(trajs)
        if not wins:
            return {"draft_loss": float("nan"), "draft_version": self.version}
        reads = getattr(self.draft, "reads_features", False)
        with torch.no_grad():
            out = policy(input_ids=ids, attention_mask=mask, output_hidden_states=reads)
        feats = out.hidden_states[-1] if reads else None
        return self.fit(ids, mask, wins, out.logits.float() / temperature, temperature, feats)

    def fit(
        self,
        ids: Tensor,
        mask: Tensor,
        wins: list[tuple[int, int, int]],
        target: Tensor,
        temperature: float = 1.0,
        feats: Tensor | None = None,
    ) -> dict[str, Any]:
        """``draft_steps`` Adam steps of the hybrid loss against precomputed policy logits ``target`` ``[B, L, V]``
        (already divided by the temperature) at the windows ``(row, first logit index, n)``; bumps ``version``.
        ``feats``: the policy's features ``[B, L, d]``, for a draft that reads them (``FeatureDraft``): a window's
        first position is scored on its pass 1 (true features), the rest on pass 2 (its own), plus the feature pull."""
        k = self.cfg.k
        rows = torch.tensor([w[0] for w in wins])
        pos = torch.tensor([[w[1] + j for j in range(k)] for w in wins]).clamp(max=ids.shape[1] - 1)
        valid = torch.tensor([[j < w[2] for j in range(k)] for w in wins])
        tgt = target[rows.unsqueeze(-1), pos]  # [W, K, V]

        def loss(draft: torch.nn.Module, _: int) -> Tensor:
            if feats is None:
                q, pull = draft(input_ids=ids, attention_mask=mask).logits[rows.unsqueeze(-1), pos], 0.0
            else:
                first, later, pull = draft.train_forward(ids, feats, mask)
                q = torch.cat([first[rows, pos[:, 0]].unsqueeze(1), later[rows.unsqueeze(-1), pos[:, 1:]]], 1)
            return hybrid_draft_loss(tgt, q.float() / temperature, self.tracker.value, eta=self.cfg.eta, mask=valid) + (
                0.1 * pull
            )

        losses = fit(self.draft, range(self.cfg.draft_steps), loss, optimizers=[self.opt])
        self.version += 1
        return {
            "draft_loss": losses[-1] if losses else float("nan"),
            "draft_version": self.version,
            "draft_acceptance": float(self.tracker.value.mean()),
        }

    def weights(self) -> dict[str, Tensor]:
        return {n: p.detach().clone() for n, p in self.draft.state_dict().items()}

    def state_dict(self) -> dict[str, Any]:
        return {
            "draft": self.weights(),
            "opt": self.opt.state_dict(),
            "acceptance": self.tracker.value.clone(),
            "version": self.version,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.draft.load_state_dict(state["draft"])
        self.opt.load_state_dict(state["opt"])
        self.tracker.value = state["acceptance"].clone()
        self.version = int(state["version"])
