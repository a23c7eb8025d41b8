"""What ``scifolio posttrain lemma solve`` runs: build the policy and verifier, solve, credit, print, write the trace.

    scifolio posttrain lemma solve --model scripted --tasks test.jsonl --out trace.json
    scifolio posttrain lemma solve --model scripted --problem "Let x0 = 4. Let x1 = gcd(x0 + 8, 36). Find x1." --answer 12
    scifolio posttrain lemma solve --model /models/qwen --tasks test.jsonl --verifier model --out trace.json

``--model``: ``scripted`` (the scripted reasoner of ``scripted.py``), ``tiny`` (a random 2-layer Qwen2 over the
character codec, to exercise the transformers engine offline; it writes no parseable lemma), or a local Hugging
Face model directory (tokenizer included). ``--verifier``: ``formal`` (sympy + math-verify; needs the reference
answer for answers), ``noisy`` (P 0.931 / R 0.818 simulated over the formal checker), ``model`` (the same policy
in the verifier role).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from formats import fs
from posttrain.lemma.agent import AgentConfig, LemmaAgent, Trace
from posttrain.lemma.credit import trace_credit
from posttrain.lemma.roles import RoleCaller
from posttrain.lemma.statements import answers_match
from posttrain.lemma.verifiers import make_verifier


@dataclass(frozen=True)
class SolveConfig:
    model: str = "scripted"
    verifier: str = "formal"
    """``formal``, ``noisy`` or ``model``."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    p_correct: float = 0.8
    """Scripted reasoner only: probability a derived step is right."""
    reward: str = "conjugate"
    """Final reward for the credit: ``conjugate`` (centred), ``ratio`` or ``reference``."""
    seed: int = 0
    temperature: float = 1.0
    max_prompt_tokens: int | None = None


def build_caller(cfg: SolveConfig) -> RoleCaller:
    if cfg.model == "scripted":
        from posttrain.lemma.scripted import scripted_caller

        return scripted_caller(p_correct=cfg.p_correct, seed=cfg.seed)
    from posttrain.lemma.train import build_policy
    from posttrain.rl.engines import PolicyConfig
    from posttrain.rollout.engines.hf import HFEngine

    tiny = cfg.model == "tiny"  # a random 2-layer Qwen2 over the character codec
    model, codec = build_policy(PolicyConfig(path=None if tiny else cfg.model, seed=cfg.seed), 4096)
    cap = cfg.max_prompt_tokens or (1024 if tiny else None)
    return RoleCaller(HFEngine(model, capacity=64), codec, cfg.temperature, cfg.seed, cap)


def solve(cfg: SolveConfig, rows: list[dict[str, Any]]) -> tuple[list[Trace], list[dict[str, Any]]]:
    """Run the agent on ``rows``; returns the traces and, per problem, the JSON record (trace + credit + solved)."""
    caller = build_caller(cfg)
    traces = LemmaAgent(caller, make_verifier(cfg.verifier, caller, cfg.seed), cfg.agent).solve(rows)
    records = []
    for t in traces:
        final, ref = t.final_answer(), t.problem.get("answer")
        solved = None if ref is None else final is not None and answers_match(final.value, str(ref))
        credit = asdict(trace_credit(t, cfg.reward))
        records.append({**t.to_dict(), "solved": solved, "credit": credit, "policy_tokens": t.policy_tokens()})
    return traces, records


def describe(rec: dict[str, Any]) -> str:
    """The human view: rounds, the lemma memory, the graph and the final answer."""
    lines = [f"problem {rec['problem'].get('id', '')}: {rec['problem']['prompt']}"]
    credit = rec["credit"]
    for r, v, m in zip(rec["rounds"], credit["round_values"], credit["round_mask"]):
        extra = f" answer {r['answer']}" if r["answer"] else ""
        errs = f" ({len(r['parse_errors'])} malformed)" if r["parse_errors"] else ""
        lines.append(
            f"  round {r['index']:>2} {r['phase']:<6} new {','.join(r['new_lemmas']) or '-'}{extra}{errs}"
            f"  value {v:.3f}{'' if m else ' (masked)'}"
        )
    lines.append("  memory:")
    for m in rec["memory"]:
        k, n = sum(m["passes"]), len(m["passes"])
        sup = f" superseded by {m['superseded_by']}" if m["superseded_by"] else ""
        lines.append(f"    [{m['id']}] r{m['round']} {m['status']:<9} {k}/{n} {m['statement']}{sup}")
    lines.append("  graph: " + (", ".join(f"{a}->{b}" for a, b in credit["edges"]) or "(no edges)"))
    final = next((a for a in rec["answers"] if a["id"] == rec["final"]), None)
    ans = "none" if final is None else f"{final['value']} ({sum(final['passes'])}/{len(final['passes'])} checks)"
    lines.append(f"  final answer: {ans}; reward {credit['reward']:.3f}; solved {rec['solved']}")
    return "\n".join(lines)


def write_trace(path: str | Path, cfg: SolveConfig, records: list[dict[str, Any]], metrics: dict[str, float]) -> None:
    doc = {"config": asdict(cfg), "metrics": metrics, "problems": records}
    fs.write_text(path, json.dumps(doc, default=str))
