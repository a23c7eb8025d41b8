"""A scripted policy for the lemma agent: reasoner, summariser, reviser and verifier with set error rates.

Every role reads only its prompt (decoded from the request's token ids), as a model would:

- **reasoner**: reads the chain from the problem text (``tasks.read_chain``), follows it through the *accepted*
  lemmas of its memory as far as they go, then derives further steps, each costing ``tokens_per_step`` tokens
  of its budget (``max_new_tokens``) and each right with probability ``p_correct`` (a slip gives a plausible
  wrong value, and later steps build on it). It writes ``DERIVED: <lemma> | BECAUSE: … | USES: …`` lines and,
  once it reaches the last step, ``ANSWER``.
- **summariser**: turns the round's ``DERIVED`` lines into ``LEMMA`` blocks (and copies the ``ANSWER``).
- **reviser**: follows the accepted memory chain, drops its last link per rejected answer in the feedback
  (backtracking), re-derives the rest within its budget, and answers.
- **verifier** (for ``ModelVerifier`` runs): decides a lemma with sympy, an answer by solving the problem's chain
  exactly, and flips its verdict with probability ``verifier_flip``.

Randomness is seeded by (seed, request id), so a run is reproducible. ``scripted_caller`` builds the engine
(``ScriptedTokenEngine``), a character codec and the ``RoleCaller``.

    from posttrain.lemma.scripted import scripted_caller
    caller = scripted_caller(p_correct=0.8)
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from posttrain.lemma.roles import HFCodec, RoleCaller, char_codec
from posttrain.lemma.statements import decide
from posttrain.lemma.tasks import StepKind, read_chain
from posttrain.rollout.types import Request

_MEM = re.compile(r"^\[(M\d+)\] (accepted|uncertain) \d+/\d+: (.*)$", re.MULTILINE)
_DERIVED = re.compile(r"DERIVED: (.*?) \| BECAUSE: (.*?) \| USES: (.*?)\s*$", re.MULTILINE)


def _section(text: str, name: str) -> str:
    m = re.search(rf"^{name}:\s?(.*?)(?=^[A-Z]+:|\Z)", text, re.MULTILINE | re.DOTALL)
    return m.group(1).strip() if m else ""


@dataclass
class ScriptedPolicy:
    codec: HFCodec
    p_correct: float = 0.8
    """Probability that one derived step is right."""
    tokens_per_step: int = 120
    """Reasoning tokens one step costs (the text is padded with thinking dots to this length)."""
    verifier_flip: float = 0.0
    seed: int = 0

    def script(self, request: Request) -> list[int]:
        prompt = self.codec.decode(request.prompt_ids)
        role = request.meta.get("role", "")
        fn = {"reasoner": self.reason, "summariser": self.summarise, "reviser": self.revise, "verifier": self.verify}
        text = fn[role](prompt, request) if role in fn else ""
        ids = self.codec.tokenizer(text, add_special_tokens=False)["input_ids"]
        return [*ids, *self.codec.stop_ids]

    # -- helpers ----------------------------------------------------------------------------------------
    def _rng(self, request: Request) -> random.Random:
        return random.Random(f"{self.seed}/{request.request_id}")

    @staticmethod
    def _memory_chain(prompt: str, x0: int, chain: list[tuple[StepKind, dict[str, int]]]) -> list[tuple[int, str]]:
        """(value, memory id) of each step the accepted memory covers, in order from step 1."""
        accepted = [
            (mid, stmt) for mid, status, stmt in _MEM.findall(_section(prompt, "MEMORY")) if status == "accepted"
        ]
        out: list[tuple[int, str]] = []
        v = x0
        for kind, params in chain:
            prefix = kind.lemma_prefix(v, params)
            hit = next(((mid, s) for mid, s in reversed(accepted) if s.startswith(prefix)), None)
            if hit is None:
                break
            val = kind.value_of(hit[1][len(prefix) :])
            if val is None:
                break
            out.append((val, hit[0]))
            v = val
        return out

    def _derive(
        self,
        chain: list[tuple[StepKind, dict[str, int]]],
        start: int,
        v: int,
        ref: str,
        budget: int,
        rng: random.Random,
    ) -> tuple[list[str], int, int, str]:
        """Derive steps from ``start`` while the budget lasts: (lines, steps reached, value, last ref)."""
        lines: list[str] = []
        k = start
        reserve = 40  # the ANSWER lines
        while k < len(chain) and (len(lines) + 1) * self.tokens_per_step + reserve <= budget:
            kind, params = chain[k]
            if rng.random() < self.p_correct:
                val = kind.compute(v, params)
                rhs = kind.rhs(v, params, val)
            else:
                rhs, val = kind.wrong(v, params, rng)
            stmt = kind.lemma(v, params, rhs=rhs)
            head = f"x{k + 1} from x{k} = {v}."
            tail = f"DERIVED: {stmt} | BECAUSE: step {k + 1} | USES: {ref or 'none'}"
            lines.append(f"{head} {'.' * max(0, self.tokens_per_step - len(head) - len(tail) - 3)} {tail}")
            v, k, ref = val, k + 1, f"L{len(lines)}"
        return lines, k, v, ref

    # -- roles ------------------------------------------------------------------------------------------
    def reason(self, prompt: str, request: Request) -> str:
        read = read_chain(_section(prompt, "PROBLEM"))
        if read is None:
            return "I cannot read this problem.\n"
        x0, chain = read
        known = self._memory_chain(prompt, x0, chain)
        v, ref = (known[-1][0], known[-1][1]) if known else (x0, "")
        lines, k, v, ref = self._derive(chain, len(known), v, ref, request.params.max_new_tokens, self._rng(request))
        if k == len(chain):
            lines += [f"ANSWER: {v}", f"USES: {ref or 'none'}"]
        return "\n".join(lines) + "\n"

    def summarise(self, prompt: str, request: Request) -> str:
        round_text = prompt.split("ROUND:", 1)[-1]
        blocks = [f"LEMMA: {s}\nBECAUSE: {why}\nUSES: {uses}\nEND" for s, why, uses in _DERIVED.findall(round_text)]
        m = re.search(r"^ANSWER: (.*)\nUSES: (.*)$", round_text, re.MULTILINE)
        if m:
            blocks.append(f"ANSWER: {m.group(1)}\nUSES: {m.group(2)}")
        return "\n".join(blocks) + "\n"

    def revise(self, prompt: str, request: Request) -> str:
        read = read_chain(_section(prompt, "PROBLEM"))
        if read is None:
            return "ANSWER: 0\n"
        x0, chain = read
        rejected = len(re.findall(r"rejected", _section(prompt, "FEEDBACK")))
        known = self._memory_chain(prompt, x0, chain)
        known = known[: max(0, len(known) - rejected)]  # distrust one more link per rejected answer
        v, ref = (known[-1][0], known[-1][1]) if known else (x0, "")
        lines, k, v, ref = self._derive(chain, len(known), v, ref, request.params.max_new_tokens, self._rng(request))
        uses = ref if ref.startswith("M") else (known[-1][1] if known else "none")
        return "\n".join([*lines, f"ANSWER: {v}", f"USES: {uses}"]) + "\n"

    def verify(self, prompt: str, request: Request) -> str:
        rng = self._rng(request)
        claim = re.search(r"^CLAIM \((LEMMA|ANSWER)\): (.*)$", prompt, re.MULTILINE)
        if claim is None:
            return "I see no claim.\n"
        if claim.group(1) == "LEMMA":
            ok = decide(claim.group(2)).ok is True
        else:
            read = read_chain(_section(prompt, "PROBLEM"))
            ok = False
            if read is not None:
                v = read[0]
                for kind, params in read[1]:
                    v = kind.compute(v, params)
                ok = claim.group(2).strip() == str(v)
        if rng.random() < self.verifier_flip:
            ok = not ok
        what = "the claim holds" if ok else "the claim does not hold"
        return f"REASON: {what} ({claim.group(1).lower()} checked exactly).\nVERDICT: {'VALID' if ok else 'INVALID'}\n"


def scripted_caller(
    p_correct: float = 0.8, tokens_per_step: int = 120, verifier_flip: float = 0.0, seed: int = 0, capacity: int = 256
) -> RoleCaller:
    """A ``RoleCaller`` over a ``ScriptedTokenEngine`` playing ``ScriptedPolicy`` (character codec)."""
    from posttrain.rollout.engines.scripted import ScriptedTokenEngine

    codec = char_codec()
    policy = ScriptedPolicy(codec, p_correct, tokens_per_step, verifier_flip, seed)
    engine = ScriptedTokenEngine(policy.script, capacity=capacity)
    caller = RoleCaller(engine, codec, seed=seed)
    caller.policy = policy  # type: ignore[attr-defined]
    return caller
