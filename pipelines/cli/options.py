"""Shared CLI plumbing (not a subcommand): flag defaults read from the config dataclasses, and the
``--set key=value`` override every subcommand with a config accepts.

    scifolio build pdfs/ --out out --set parse.page_window=32 --set docs_per_shard=64
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import sys
import typing
from collections.abc import Sequence
from typing import Any


def default(cls: type, name: str) -> Any:
    """The default of field ``name`` of dataclass ``cls`` (one source of truth for a flag's default)."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
            raise ValueError(f"{cls.__name__}.{name} has no default")
    raise AttributeError(f"{cls.__name__} has no field {name!r}")


def add_set(p: argparse.ArgumentParser, example: str) -> None:
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override any config field, dotted for nested ones (e.g. {example}); repeatable; applied after the flags",
    )


def _coerce(raw: str) -> Any:
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw  # a bare word: a string


def _set_path(cfg: Any, path: Sequence[str], value: Any, full: str) -> Any:
    if not dataclasses.is_dataclass(cfg):
        raise ValueError(f"--set {full}: {'.'.join(path)} is not inside a config section")
    names = {f.name: f for f in dataclasses.fields(cfg)}
    head = path[0]
    if head not in names:
        raise ValueError(f"--set {full}: {type(cfg).__name__} has no field {head!r} (fields: {', '.join(names)})")
    if len(path) == 1:
        hint = typing.get_type_hints(type(cfg)).get(head)
        if hint is float and isinstance(value, int):
            value = float(value)
        return dataclasses.replace(cfg, **{head: value})
    return dataclasses.replace(cfg, **{head: _set_path(getattr(cfg, head), path[1:], value, full)})


def apply_sets(cfg: Any, sets: Sequence[str]) -> Any:
    """``cfg`` with every ``key=value`` applied (values are Python literals, else strings). A bad key or value
    exits with status 2 and says which."""
    try:
        for item in sets:
            key, sep, raw = item.partition("=")
            if not sep or not key:
                raise ValueError(f"--set {item}: expected KEY=VALUE")
            cfg = _set_path(cfg, key.split("."), _coerce(raw), item)
    except (ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    return cfg
