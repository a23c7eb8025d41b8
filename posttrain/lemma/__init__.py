"""The Intern-S1-MO lemma-memory agent (SPEC §D): one home for the agent, its verifiers, its task family and its
graph credit.

- ``objectives``: the pure formulas (verifier confidence, conjugate reward and its centring, lemma graph
  propagation); torch + stdlib only, re-exported here so ``from posttrain.lemma import conjugate_reward`` works.
- ``statements``: the small statement language a lemma is written in, and the sympy decision procedure.
- ``format``: the structured text the roles write (lemma blocks, answers, verdicts) and its checking parser.
- ``verifiers``: one ``LemmaVerifier`` interface: formal (sympy + math-verify), model (through an engine),
  noisy (given precision and recall).
- ``tasks``: generated multi-step problems (each step a lemma the next needs), jsonl rows for ``posttrain/rl``.
- ``engine``: role calls on a ``RolloutEngine`` (batched; every call's tokens and logprobs recorded).
- ``agent``: the rounds (reasoner → summariser → verifier, then revisions) and the trace.
- ``credit``: the trace's lemma graph → lemma values, round values and the round mask for training.
- ``scripted``: a scripted reasoner/summariser/verifier policy for experiments and tests.

    scifolio posttrain lemma solve --model scripted --tasks test.jsonl --out trace.json
"""

from posttrain.lemma.objectives import (
    ACCEPT_THRESHOLD,
    Lemma,
    LemmaGraph,
    accepted,
    centred_conjugate_reward,
    centred_conjugate_reward_exact,
    conjugate_reward,
    conjugate_reward_exact,
    conjugate_rewards,
    pass_ratio_reward,
    prob_beta_greater,
    verifier_confidence,
)

__all__ = [
    "ACCEPT_THRESHOLD",
    "Lemma",
    "LemmaGraph",
    "accepted",
    "centred_conjugate_reward",
    "centred_conjugate_reward_exact",
    "conjugate_reward",
    "conjugate_reward_exact",
    "conjugate_rewards",
    "pass_ratio_reward",
    "prob_beta_greater",
    "verifier_confidence",
]
