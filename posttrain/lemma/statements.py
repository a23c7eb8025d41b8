"""The statement language of lemmas, and the sympy procedure that decides it (the formal checker's core).

One statement per line, ``KIND ...: BODY``. Expressions are sympy syntax (``**`` for powers) over single-letter
variables and a fixed set of functions (``Mod gcd lcm factorial binomial floor ceiling divisor_count totient
summation sqrt Abs Max Min``):

==========================================  =====================================================================
``eq: A = B``                               identity: ``A − B`` simplifies to 0 for every value of its variables
``int: A = B``                              integer fact: both sides are closed integer expressions and equal
``int: A divides B`` / ``int: A is prime``  divisibility / primality of closed integer expressions
``solve x: A = B -> {s1, s2}``              the real solution set of ``A = B`` in x is exactly ``{s1, s2}``
``ineq x in [a, b]: A <= B``                holds for every real x in the interval (``<``, ``<=``, ``>``, ``>=``;
                                            ``(``/``)`` open ends, ``oo`` for infinity)
``ineq n in {a..b}: A <= B``                holds for every integer n from a to b
``least t >= a: A >= B -> v``               v is the least integer t ≥ a for which the condition holds
==========================================  =====================================================================

The text comes from a model, so it is untrusted: before sympy sees an expression, its characters and names are
checked against a whitelist (no attributes, strings, underscores or brackets), and powers, factorials and integer
ranges are bounded, so neither code nor a runaway computation gets through ``parse_expr``. Anything that does not
parse is *undecided* (``Decision.ok is None``), which a verifier counts as a failed check.

    python -c "from posttrain.lemma.statements import decide; print(decide('int: Mod(3**5 + 2, 7) = 0'))"
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from posttrain.rl.task import math_equal

FUNCTIONS = tuple(
    "Mod gcd lcm factorial binomial floor ceiling divisor_count totient summation sqrt Abs Max Min oo pi".split()
)
MAX_CHARS = 300
MAX_POW_BITS = 4096
"""A power's result may have at most this many bits (``2**5000`` is refused, ``3**50`` is fine)."""
MAX_FACTORIAL = 500
MAX_RANGE = 5000
"""Integer ranges (``ineq n in {a..b}``, ``least``) are decided by evaluation over at most this many values."""

_NAME = re.compile(r"[A-Za-z_]+")
_ALLOWED_CHARS = re.compile(r"[A-Za-z_0-9+\-*/^().,\s]*")


@dataclass(frozen=True)
class Decision:
    """What the checker concluded about one statement."""

    ok: bool | None
    """True / False when decided; None when the statement did not parse or could not be decided."""
    reason: str = ""


class StatementError(ValueError):
    """The statement is not in the language (or exceeds the size guards)."""


def _check_text(expr: str) -> None:
    if len(expr) > MAX_CHARS:
        raise StatementError(f"expression longer than {MAX_CHARS} characters")
    if not _ALLOWED_CHARS.fullmatch(expr):
        bad = sorted(set(re.sub(r"[A-Za-z_0-9+\-*/^().,\s]", "", expr)))
        raise StatementError(f"characters not allowed: {''.join(bad)!r}")
    if re.search(r"\.(?!\d)|(?<![\d\s(,+\-*/^])\.", expr):
        raise StatementError("'.' only inside decimal numbers")
    for name in _NAME.findall(expr):
        if len(name) > 1 and name not in FUNCTIONS:
            raise StatementError(f"unknown name {name!r} (variables are single letters)")


_BINOPS = ("Add", "Sub", "Mult", "Div", "Pow")


@lru_cache(maxsize=4096)
def parse_expression(text: str) -> Any:
    """A sympy expression built from the text's Python AST by a whitelist (``^`` also means power).

    Nothing is ever ``eval``-ed: only numbers, one-letter variables, ``+ - * / **``, tuples and calls of
    ``FUNCTIONS`` are translated, each size-checked before sympy computes it."""
    import ast

    text = text.strip()
    if not text:
        raise StatementError("empty expression")
    _check_text(text)
    try:
        tree = ast.parse(text.replace("^", "**"), mode="eval")
    except SyntaxError as e:
        raise StatementError(f"does not parse: {e.msg}") from None
    return _build(tree.body)


