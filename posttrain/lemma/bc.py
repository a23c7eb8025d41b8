"""Cold-start behavioural-cloning data for OREAL-H: the successful rounds of agent traces as token sequences.

OREAL-H's cold start clones filtered successful rounds before RL (a tiny policy cannot write a parseable lemma from
scratch). Filter: the problem is solved (final answer matches the reference) and its final answer was accepted
by the verifier; of its rounds, only those the graph credit values (mask 1, value > 0: a round whose lemmas the
final answer rests on, or the round of the answer itself). Each policy call of such a round (reasoner, summariser,
reviser; verifier calls never) becomes one example: ``input_ids = prompt_ids + token_ids`` exactly as sampled (no
re-tokenisation), ``loss_mask`` 0 over the prompt and 1 over the generated tokens, and the round's value as its
weight, with the round index and role kept, so a trainer on the hierarchical MDP can group tokens by round.
``collate`` pads a batch into tensors; ``write_jsonl`` / ``read_jsonl`` store examples.

    python -m posttrain.lemma.bc --tasks train.jsonl --out bc.jsonl --p-correct 0.8     # scripted reasoner
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from formats import fs
from posttrain.lemma.agent import Trace
from posttrain.lemma.credit import trace_credit
from posttrain.lemma.statements import answers_match

POLICY_ROLES = ("reasoner", "summariser", "reviser")


@dataclass
class BCExample:
    problem_id: str
    round: int
    role: str
    input_ids: list[int]
    loss_mask: list[int]
    """0 on prompt positions, 1 on the generated tokens the policy should imitate."""
    weight: float
    """The round's value from the graph credit."""


def solved(trace: Trace) -> bool:
    final = trace.final_answer()
    ref = trace.problem.get("answer")
    return final is not None and final.accepted and ref is not None and answers_match(final.value, str(ref))


def examples_from_traces(traces: Sequence[Trace], reward: str = "conjugate") -> list[BCExample]:
    out: list[BCExample] = []
    for t in traces:
        if not solved(t):
            continue
        credit = trace_credit(t, reward)
        keep = {i for i, (v, m) in enumerate(zip(credit.round_values, credit.round_mask)) if m and v > 0}
        for c in t.calls:
            if c.round in keep and c.role in POLICY_ROLES and c.token_ids:
                ids = [*c.prompt_ids, *c.token_ids]
                mask = [0] * len(c.prompt_ids) + [1] * len(c.token_ids)
                out.append(BCExample(t.problem_id, c.round, c.role, ids, mask, credit.round_values[c.round]))
    return out


def collate(examples: Sequence[BCExample], pad_id: int = 0) -> dict[str, Any]:
    """Right-padded ``input_ids``, ``attention_mask``, ``loss_mask`` ``[B, T]`` and ``weight`` ``[B]`` tensors."""
    import torch

    from posttrain.fit import right_pad

    ids, attn = right_pad([e.input_ids for e in examples], pad_id)
    loss = right_pad([e.loss_mask for e in examples])[0]
    weight = torch.tensor([e.weight for e in examples], dtype=torch.float32)
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss, "weight": weight}


def write_jsonl(examples: Sequence[BCExample], path: str | Path) -> None:
    fs.write_jsonl(path, [asdict(e) for e in examples])


def read_jsonl(path: str | Path) -> list[BCExample]:
    return [BCExample(**r) for r in fs.read_jsonl(path)]


def main(argv: list[str] | None = None) -> int:
    from posttrain.lemma.agent import AgentConfig, LemmaAgent
    from posttrain.lemma.scripted import scripted_caller
    from posttrain.lemma.verifiers import NoisyVerifier

    ap = argparse.ArgumentParser(description="cold-start BC data from the scripted reasoner's successful rounds")
    ap.add_argument("--tasks", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--p-correct", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    rows = fs.read_jsonl(a.tasks)
    cfg = AgentConfig(reasoner_tokens=280, summariser_tokens=600, reviser_tokens=280)
    traces = LemmaAgent(scripted_caller(a.p_correct, seed=a.seed), NoisyVerifier(seed=a.seed), cfg).solve(rows)
    ex = examples_from_traces(traces)
    write_jsonl(ex, a.out)
    n_solved = sum(solved(t) for t in traces)
    print(f"{len(ex)} examples from {n_solved}/{len(traces)} solved problems -> {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
