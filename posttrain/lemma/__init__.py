"""The Intern-S1-MO lemma-memory agent (SPEC §D): one home for the agent, its verifiers, its task family and its
graph credit.

- ``posttrain.objectives.lemma`` (their one home, outside this package): the pure formulas (verifier confidence,
  conjugate reward and its centring, lemma graph propagation); torch + stdlib only.
- ``statements``: the small statement language a lemma is written in, and the sympy decision procedure.
- ``format``: the structured text the roles write (lemma blocks, answers, verdicts) and its checking parser.
- ``verifiers``: one ``LemmaVerifier`` interface: formal (sympy + math-verify), model (through an engine),
  noisy (given precision and recall).
- ``tasks``: generated multi-step problems (each step a lemma the next needs), jsonl rows for ``posttrain/rl``.
- ``agent``: the rounds (reasoner → summariser → verifier, then revisions) and the trace.
- ``roles``: role prompts as calls on a ``RolloutEngine`` (batched; every call's tokens and logprobs recorded).
- ``credit``: the trace's lemma graph → lemma values, round values and the round mask; ``batch_metrics``.
- ``hier``: traces of G rollouts → per-call ``Trajectory`` + per-token round advantages for ``Learner.update``.
- ``bc``: cold-start behavioural-cloning examples from the credited rounds of solved problems.
- ``scripted``: a scripted reasoner/summariser/reviser/verifier policy for experiments and tests.
- ``run``: what ``scifolio posttrain lemma solve`` runs.

    scifolio posttrain lemma solve --model scripted --tasks test.jsonl --out trace.json
"""