def _build(node: Any) -> Any:
    import ast

    import sympy

    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return sympy.Integer(node.value) if isinstance(node.value, int) else sympy.Rational(repr(node.value))
    if isinstance(node, ast.Name):
        if node.id == "oo":
            return sympy.oo
        if node.id == "pi":
            return sympy.pi
        if len(node.id) == 1:
            return sympy.Symbol(node.id)
        raise StatementError(f"{node.id!r} is a function, not a value")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _build(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.Tuple):
        return sympy.Tuple(*(_build(e) for e in node.elts))
    if isinstance(node, ast.BinOp) and type(node.op).__name__ in _BINOPS:
        a, b = _build(node.left), _build(node.right)
        op = type(node.op).__name__
        if op == "Pow":
            _check_power(a, b)
            return a**b
        if op == "Div":
            if b == 0:
                raise StatementError("division by zero")
            return a / b
        return a + b if op == "Add" else a - b if op == "Sub" else a * b
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        name = node.func.id
        if name not in FUNCTIONS or name in ("oo", "pi"):
            raise StatementError(f"unknown function {name!r}")
        args = [_build(a) for a in node.args]
        _check_call(name, args)
        return getattr(sympy, name)(*args)
    raise StatementError(f"not in the language: {type(node).__name__}")


def _check_power(base: Any, exp: Any) -> None:
    import math

    if exp.is_Number and abs(exp) > 1:
        mag = abs(float(base)) if base.is_Number else 2.0
        bits = float(abs(exp)) * max(1.0, math.log2(mag) if mag > 0 else 1.0)
        if bits > MAX_POW_BITS:
            raise StatementError("power too large")


def _check_call(name: str, args: list[Any]) -> None:
    if name in ("factorial", "binomial") and any(a.is_Number and abs(a) > MAX_FACTORIAL for a in args):
        raise StatementError(f"{name} argument too large")
    if name == "summation":
        if len(args) != 2 or not hasattr(args[1], "__len__") or len(args[1]) != 3:
            raise StatementError("summation(expr, (i, a, b))")
        _, lo, hi = args[1]
        if not (lo.is_Number and hi.is_Number) or hi - lo > MAX_RANGE:
            raise StatementError("summation needs a numeric range of bounded width")


def _closed_integer(e: Any) -> Any:
    import sympy

    e = sympy.simplify(e)
    if e.free_symbols:
        raise StatementError(f"{e} is not a closed expression")
    if not e.is_integer:
        if e.is_number and e.is_rational is False:
            raise StatementError(f"{e} is not an integer")
        if e.is_number and sympy.nsimplify(e).is_Integer:
            return sympy.Integer(sympy.nsimplify(e))
        raise StatementError(f"{e} is not an integer")
    return e


def _condition(body: str) -> Any:
    """``A op B`` as a sympy relation, ``op`` the first of ``<= >= < >`` that ``body`` holds."""
    import sympy

    for op, relation in (("<=", sympy.Le), (">=", sympy.Ge), ("<", sympy.Lt), (">", sympy.Gt)):
        if op in body:
            lhs, _, rhs = body.partition(op)
            return relation(parse_expression(lhs), parse_expression(rhs))
    raise StatementError("expected one of <, <=, >, >=")


def _one_symbol(name: str) -> Any:
    import sympy

    name = name.strip()
    if not re.fullmatch(r"[A-Za-z]", name):
        raise StatementError(f"variable must be one letter, got {name!r}")
    return sympy.Symbol(name)


_HEAD = re.compile(r"^\s*(eq|int|solve|ineq|least)\b(.*?):\s*(.*)$", re.DOTALL)


@lru_cache(maxsize=8192)
def decide(statement: str) -> Decision:
    """Decide one statement (see the module docstring); never raises."""
    try:
        return Decision(_decide(statement))
    except StatementError as e:
        return Decision(None, str(e))
    except Exception as e:  # noqa: BLE001 -- sympy may raise anything on odd input; undecided, not a crash
        return Decision(None, f"{type(e).__name__}: {e}")


