"""Shared CLI plumbing (not a subcommand): flag defaults read from the config dataclasses, and the
``--set key=value`` override every subcommand with a config accepts.

    scifolio build pdfs/ --out out --set parse.page_window=32 --set docs_per_shard=64
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

from formats.overrides import parse_sets, with_overrides


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


def apply_sets(cfg: Any, sets: Sequence[str]) -> Any:
    """``cfg`` with every ``key=value`` applied by ``formats.overrides`` (the one rule of every area: values are
    parsed by the field's type). A bad key or value exits with status 2 and says which."""
    try:
        return with_overrides(cfg, parse_sets(sets))
    except (KeyError, ValueError, TypeError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"error: --set {msg}", file=sys.stderr)
        raise SystemExit(2) from None
