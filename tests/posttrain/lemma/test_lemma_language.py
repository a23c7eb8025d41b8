"""The statement language, the role formats and the verifiers of the lemma agent.

Run: python -m pytest tests/posttrain/lemma/test_lemma_language.py -q
"""

from __future__ import annotations

import pytest

from posttrain.lemma.format import parse_answer, parse_summary, parse_verdict
from posttrain.lemma.statements import answers_match, decide
from posttrain.lemma.verifiers import CheckItem, FormalVerifier, ModelVerifier, NoisyVerifier, false_positive_rate


@pytest.mark.parametrize(
    ("statement", "truth"),
    [
        ("eq: (x+1)**2 = x**2 + 2*x + 1", True),
        ("eq: (x+1)**2 = x**2 + 1", False),
        ("eq: 2^10 = 1024", True),
        ("int: Mod(3**5 + 2, 7) = 0", True),
        ("int: Mod(3**5 + 2, 7) = 1", False),
        ("int: gcd(36, 84) = 12", True),
        ("int: divisor_count(12) = 6", True),
        ("int: summation(i, (i, 1, 10)) = 55", True),
        ("int: 7 divides 84", True),
        ("int: 5 divides 84", False),
        ("int: 97 is prime", True),
        ("int: 91 is prime", False),
        ("solve x: x**2 - 5*x + 6 = 0 -> {2, 3}", True),
        ("solve x: x**2 - 5*x + 6 = 0 -> {2}", False),
        ("solve x: x**2 = -1 -> {}", True),
        ("ineq x in [0, 3]: x**2 <= 9", True),
        ("ineq x in [0, 4]: x**2 <= 9", False),
        ("ineq x in (0, 1): x**2 < x", True),
        ("ineq x in [0, 1]: x**2 < x", False),
        ("ineq x in [1, oo): x**2 >= x", True),
        ("ineq n in {1..10}: 2**n >= n**2", False),
        ("least t >= 1: t**2 >= 50 -> 8", True),
        ("least t >= 1: t**2 >= 50 -> 9", False),
    ],
)
def test_decide_the_language(statement: str, truth: bool) -> None:
    assert decide(statement).ok is truth


@pytest.mark.parametrize(
    "statement",
    [
        "int: __import__('os') = 1",  # no names outside the whitelist, no strings
        "int: x.real = 1",  # no attributes
        "int: (lambda: 1)() = 1",
        "int: 2**2**2**2**2 = 1",  # power towers refused before sympy computes them
        "int: factorial(1000) = 1",
        "int: 7/2 = 3",  # not an integer
        "int: x = x",  # not closed
        "eq: sin(x) = 0",  # unknown function
        "theorem: 1 = 1",  # unknown kind
    ],
)
def test_untrusted_text_is_undecided_never_run(statement: str) -> None:
    d = decide(statement)
    assert d.ok is None and d.reason


def test_answers_by_math_verify() -> None:
    assert answers_match("42", "42") and not answers_match("41", "42")
    assert answers_match("\\frac{1}{2}", "0.5")


def test_summary_parser_checks_every_block() -> None:
    text = """noise before
LEMMA: int: Mod(4**3 + 2, 7) = 3
BECAUSE: 66 = 9*7 + 3
USES: M2
END
LEMMA: int: gcd(3 + 30, 84) = 3
BECAUSE: 33 = 3*11
USES: L1, M1
END
LEMMA: int: gcd(3 + 30, 84) = 3
BECAUSE:
END
LEMMA: frobnicate 3
BECAUSE: trust me
END
LEMMA: eq: 1 = 1
BECAUSE: x
USES: L9
END
LEMMA: eq: 2 = 2
BECAUSE: x
USES: foo
END
LEMMA: eq: 3 = 3
BECAUSE: no end line
"""
    s = parse_summary(text)
    assert [c.statement for c in s.candidates] == ["int: Mod(4**3 + 2, 7) = 3", "int: gcd(3 + 30, 84) = 3"]
    assert s.candidates[1].uses == ("L1", "M1") and s.candidates[0].justification == "66 = 9*7 + 3"
    assert len(s.errors) == 5
    joined = " ".join(s.errors)
    for reason in ("BECAUSE", "not in the language", "this or a later block", "M<k>/L<j>", "no END"):
        assert reason in joined


