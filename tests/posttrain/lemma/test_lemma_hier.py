"""OREAL-H's hierarchical batch: round advantages (graph value − LOO baseline), masked rounds untrained, questions
with pass rate 0 or 1 dropped; the output packs for the learner.

Run: python -m pytest tests/posttrain/lemma/test_lemma_hier.py -q
"""

from __future__ import annotations

import pytest
import torch

from posttrain.lemma.agent import AgentConfig, LemmaAgent
from posttrain.lemma.credit import trace_credit
from posttrain.lemma.hier import hierarchical_batch
from posttrain.lemma.scripted import scripted_caller
from posttrain.lemma.tasks import make_rows
from posttrain.lemma.verifiers import NoisyVerifier
from posttrain.objectives.lemma import round_advantages, saturated_questions
from posttrain.rl.learner import pack


def test_round_advantages_hand_values() -> None:
    a = 20 / 21
    values = torch.tensor([[a, a, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, True]])
    adv = round_advantages(values, mask, torch.tensor([a, 0.0]))
    assert adv.flatten().tolist() == pytest.approx([a, a, 0.0, -a, 0.0, -a])
    with pytest.raises(ValueError):
        round_advantages(values[:1], mask[:1], torch.tensor([a]))


def test_saturated_questions() -> None:
    solved = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    gmask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 1, 1]], dtype=torch.bool)
    assert saturated_questions(solved, gmask).tolist() == [True, True, False, True]


def test_hierarchical_batch_from_scripted_rollouts() -> None:
    easy, hard = make_rows(2, seed=4, split="test", steps=1)[0], make_rows(2, seed=4, split="test", steps=5)[1]
    G = 4
    rows = [{**r, "id": f"{r['id']}#{g}"} for r in (easy, hard) for g in range(G)]
    cfg = AgentConfig(max_rounds=3, max_revisions=1, reasoner_tokens=280, summariser_tokens=600, reviser_tokens=160)
    traces = LemmaAgent(scripted_caller(p_correct=0.6, seed=0), NoisyVerifier(seed=0), cfg).solve(rows)
    groups = [traces[:G], traces[G:]]
    trajs, adv, kept = hierarchical_batch(groups)
    assert kept == [1]  # the one-step question is solved by every rollout: dropped
    assert {t.group_id for t in trajs} == {t.problem_id for t in groups[1]}
    credits = [trace_credit(t) for t in groups[1]]
    rewards = torch.tensor([c.reward for c in credits])
    assert 0 < int((rewards > 0).sum()) < G  # a mixed group (fixed seeds)
    by_id = {c.call_id: (g, c) for g, t in enumerate(groups[1]) for c in t.calls}
    for i, traj in enumerate(trajs):
        g, call = by_id[traj.request_id]
        cr = credits[g]
        baseline = (float(rewards.sum()) - cr.reward) / (G - 1)
        masked = not cr.round_mask[call.round]
        assert traj.loss_mask == [0 if masked else 1] * len(call.token_ids)
        expect = 0.0 if masked else cr.round_values[call.round] - baseline
        assert adv[i, : traj.n_tokens].tolist() == pytest.approx([expect] * traj.n_tokens, abs=1e-6)
        assert float(adv[i, traj.n_tokens :].abs().sum()) == 0.0
        assert traj.prompt_ids == call.prompt_ids and traj.logprobs == call.logprobs
    p = pack(trajs)
    assert p.tokens.shape == adv.shape and int(p.response_mask.sum()) == sum(sum(t.loss_mask) for t in trajs)
