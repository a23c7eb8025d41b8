"""The lemma-memory agent (SPEC §D, Intern-S1-MO): reasoning rounds over a verified lemma memory, then revisions.

Per problem, at most ``max_rounds`` reasoning rounds, each:

1. **reasoner** explores with the lemma memory in its prompt (``[M3] accepted 4/4: …``);
2. **summariser** compresses the round into ``LEMMA … END`` blocks (``format.py`` checks them) and repeats the
   reasoner's ``ANSWER`` if it gave one, with ``USES`` naming the lemmas it rests on;
3. **verifier** runs ``n_checks`` parallel checks per new lemma; confidence = fraction passing; accepted when
   confidence > ``accept_threshold`` (strict: 1 of 4 is not enough), else kept as "uncertain".

A statement already accepted in memory is not new (dropped); re-proposing an uncertain one re-verifies it as a
new entry that supersedes the old. ``USES`` ids are checked against the memory; unknown ones are dropped from
the graph and reported. Reasoning stops for a problem once it has an answer whose support (every lemma it rests
on, transitively) is accepted; an answer resting on an uncertain lemma is kept, and reasoning goes on so the next
round can re-derive what failed (it becomes the pending answer if the rounds run out). Then at most ``max_revisions``
revision rounds: the pending answer is verified (n checks); accepted → final; otherwise the **reviser** gets the
memory plus the verifier's feedback on every rejected answer and proposes a new one. A problem whose answers
were all rejected ends with its last one.

Every step is batched across problems (all reasoner prompts of a round in one engine pass, all summaries in one,
all lemmas × checks in one), and every engine call is recorded in the trace with its tokens and logprobs.
``credit.py`` turns a trace into lemma values, round values and the round mask.

    from posttrain.lemma.agent import AgentConfig, LemmaAgent
    traces = LemmaAgent(caller, FormalVerifier(), AgentConfig()).solve(rows)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from posttrain.lemma.format import Answer, parse_answer, parse_summary
from posttrain.lemma.roles import Call, RoleCaller, RolePrompt
from posttrain.lemma.verifiers import CheckItem, LemmaVerifier


@dataclass(frozen=True)
class AgentConfig:
    max_rounds: int = 8
    """Reasoning rounds per problem (SPEC §D: 8)."""
    max_revisions: int = 8
    """Final revision rounds guided by verifier feedback (SPEC §D: 8)."""
    n_checks: int = 4
    """Parallel verifier checks per lemma and per answer."""
    accept_threshold: float = 0.25
    """Accepted iff the fraction of passing checks is strictly above this."""
    reasoner_tokens: int = 256
    summariser_tokens: int = 256
    reviser_tokens: int = 64
    show_memory: bool = True
    """Put the lemma memory in the prompts (off: an ablation with the same rounds but no memory)."""


@dataclass
class MemoryEntry:
    id: str
    statement: str
    justification: str
    round: int
    uses: list[str]
    """Dependencies checked against the memory (edges of the graph)."""
    unknown_uses: list[str] = field(default_factory=list)
    passes: list[bool] = field(default_factory=list)
    status: str = "uncertain"
    """``accepted`` or ``uncertain``."""
    superseded_by: str | None = None

    @property
    def confidence(self) -> float:
        return sum(self.passes) / len(self.passes) if self.passes else 0.0


@dataclass
class AnswerRecord:
    id: str
    """``A<round>``: a node of the lemma graph (the terminal one when final)."""
    value: str
    round: int
    uses: list[str]
    passes: list[bool] = field(default_factory=list)
    accepted: bool = False


@dataclass
class RoundRecord:
    index: int
    phase: str
    """``reason`` or ``revise``."""
    call_ids: list[str] = field(default_factory=list)
    new_lemmas: list[str] = field(default_factory=list)
    answer: str | None = None
    """Id of the answer proposed (reasoning) or verified (revision) in this round."""
    parse_errors: list[str] = field(default_factory=list)
    dropped_duplicates: int = 0


@dataclass
class Trace:
    """Everything one problem's run produced (JSON-safe through ``to_dict``)."""

    problem: dict[str, Any]
    memory: list[MemoryEntry] = field(default_factory=list)
    answers: list[AnswerRecord] = field(default_factory=list)
    rounds: list[RoundRecord] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    final: str | None = None
    """Id of the final answer record."""
    feedback: list[str] = field(default_factory=list)
    n_checks: int = 4

    @property
    def problem_id(self) -> str:
        return str(self.problem.get("id", ""))

    def final_answer(self) -> AnswerRecord | None:
        return next((a for a in self.answers if a.id == self.final), None)

    def policy_tokens(self) -> int:
        """Tokens the policy generated for this problem (reasoner + summariser + reviser), the budget currency."""
        return sum(len(c.token_ids) for c in self.calls if c.role != "verifier")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["problem"] = {k: self.problem[k] for k in ("id", "prompt", "answer") if k in self.problem}
        return d