def _decide(statement: str) -> bool:
    import sympy

    m = _HEAD.match(statement.strip())
    if not m:
        raise StatementError("expected 'eq:', 'int:', 'solve x:', 'ineq x in ...:' or 'least t >= a:'")
    kind, head, body = m.group(1), m.group(2).strip(), m.group(3).strip()
    if kind == "eq":
        lhs, sep, rhs = body.partition("=")
        if not sep or "=" in rhs:
            raise StatementError("expected one '='")
        return bool(sympy.simplify(parse_expression(lhs) - parse_expression(rhs)) == 0)
    if kind == "int":
        if m2 := re.fullmatch(r"(.+?)\s+divides\s+(.+)", body):
            a, b = _closed_integer(parse_expression(m2.group(1))), _closed_integer(parse_expression(m2.group(2)))
            if a == 0:
                raise StatementError("0 divides nothing")
            return bool(sympy.Mod(b, a) == 0)
        if m2 := re.fullmatch(r"(.+?)\s+is\s+prime", body):
            return bool(sympy.isprime(_closed_integer(parse_expression(m2.group(1)))))
        lhs, sep, rhs = body.partition("=")
        if not sep or "=" in rhs:
            raise StatementError("expected 'A = B', 'A divides B' or 'A is prime'")
        return bool(_closed_integer(parse_expression(lhs)) == _closed_integer(parse_expression(rhs)))
    if kind == "solve":
        x = _one_symbol(head)
        eqn, sep, sol = body.partition("->")
        lhs, sep2, rhs = eqn.partition("=")
        if not sep or not sep2:
            raise StatementError("expected 'solve x: A = B -> {s1, s2}'")
        sol = sol.strip()
        if not (sol.startswith("{") and sol.endswith("}")):
            raise StatementError("solution set must be written {s1, s2, ...}")
        inner = sol[1:-1].strip()
        claimed = {sympy.simplify(parse_expression(s)) for s in inner.split(",")} if inner else set()
        actual = sympy.solveset(parse_expression(lhs) - parse_expression(rhs), x, domain=sympy.S.Reals)
        if actual == sympy.S.EmptySet:
            return not claimed
        if not isinstance(actual, sympy.FiniteSet):
            raise StatementError(f"solution set {actual} is not finite")
        return sympy.FiniteSet(*claimed) == actual
    if kind == "ineq":
        m2 = re.fullmatch(r"([A-Za-z])\s+in\s+(.+)", head)
        if not m2:
            raise StatementError("expected 'ineq x in [a, b]:' or 'ineq n in {a..b}:'")
        x, rng = _one_symbol(m2.group(1)), m2.group(2).strip()
        cond = _condition(body)
        if m3 := re.fullmatch(r"\{(.+)\.\.(.+)\}", rng):
            lo, hi = (_closed_integer(parse_expression(v)) for v in m3.groups())
            if hi - lo > MAX_RANGE:
                raise StatementError(f"integer range wider than {MAX_RANGE}")
            return all(bool(cond.subs(x, v)) for v in range(int(lo), int(hi) + 1))
        m3 = re.fullmatch(r"([\[(])(.+),(.+)([\])])", rng)
        if not m3:
            raise StatementError("range must be [a, b], (a, b), [a, oo) ... or {a..b}")
        lo, hi = parse_expression(m3.group(2)), parse_expression(m3.group(3))
        interval = sympy.Interval(lo, hi, left_open=m3.group(1) == "(", right_open=m3.group(4) == ")")
        truth = sympy.solve_univariate_inequality(cond, x, relational=False, domain=sympy.S.Reals)
        return bool(interval.is_subset(truth))
    # least t >= a: COND -> v
    m2 = re.fullmatch(r"([A-Za-z])\s*>=\s*(.+)", head)
    cond_text, sep, v_text = body.partition("->")
    if not m2 or not sep:
        raise StatementError("expected 'least t >= a: A >= B -> v'")
    t, lo = _one_symbol(m2.group(1)), _closed_integer(parse_expression(m2.group(2)))
    v = _closed_integer(parse_expression(v_text))
    cond = _condition(cond_text)
    if v < lo or v - lo > MAX_RANGE:
        raise StatementError(f"least value outside [{lo}, {lo} + {MAX_RANGE}]")
    return bool(cond.subs(t, v)) and not any(bool(cond.subs(t, k)) for k in range(int(lo), int(v)))


def answers_match(given: str, reference: str) -> bool:
    """Whether a final answer equals the reference, by ``math-verify`` (LaTeX or plain; ``rl.task.math_equal``).
    Off the main thread math-verify's timeouts are off, so the inputs are bounded by ``MAX_CHARS`` instead."""
    if len(given) > MAX_CHARS or len(reference) > MAX_CHARS:
        return False
    return math_equal(_as_math(given), _as_math(reference))


def _as_math(text: str) -> str:
    text = text.strip()
    return text if "$" in text or "\\" in text else f"${text}$"
