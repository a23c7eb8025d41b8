"""Graph credit for one agent trace: lemma values, round values and the round mask a trainer weights rounds by.

Nodes are the trace's memory entries and its answer records (an answer is a claim verified like a lemma, produced
by one round). Edges run from each ``USES`` id the agent checked against the memory to the node that used it
(unknown ids never become edges). The final reward comes from the final answer's checks: ``k`` of ``n`` passing
→ ``2·r(k, n) − 1`` (``reward="conjugate"``, the centred conjugate reward: 0 for no pass) or ``k / n``
(``reward="ratio"``, the ablation); ``reward="reference"`` grades the final answer against the row's answer
with math-verify (n passes or none). Only when that reward is positive is it injected at the terminal success
node (the final answer) and propagated backwards (``LemmaGraph.propagate``, factor ``gamma`` per edge); a round's
value is the max over the nodes it produced; rounds that produced no new node have mask 0. ``graph=False`` (the
"graph credit off" ablation) gives every unmasked round the final reward instead.

    python -c "from posttrain.lemma.credit import trace_credit; help(trace_credit)"
"""

from __future__ import annotations

from dataclasses import dataclass

from posttrain.lemma.agent import Trace
from posttrain.lemma.statements import answers_match
from posttrain.objectives.lemma import Lemma, LemmaGraph, centred_conjugate_reward, pass_ratio_reward

REWARDS = ("conjugate", "ratio", "reference")


@dataclass
class Credit:
    reward: float
    lemma_values: dict[str, float]
    round_values: list[float]
    round_mask: list[bool]
    edges: list[tuple[str, str]]


def final_reward(trace: Trace, reward: str = "conjugate") -> float:
    final = trace.final_answer()
    if final is None:
        return 0.0
    if reward == "reference":
        return float(answers_match(final.value, str(trace.problem.get("answer", ""))))
    n = len(final.passes)
    if n == 0:
        return 0.0
    k = sum(final.passes)
    if reward == "conjugate":
        return centred_conjugate_reward(k, n)
    if reward == "ratio":
        return pass_ratio_reward(k, n)
    raise ValueError(f"unknown reward {reward!r} (choose from {', '.join(REWARDS)})")


def trace_credit(trace: Trace, reward: str = "conjugate", gamma: float = 1.0, graph: bool = True) -> Credit:
    g = LemmaGraph([Lemma(n.id, n.round, tuple(n.uses)) for n in [*trace.memory, *trace.answers]])
    r = final_reward(trace, reward)
    terminal = [trace.final] if trace.final is not None else []
    values = g.propagate(terminal, r, gamma) if terminal else g.propagate([], 0.0)
    round_values, mask = g.round_values(values, len(trace.rounds))
    mask_l = [bool(x) for x in mask.tolist()]
    rv = round_values.tolist() if graph else [r if m else 0.0 for m in mask_l]
    edges = [(g.lemmas[i].id, g.lemmas[j].id) for i, j in g.adjacency.nonzero().tolist()]
    return Credit(r, {lem.id: float(v) for lem, v in zip(g.lemmas, values.tolist())}, rv, mask_l, edges)


def batch_metrics(traces: list[Trace], reward: str = "conjugate") -> dict[str, float]:
    """One metrics row over a batch of traces: mean final reward, solve rate (reference), accepted and uncertain
    lemmas per reasoning round, the fraction of masked rounds, mean rounds and policy tokens per problem."""
    if not traces:
        return {}
    credits = [trace_credit(t, reward) for t in traces]
    reason_rounds = sum(1 for t in traces for r in t.rounds if r.phase == "reason")
    rounds = sum(len(t.rounds) for t in traces)
    accepted = sum(1 for t in traces for m in t.memory if m.status == "accepted")
    uncertain = sum(1 for t in traces for m in t.memory if m.status != "accepted")
    solved = [final_reward(t, "reference") for t in traces if "answer" in t.problem]
    n = len(traces)
    return {
        "reward": sum(c.reward for c in credits) / n,
        "solved": sum(solved) / len(solved) if solved else float("nan"),
        "accepted_per_round": accepted / max(1, reason_rounds),
        "uncertain_per_round": uncertain / max(1, reason_rounds),
        "masked_rounds": sum(not m for c in credits for m in c.round_mask) / max(1, rounds),
        "rounds": rounds / n,
        "policy_tokens": sum(t.policy_tokens() for t in traces) / n,
    }
