"""Agent traces → what the learner's policy update takes: one ``Trajectory`` per policy call plus per-token
advantages (the hierarchical MDP of OREAL-H: rounds are the high-level steps, the tokens of a round's calls share
the round's advantage).

For G rollouts of one question: each trace's graph credit (``credit.trace_credit``) gives round values and the
round mask; ``objectives.round_advantages`` subtracts the leave-one-out mean of the other rollouts' final rewards;
every reasoner / summariser / reviser call becomes a ``Trajectory`` with its exact prompt ids, sampled ids,
behaviour logprobs and versions, ``loss_mask`` 0 in masked rounds, and its round's advantage on every token.
Verifier calls are not trained here (a separate verifier model, or a later issue). Questions whose pass rate is
0 or 1 are dropped (``objectives.saturated_questions``; S1-MO's filter). ``train.LemmaStage`` hands the output to
the learner.

    trajs, adv, kept = hierarchical_batch([traces_q1, traces_q2], reward="conjugate")
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from posttrain.lemma.agent import Trace
from posttrain.lemma.bc import POLICY_ROLES
from posttrain.lemma.credit import final_reward, trace_credit
from posttrain.objectives.lemma import round_advantages, saturated_questions
from posttrain.rollout.types import FINISH_STOP, Request, SamplingParams, Trajectory


def hierarchical_batch(
    groups: Sequence[Sequence[Trace]], reward: str = "conjugate", graph: bool = True, drop_saturated: bool = True
) -> tuple[list[Trajectory], Tensor, list[int]]:
    """``groups[b]`` = the rollouts of question b. Returns the trajectories, their ``[N, T]`` token advantages
    (T = the longest call, aligned with ``learner.pack``) and the indices of the questions kept."""
    solved = [[final_reward(t, "reference") > 0 for t in g] for g in groups]
    G = max(len(g) for g in groups)
    flags = torch.zeros(len(groups), G, dtype=torch.bool)
    valid = torch.zeros_like(flags)
    for b, s in enumerate(solved):
        flags[b, : len(s)] = torch.tensor(s)
        valid[b, : len(s)] = True
    drop = saturated_questions(flags, valid) if drop_saturated else torch.zeros(len(groups), dtype=torch.bool)
    kept = [b for b in range(len(groups)) if not bool(drop[b])]
    trajs: list[Trajectory] = []
    advs: list[float] = []
    for b in kept:
        credits = [trace_credit(t, reward, graph=graph) for t in groups[b]]
        R = max(len(c.round_values) for c in credits)
        values = torch.zeros(len(credits), R, dtype=torch.float64)
        mask = torch.zeros(len(credits), R, dtype=torch.bool)
        for g, c in enumerate(credits):
            values[g, : len(c.round_values)] = torch.tensor(c.round_values, dtype=torch.float64)
            mask[g, : len(c.round_mask)] = torch.tensor(c.round_mask)
        rewards = torch.tensor([c.reward for c in credits], dtype=torch.float64)
        adv = round_advantages(values, mask, rewards)
        for g, t in enumerate(groups[b]):
            for call in t.calls:
                if call.role not in POLICY_ROLES or not call.token_ids:
                    continue
                n = len(call.token_ids)
                req = Request(call.call_id, list(call.prompt_ids), SamplingParams(max_new_tokens=n), t.problem_id)
                sampled = (list(call.token_ids), list(call.logprobs), list(call.versions))
                traj = Trajectory(req, *sampled, [int(mask[g, call.round])] * n, call.routed_experts)
                traj.finish_reason = call.finish_reason or FINISH_STOP
                traj.reward = float(rewards[g])
                trajs.append(traj)
                advs.append(float(adv[g, call.round]))
    T = max((t.n_tokens for t in trajs), default=1)
    out = torch.zeros(len(trajs), T, dtype=torch.float32)
    for i, (t, a) in enumerate(zip(trajs, advs)):
        out[i, : t.n_tokens] = a * torch.tensor(t.loss_mask, dtype=torch.float32)
    return trajs, out, kept