def test_answer_and_verdict_parsers() -> None:
    assert parse_answer("x\nANSWER: 3\nANSWER: 7\nUSES: M4, L2\n").value == "7"
    assert parse_answer("ANSWER: 7\nUSES: M4, L2").uses == ("M4", "L2")
    assert parse_answer("no answer here") is None
    assert parse_verdict("VERDICT: INVALID\nthinking again\nVERDICT: VALID") is True
    assert parse_verdict("REASON: x\nVERDICT: INVALID") is False
    assert parse_verdict("looks fine to me") is None


def test_formal_verifier_is_all_or_nothing() -> None:
    items = [CheckItem("lemma", "int: 7 divides 84"), CheckItem("lemma", "int: 5 divides 84")]
    items.append(CheckItem("answer", "12", {"answer": "12"}))
    items.append(CheckItem("answer", "13", {"answer": "12"}))
    assert [v.k for v in FormalVerifier().check(items, 4)] == [4, 0, 4, 0]


def test_noisy_verifier_has_the_stated_precision_and_recall() -> None:
    v = NoisyVerifier(precision=0.931, recall=0.818, base_rate=0.5, seed=3)
    assert v.fpr == pytest.approx(0.818 * 0.069 / 0.931)
    n_items = 1500
    items = [CheckItem("lemma", "int: 7 divides 84", key=f"t{i}") for i in range(n_items)]
    items += [CheckItem("lemma", "int: 5 divides 84", key=f"f{i}") for i in range(n_items)]
    verdicts = v.check(items, 4)
    tp = sum(x.k for x in verdicts[:n_items])
    fp = sum(x.k for x in verdicts[n_items:])
    assert tp / (4 * n_items) == pytest.approx(0.818, abs=0.015)  # recall per check
    assert tp / (tp + fp) == pytest.approx(0.931, abs=0.01)  # precision at base rate 1/2
    again = NoisyVerifier(precision=0.931, recall=0.818, base_rate=0.5, seed=3).check(items[:10], 4)
    assert [x.passes for x in again] == [x.passes for x in verdicts[:10]]  # reproducible
    with pytest.raises(ValueError):
        false_positive_rate(0.1, 1.0, 0.9)


def test_model_verifier_parses_judgements_through_the_engine() -> None:
    from posttrain.lemma.scripted import scripted_caller

    caller = scripted_caller(seed=1)
    mv = ModelVerifier(caller)
    row = {"id": "p", "prompt": "Let x0 = 4. Let x1 = gcd(x0 + 8, 36). Find x1.", "answer": "12"}
    items = [
        CheckItem("lemma", "int: gcd(4 + 8, 36) = 12", row, key="a"),
        CheckItem("lemma", "int: gcd(4 + 8, 36) = 6", row, key="b"),
        CheckItem("answer", "12", row, key="c"),
        CheckItem("answer", "11", row, key="d"),
    ]
    verdicts = mv.check(items, 4)
    assert [v.k for v in verdicts] == [4, 0, 4, 0]
    assert verdicts[1].reasons[0].startswith("invalid: the claim does not hold")  # REASON lines reach the feedback
    assert len(caller.calls) == 16 and all(c.role == "verifier" and c.logprobs for c in caller.calls)
    # a reply without a VERDICT line is a failed check
    caller.policy.verify = lambda prompt, request: "hmm\n"
    assert mv.check(items[:1], 4)[0].passes == [False] * 4


def test_decide_never_raises_or_runs_away_on_garbage() -> None:
    """Model text is arbitrary: every string is decided or refused quickly, never an exception."""
    import time

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    pieces = [*"0123456789+-*/^().,xyt =<>{}[]", "**", "Mod(", "gcd(", "factorial(", "summation(", "oo", "->"]
    pieces += [
        "eq: ",
        "int: ",
        "solve x: ",
        "ineq x in [0, 3]: ",
        "least t >= 1: ",
        " divides ",
        " is prime",
        "__",
        "'",
    ]

    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(st.lists(st.sampled_from(pieces), max_size=25).map("".join))
    def check(text: str) -> None:
        t0 = time.perf_counter()
        assert decide(text).ok in (True, False, None)
        assert time.perf_counter() - t0 < 5

    check()