def _new_round(t: Trace, phase: str) -> RoundRecord:
    t.rounds.append(RoundRecord(len(t.rounds), phase))
    return t.rounds[-1]


class LemmaAgent:
    def __init__(self, policy: RoleCaller, verifier: LemmaVerifier, cfg: AgentConfig | None = None) -> None:
        self.policy = policy
        self.verifier = verifier
        self.cfg = cfg or AgentConfig()

    # -- prompts ----------------------------------------------------------------------------------------
    def memory_text(self, t: Trace) -> str:
        if not self.cfg.show_memory:
            return "(none)"
        live = [m for m in t.memory if m.superseded_by is None]
        if not live:
            return "(empty)"
        return "\n".join(f"[{m.id}] {m.status} {sum(m.passes)}/{len(m.passes)}: {m.statement}" for m in live)

    def _ask(self, role: str, ts: list[Trace], recs: list[RoundRecord], tokens: int, extra: list[str]) -> list[Call]:
        """One batched pass of ``role``: each prompt is PROBLEM, MEMORY, then the role's own section (``extra``:
        nothing for the reasoner, ``ROUND:`` for the summariser, ``FEEDBACK:`` for the reviser)."""
        texts = [f"PROBLEM: {t.problem['prompt']}\nMEMORY:\n{self.memory_text(t)}\n{x}" for t, x in zip(ts, extra)]
        return self.policy.generate(
            [RolePrompt(role, x, t.problem_id, r.index, tokens) for t, r, x in zip(ts, recs, texts)]
        )

    def _item(self, t: Trace, kind: str, text: str, justification: str, key: str, rec: RoundRecord) -> CheckItem:
        """What the verifier checks for ``t`` (a lemma or an answer), the memory as its context, keyed ``id/key``."""
        return CheckItem(kind, text, t.problem, justification, self.memory_text(t), f"{t.problem_id}/{key}", rec.index)

    # -- the rounds -------------------------------------------------------------------------------------
    def solve(self, rows: Sequence[dict[str, Any]]) -> list[Trace]:
        cfg = self.cfg
        traces = [Trace(dict(r), n_checks=cfg.n_checks) for r in rows]
        if len({t.problem_id for t in traces}) != len(traces):
            raise ValueError("problem ids must be unique within a batch")
        vcaller = getattr(self.verifier, "caller", None)  # a model verifier's calls join the traces too
        v_start = len(vcaller.calls) if vcaller is not None else 0
        pending: dict[int, AnswerRecord] = {}
        unsupported: dict[int, AnswerRecord] = {}
        for _ in range(cfg.max_rounds):
            active = [i for i, t in enumerate(traces) if i not in pending]
            if not active:
                break
            self._reasoning_round([traces[i] for i in active], pending, active, unsupported)
        for i, a in unsupported.items():
            pending.setdefault(i, a)
        done: set[int] = set()
        for _ in range(cfg.max_revisions):
            need = [i for i in range(len(traces)) if i not in done]
            if not need:
                break
            self._revision_round(traces, need, pending, done)
        for t in traces:
            if t.final is None and t.answers:
                t.final = t.answers[-1].id  # every answer rejected: the last one stands
        if vcaller is not None:
            by_id = {t.problem_id: t for t in traces}
            for c in vcaller.calls[v_start:]:
                t = by_id.get(c.problem_id)
                if c.role == "verifier" and t is not None:
                    t.calls.append(c)
                    t.rounds[c.round].call_ids.append(c.call_id)
        return traces

    def _reasoning_round(
        self, ts: list[Trace], pending: dict[int, AnswerRecord], idx: list[int], unsupported: dict[int, AnswerRecord]
    ) -> None:
        cfg = self.cfg
        recs = [_new_round(t, "reason") for t in ts]
        reason = self._ask("reasoner", ts, recs, cfg.reasoner_tokens, [""] * len(ts))
        summ = self._ask("summariser", ts, recs, cfg.summariser_tokens, [f"ROUND:\n{c.text}\n" for c in reason])
        items: list[CheckItem] = []
        owners: list[MemoryEntry] = []
        local: list[dict[str, str]] = []
        for t, rec, c_r, c_s in zip(ts, recs, reason, summ):
            t.calls += [c_r, c_s]
            rec.call_ids += [c_r.call_id, c_s.call_id]
            new, refs = self._admit(t, rec, c_s.text)
            local.append(refs)
            for m in new:
                items.append(self._item(t, "lemma", m.statement, m.justification, m.statement, rec))
                owners.append(m)
        for m, v in zip(owners, self.verifier.check(items, cfg.n_checks)):
            m.passes = list(v.passes)
            m.status = "accepted" if m.confidence > cfg.accept_threshold else "uncertain"
        for i, t, rec, c_r, c_s, refs in zip(idx, ts, recs, reason, summ, local):
            ans = parse_answer(c_s.text) or parse_answer(c_r.text)
            if ans is not None:
                a = self._answer(t, rec, ans, refs)
                if self.supported(t, a.uses):
                    pending[i] = a
                    unsupported.pop(i, None)
                else:
                    unsupported[i] = a

    def _admit(self, t: Trace, rec: RoundRecord, text: str) -> tuple[list[MemoryEntry], dict[str, str]]:
        """Parse a summary into new memory entries (ids ``M<k>``), resolving ``USES`` against the memory; also
        returns the map from the summary's block ids ``L<j>`` to memory ids."""
        summary = parse_summary(text)
        rec.parse_errors += summary.errors
        live = {m.statement: m for m in t.memory if m.superseded_by is None}
        local: dict[str, str] = {}
        new: list[MemoryEntry] = []
        for j, c in enumerate(summary.candidates, start=1):
            old = live.get(c.statement)
            if old is not None and (old.status == "accepted" or old.round == rec.index):
                rec.dropped_duplicates += 1
                local[f"L{j}"] = old.id
                continue
            mid = f"M{len(t.memory) + 1}"
            uses, unknown = self._resolve(t, c.uses, local)
            m = MemoryEntry(mid, c.statement, c.justification, rec.index, uses, unknown)
            if old is not None:
                old.superseded_by = mid
            t.memory.append(m)
            live[c.statement] = m
            local[f"L{j}"] = mid
            rec.new_lemmas.append(mid)
            new.append(m)
        return new, local

    def _resolve(self, t: Trace, refs: Sequence[str], local: dict[str, str]) -> tuple[list[str], list[str]]:
        known = {m.id for m in t.memory}
        uses, unknown = [], []
        for u in refs:
            target = local.get(u) if u.startswith("L") else (u if u in known else None)
            (uses if target is not None else unknown).append(target if target is not None else u)
        return list(dict.fromkeys(uses)), unknown

    @staticmethod
    def supported(t: Trace, uses: Sequence[str]) -> bool:
        """Every lemma reachable backwards from ``uses`` is accepted."""
        by_id = {m.id: m for m in t.memory}
        stack, seen = list(uses), set()
        while stack:
            u = stack.pop()
            if u in seen:
                continue
            seen.add(u)
            m = by_id.get(u)
            if m is None or m.status != "accepted":
                return False
            stack.extend(m.uses)
        return True

    def _answer(self, t: Trace, rec: RoundRecord, ans: Answer, local: dict[str, str]) -> AnswerRecord:
        uses, _ = self._resolve(t, ans.uses, local)
        a = AnswerRecord(f"A{rec.index}", ans.value, rec.index, uses)
        t.answers.append(a)
        rec.answer = a.id
        return a

    def _revision_round(
        self, traces: list[Trace], need: list[int], pending: dict[int, AnswerRecord], done: set[int]
    ) -> None:
        cfg = self.cfg
        recs = {i: _new_round(traces[i], "revise") for i in need}
        ask = [i for i in need if i not in pending]
        fb = ["FEEDBACK:\n" + ("\n".join(traces[i].feedback) if traces[i].feedback else "(none)") + "\n" for i in ask]
        calls = self._ask("reviser", [traces[i] for i in ask], [recs[i] for i in ask], cfg.reviser_tokens, fb)
        for i, c in zip(ask, calls):
            traces[i].calls.append(c)
            recs[i].call_ids.append(c.call_id)
            ans = parse_answer(c.text)
            if ans is not None:
                pending[i] = self._answer(traces[i], recs[i], ans, {})
            else:
                traces[i].feedback.append(f"round {recs[i].index}: no parseable ANSWER line")
        check = [i for i in need if i in pending]
        items = [self._item(traces[i], "answer", pending[i].value, "", "answer", recs[i]) for i in check]
        for i, v in zip(check, self.verifier.check(items, cfg.n_checks)):
            a = pending.pop(i)
            a.passes = list(v.passes)
            recs[i].answer = recs[i].answer or a.id
            if sum(a.passes) / len(a.passes) > cfg.accept_threshold:
                a.accepted = True
                traces[i].final = a.id
                done.add(i)
            else:
                why = "; ".join(dict.fromkeys(r for r, ok in zip(v.reasons, v.passes) if not ok))
                traces[i].feedback.append(
                    f"answer {a.value} rejected: {sum(a.passes)}/{len(a.passes)} checks passed ({why or 'no reason given'})"
                )
