"""One rule for overriding a config dataclass from the command line (``--set key=value``), for every area.

Every subcommand with a config (build, parse, index, review, pretrain, posttrain rl/distill/agentic, memdec)
and every recipe function (``debug(**overrides)``) goes through ``with_overrides``, so a key and a value mean
the same thing everywhere:

- a dotted key reaches nested dataclasses (``learner.clip.eps_high``); an unknown key, or a key that goes
  through a field that is not a section, is an error naming the fields there;
- a string value is parsed by the field's type: ``none``/``null`` for an optional field, ``true/false/yes/no/1/0``
  for a bool, ``int``/``float``/``str`` as such, anything else (tuples, lists, dicts, literals) as a Python
  literal; a value that does not fit the type is an error, never stored as a string;
- a typed value (from a flag or a recipe keyword) is checked against the field's type; an int is promoted for
  a float field.

    from formats.overrides import parse_sets, with_overrides
    cfg = with_overrides(debug(), parse_sets(["steps=10", "scheduler.partial=false"]))
"""

from __future__ import annotations

import ast
import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")


def parse_sets(items: Iterable[str]) -> dict[str, str]:
    """``["a.b=1", "c=x"]`` → ``{"a.b": "1", "c": "x"}`` (values stay strings; ``with_overrides`` types them)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set {item}: expected KEY=VALUE")
        out[key.strip()] = raw
    return out


def with_overrides(cfg: Any, overrides: Mapping[str, Any]) -> Any:
    """A copy of dataclass ``cfg`` with every ``dotted.key: value`` applied (see the module docstring).

    An optional section that is ``None`` (``learner.shaping.gepo``) is created by the keys under it, which must
    together name every field without a default; a partial section is an error naming the missing fields.
    Raises ``KeyError`` for an unknown key and ``ValueError``/``TypeError`` for a value that does not fit."""
    pending = dict(overrides)
    while pending:
        key, value = next(iter(pending.items()))
        del pending[key]
        cfg = _set(cfg, key.split("."), value, key, pending, "")
    return cfg


def _set(cfg: Any, path: list[str], value: Any, key: str, pending: dict[str, Any], prefix: str) -> Any:
    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise KeyError(f"{key}: {'.'.join(path)} is not inside a config section")
    names = [f.name for f in dataclasses.fields(cfg)]
    head = path[0]
    if head not in names:
        raise KeyError(f"{key}: {type(cfg).__name__} has no field {head!r} (fields: {', '.join(names)})")
    hint = typing.get_type_hints(type(cfg))[head]
    if len(path) > 1:
        sub = getattr(cfg, head)
        if sub is None:
            sub = _create_section(hint, path[1:], value, key, pending, prefix + head + ".")
            return dataclasses.replace(cfg, **{head: sub})
        return dataclasses.replace(cfg, **{head: _set(sub, path[1:], value, key, pending, prefix + head + ".")})
    if isinstance(hint, type) and dataclasses.is_dataclass(hint) and not isinstance(value, hint):
        first = dataclasses.fields(hint)[0].name  # a section's main field (policy.path, engine.kind)
        raise TypeError(f"{key}: is a section ({hint.__name__}); set its fields, e.g. {key}.{first}={value}")
    try:
        new = coerce(value, hint)
    except (ValueError, TypeError, SyntaxError) as e:
        raise type(e)(f"{key}: {e}") from None
    return dataclasses.replace(cfg, **{head: new})


def _create_section(hint: Any, path: list[str], value: Any, key: str, pending: dict[str, Any], prefix: str) -> Any:
    """Build an optional section that is None from every pending key under ``prefix`` (consumed here)."""
    classes = [a for a in typing.get_args(hint) if isinstance(a, type) and dataclasses.is_dataclass(a)]
    if not classes:
        raise KeyError(f"{key}: {prefix.rstrip('.')} is None and not an optional config section")
    cls = classes[0]
    sub = {".".join(path): value}
    for k in [k for k in pending if k.startswith(prefix)]:
        sub[k[len(prefix) :]] = pending.pop(k)
    required = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    top = {k: v for k, v in sub.items() if "." not in k}
    missing = [n for n in required if n not in top]
    if missing:
        raise ValueError(
            f"{key}: {prefix.rstrip('.')} is not set; creating it needs every required field "
            f"(missing: {', '.join(prefix + n for n in missing)})"
        )
    hints = typing.get_type_hints(cls)
    try:
        section = cls(**{n: coerce(top.pop(n), hints[n]) for n in required})
    except (ValueError, TypeError, SyntaxError) as e:
        raise type(e)(f"{prefix.rstrip('.')}: {e}") from None
    rest = {k: v for k, v in sub.items() if k not in required}
    return with_overrides(section, rest)


def coerce(value: Any, hint: Any) -> Any:
    """``value`` as a value of type ``hint`` (a string is parsed; a typed value is checked)."""
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        args = typing.get_args(hint)
        if type(None) in args:
            if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null")):
                return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return coerce(value, arg)
            except (ValueError, TypeError, SyntaxError) as e:
                errors.append(str(e))
        raise ValueError(f"{value!r} fits none of {hint} ({'; '.join(errors)})")
    if hint is Any:
        return _literal(value) if isinstance(value, str) else value
    if origin is typing.Literal:
        choices = typing.get_args(hint)
        got = value if value in choices else (_literal(value) if isinstance(value, str) else value)
        if got not in choices:
            raise ValueError(f"{value!r} is not one of {choices}")
        return got
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        raise ValueError(f"not a boolean: {value!r}")
    if hint is int:
        if isinstance(value, str):
            return int(value.strip())
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise TypeError(f"expected an int, got {value!r}")
    if hint is float:
        if isinstance(value, str):
            return float(value.strip())
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise TypeError(f"expected a number, got {value!r}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise TypeError(f"expected a string, got {value!r}")
    if origin in (tuple, list, dict, set, frozenset) or hint in (tuple, list, dict, set, frozenset):
        kind = origin or hint
        got = _literal(value) if isinstance(value, str) else value
        if kind in (tuple, frozenset, set) and isinstance(got, (list, tuple)):
            got = kind(got)
        if not isinstance(got, kind):
            raise TypeError(f"expected a {kind.__name__}, got {value!r}")
        return got
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        raise TypeError(f"is a section ({hint.__name__}); set its fields with a dotted key")
    if isinstance(hint, type):  # e.g. Path: built from its string form
        return value if isinstance(value, hint) else hint(value)
    return _literal(value) if isinstance(value, str) else value


def _literal(raw: str) -> Any:
    try:
        return ast.literal_eval(raw.strip())
    except (ValueError, SyntaxError):
        return raw  # a bare word: a string
