"""Role calls on a ``RolloutEngine``: the reasoner, summariser, reviser and verifier are prompts to an engine.

``RoleCaller.generate`` takes a batch of ``RolePrompt`` (any mix of roles and problems), submits one ``Request``
per prompt, steps the engine until every one is back, decodes the text and records a ``Call`` per request: the
exact prompt ids, generated ids, behaviour logprobs, policy versions and finish reason, so a trainer can later
rebuild every round's token sequence without re-tokenising. One engine with role prompts plays every role; a
separate verifier model is just a second ``RoleCaller`` on its own engine.

A ``Codec`` is the text ↔ ids map (``HFCodec`` wraps a Hugging Face tokenizer; ``char_codec`` builds a local
character tokenizer for scripted engines and tiny models). Prompts longer than ``max_prompt_tokens`` keep their
head (role and problem) and tail (the request) and drop the middle of the memory, marked ``~``.

    caller = RoleCaller(engine, HFCodec(tokenizer)); calls = caller.generate([RolePrompt("reasoner", text, "p0", 0)])
"""

from __future__ import annotations

import string
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from posttrain.rollout.engine import RolloutEngine, run_all
from posttrain.rollout.types import Request, SamplingParams

ROLES = ("reasoner", "summariser", "reviser", "verifier")

ROLE_INSTRUCTIONS = {
    "reasoner": (
        "You are the reasoner. Work on the problem step by step, building on the lemma memory (accepted lemmas are "
        "verified; uncertain ones may be wrong). For every intermediate result write a line\n"
        "DERIVED: <statement> | BECAUSE: <why> | USES: <M ids or none>\n"
        "When you know the final value, end with\nANSWER: <value>\nUSES: <ids>"
    ),
    "summariser": (
        "You are the summariser. Compress the reasoning round below into candidate lemmas, one block each:\n"
        "LEMMA: <statement>\nBECAUSE: <short justification>\nUSES: <M ids from memory, L ids of earlier blocks, "
        "or none>\nEND\nStatements: 'eq: A = B', 'int: A = B', 'int: A divides B', 'int: A is prime', "
        "'solve x: A = B -> {s1, s2}', 'ineq x in [a, b]: A <= B', 'least t >= a: A >= B -> v'."
    ),
    "reviser": (
        "You are the reviser. Using the lemma memory and the verifier's feedback on earlier answers, give the "
        "final answer:\nANSWER: <value>\nUSES: <ids>"
    ),
    "verifier": (
        "You are the verifier. Check the claim below carefully and end with exactly one line\n"
        "VERDICT: VALID\nor\nVERDICT: INVALID"
    ),
}


ROLE_INSTRUCTIONS_SHORT = {
    "reasoner": "Lines DERIVED: <statement> | BECAUSE: <why> | USES: <ids>; then ANSWER: <value> and USES: <ids>.",
    "summariser": "Blocks LEMMA: / BECAUSE: / USES: / END; then ANSWER: and USES: if the round has one.",
    "reviser": "ANSWER: <value> and USES: <ids>.",
    "verifier": "End with VERDICT: VALID or VERDICT: INVALID.",
}
"""One-line role instructions (``RoleCaller(instructions=ROLE_INSTRUCTIONS_SHORT)``): for small character-level
policies, where every character of the full instructions is a prompt token on every call (the ``debug`` recipe)."""


class Codec(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    @property
    def stop_ids(self) -> tuple[int, ...]: ...


class HFCodec:
    """A Hugging Face tokenizer as a ``Codec`` (BOS prepended when the tokenizer has one; EOS stops)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        bos = self.tokenizer.bos_token_id
        return [bos, *ids] if bos is not None else list(ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        eos = self.tokenizer.eos_token_id
        return (eos,) if eos is not None else ()


def char_codec() -> HFCodec:
    """``rl.task.char_tokenizer`` over printable ASCII: every character is its own token, newlines included."""
    from posttrain.rl.task import char_tokenizer

    return HFCodec(char_tokenizer("".join(c for c in string.printable if c not in "\x0b\x0c\r"), r"[\s\S]"))


@dataclass
class RolePrompt:
    role: str
    text: str
    problem_id: str
    round: int
    """Round index within the problem (reasoning rounds first, then revision rounds)."""
    max_tokens: int = 256
    key: str = ""
    """Disambiguates several prompts of one role in one round (lemma id, check index)."""


@dataclass
class Call:
    """One engine call, exactly as sampled (what a trainer needs)."""

    call_id: str
    role: str
    problem_id: str
    round: int
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str | None
    text: str = ""
    routed_experts: list | None = None
    """The experts the engine's MoE router chose per position (R3; ``RoleCaller.routes``), else None."""


@dataclass
class RoleCaller:
    """Drives one engine for batches of role prompts and records every call."""

    engine: RolloutEngine
    codec: Codec
    temperature: float = 1.0
    seed: int = 0
    max_prompt_tokens: int | None = None
    max_steps: int = 1_000_000
    """Safety bound on engine steps per batch."""
    instructions: dict[str, str] | None = None
    """Role instructions put in every prompt (default ``ROLE_INSTRUCTIONS``)."""
    calls: list[Call] = field(default_factory=list)
    routes: bool = False
    """Ask the engine for the routed experts of every call (an MoE policy: the learner replays them, R3)."""
    _n: int = 0

    def render(self, prompt: RolePrompt) -> str:
        return f"ROLE: {prompt.role}\n{(self.instructions or ROLE_INSTRUCTIONS)[prompt.role]}\n\n{prompt.text}\n"

    def _ids(self, text: str) -> list[int]:
        ids = self.codec.encode(text)
        cap = self.max_prompt_tokens
        if cap is not None and len(ids) > cap:
            head = cap // 3
            mark = self.codec.encode("~")[-1:]
            ids = ids[:head] + mark + ids[len(ids) - (cap - head - len(mark)) :]
        return ids

    def generate(self, prompts: Sequence[RolePrompt]) -> list[Call]:
        """One batched pass over the engine; returns the calls in the order of ``prompts``."""
        if not prompts:
            return []
        reqs: list[Request] = []
        kw = dict(stop_token_ids=tuple(self.codec.stop_ids), return_routed_experts=self.routes)
        for p in prompts:
            if p.role not in ROLE_INSTRUCTIONS:
                raise ValueError(f"unknown role {p.role!r} (roles: {', '.join(ROLES)})")
            self._n += 1
            rid = f"{p.problem_id}/{p.round}/{p.role}/{p.key or 0}/{self._n}"
            seed = zlib.crc32(f"{self.seed}/{rid}".encode())
            params = SamplingParams(p.max_tokens, self.temperature, seed=seed, **kw)
            reqs.append(Request(rid, self._ids(self.render(p)), params, group_id=p.problem_id, meta={"role": p.role}))
        out = []
        for p, r, t in zip(prompts, reqs, run_all(self.engine, reqs, self.max_steps)):
            stop = set(self.codec.stop_ids)
            gen = t.token_ids[:-1] if t.token_ids and t.token_ids[-1] in stop else t.token_ids
            sampled = (list(r.prompt_ids), list(t.token_ids), list(t.logprobs), list(t.versions), t.finish_reason)
            text = self.codec.decode(gen)
            out.append(Call(r.request_id, p.role, p.problem_id, p.round, *sampled, text, t.routed_experts))
        self.calls.extend(out)
        return out
