"""The structured text the agent's roles write, and the parser that checks it.

The summariser writes one block per candidate lemma (anything outside the blocks is ignored)::

    LEMMA: int: Mod(4**3 + 2, 7) = 3
    BECAUSE: 4**3 + 2 = 66 = 9*7 + 3
    USES: M2, L1
    END

``LEMMA`` is one statement of the language in ``statements.py``; ``BECAUSE`` a non-empty justification;
``USES`` (optional, ``none`` allowed) the lemmas it rests on: ``M<k>`` = memory entry k, ``L<j>`` = the j-th
block (1-based) of this same summary, which must come earlier. A block whose statement is not in the language,
whose justification is empty, whose ``USES`` names something else, or that lacks ``END``, is rejected with a
reason (the parser never guesses). Whether ``M<k>`` exists is checked by the agent against its memory.

The reasoner (and the reviser) ends with ``ANSWER: <value>`` and optionally ``USES: M3, M5`` on the next line;
the last ``ANSWER`` counts. A verifier ends with ``VERDICT: VALID`` or ``VERDICT: INVALID`` (the last counts;
``REASON:`` optional); anything else is an unparseable judgement, which counts as a failed check.

    python -c "from posttrain.lemma.format import parse_summary; print(parse_summary(open('s.txt').read()))"
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from posttrain.lemma.statements import decide

_REF = re.compile(r"^[ML][1-9]\d*$")


@dataclass(frozen=True)
class Candidate:
    """One parsed lemma block."""

    statement: str
    justification: str
    uses: tuple[str, ...] = ()
    """``M<k>`` memory ids and ``L<j>`` references to earlier blocks of the same summary."""


@dataclass
class Summary:
    """A parsed summariser output: the well-formed candidates and one reason per rejected block."""

    candidates: list[Candidate] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def parse_summary(text: str, max_lemmas: int = 16) -> Summary:
    """Every ``LEMMA … END`` block of ``text``, checked (see the module docstring)."""
    out = Summary()
    lines = [ln.strip() for ln in text.splitlines()]
    i = 0
    while i < len(lines):
        if not lines[i].startswith("LEMMA:"):
            i += 1
            continue
        block = [lines[i]]
        i += 1
        while i < len(lines) and not lines[i].startswith(("END", "LEMMA:")):
            block.append(lines[i])
            i += 1
        closed = i < len(lines) and lines[i].startswith("END")
        if closed:
            i += 1
        n = len(out.candidates) + len(out.errors) + 1
        cand, err = _parse_block(block, closed, n)
        if err:
            out.errors.append(f"block {n}: {err}")
        elif cand is not None:
            if len(out.candidates) >= max_lemmas:
                out.errors.append(f"block {n}: more than {max_lemmas} lemmas in one summary")
            else:
                out.candidates.append(cand)
    return out


def _parse_block(block: list[str], closed: bool, index: int) -> tuple[Candidate | None, str]:
    if not closed:
        return None, "no END line"
    fields: dict[str, str] = {}
    for ln in block:
        key, sep, value = ln.partition(":")
        if not sep or key not in ("LEMMA", "BECAUSE", "USES"):
            if ln:
                return None, f"unexpected line {ln[:40]!r}"
            continue
        if key in fields:
            return None, f"{key} given twice"
        fields[key] = value.strip()
    statement, why = fields.get("LEMMA", ""), fields.get("BECAUSE", "")
    if not why:
        return None, "empty or missing BECAUSE"
    decision = decide(statement)
    if decision.ok is None:
        return None, f"statement not in the language ({decision.reason})"
    raw = fields.get("USES", "none")
    uses: tuple[str, ...] = ()
    if raw.lower() not in ("", "none", "-"):
        uses = tuple(u.strip() for u in raw.split(","))
        bad = [u for u in uses if not _REF.match(u)]
        if bad:
            return None, f"USES must list M<k>/L<j> ids, got {bad}"
        later = [u for u in uses if u.startswith("L") and int(u[1:]) >= index]
        if later:
            return None, f"USES {later} refer to this or a later block"
    return Candidate(statement, why, uses), ""


@dataclass(frozen=True)
class Answer:
    value: str
    uses: tuple[str, ...] = ()


def parse_answer(text: str) -> Answer | None:
    """The last ``ANSWER:`` line (and a ``USES:`` line right after it), or None."""
    lines = [ln.strip() for ln in text.splitlines()]
    found = None
    for k, ln in enumerate(lines):
        if ln.startswith("ANSWER:") and ln[7:].strip():
            uses: tuple[str, ...] = ()
            if k + 1 < len(lines) and lines[k + 1].startswith("USES:"):
                uses = tuple(u.strip() for u in lines[k + 1][5:].split(",") if _REF.match(u.strip()))
            found = Answer(ln[7:].strip(), uses)
    return found


_VERDICT = re.compile(r"VERDICT:\s*(VALID|INVALID)\b")


def parse_verdict(text: str) -> bool | None:
    """True for ``VERDICT: VALID``, False for ``INVALID`` (the last one counts), None when there is none."""
    found = _VERDICT.findall(text)
    return None if not found else found[-1] == "VALID"
