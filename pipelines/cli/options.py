"""Shared CLI plumbing (not a subcommand): flag defaults read from the config dataclasses, and the
``--set key=value`` override every subcommand with a config accepts.

    scifolio build pdfs/ --out out --set parse.page_window=32 --set docs_per_shard=64
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Mapping, Sequence
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


def add_recipe_args(
    p: argparse.ArgumentParser,
    recipes: str,
    out: str,
    example: str,
    resume: str = "continue from DIR/checkpoint after a crash / kill -9",
    progress: bool = True,
) -> None:
    """The flags of every recipe subcommand, declared once: ``--config`` (``recipes`` names them), ``--out``,
    ``--resume``, ``--set`` (``example``), ``--print-config`` and, with ``progress``, ``--no-progress``."""
    p.add_argument("--config", default="debug", help=f"recipe name ({recipes})")
    p.add_argument("--out", required=True, help=out)
    p.add_argument("--resume", action="store_true", help=resume)
    add_set(p, example)
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit (loads no model)")
    if progress:
        p.add_argument("--no-progress", action="store_true", help="no progress bar")


def apply_sets(cfg: Any, sets: Sequence[str]) -> Any:
    """``cfg`` with every ``key=value`` applied by ``formats.overrides`` (the one rule of every area: values are
    parsed by the field's type). A bad key or value exits with status 2 and says which."""
    try:
        return with_overrides(cfg, parse_sets(sets))
    except (KeyError, ValueError, TypeError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"error: --set {msg}", file=sys.stderr)
        raise SystemExit(2) from None


def recipe_config(
    recipes: Mapping[str, Callable[..., Any]],
    args: argparse.Namespace,
    sets: Sequence[str] | None = None,
    given: Mapping[str, Any] | None = None,
    finish: Callable[[Any], Any] | None = None,
    refused: tuple[type[Exception], ...] = (),
    to_dict: Callable[[Any], Any] = dataclasses.asdict,
) -> Any | None:
    """The config of recipe ``args.config`` built with ``given`` keyword arguments, ``--set`` applied (``sets``,
    default ``args.set``) and then ``finish`` (e.g. the engine resolution). An unknown recipe or a ``refused``
    error exits with status 2 and says why. With ``args.print_config`` it prints the config as json and returns
    None: the caller then stops with status 0."""
    if args.config not in recipes:
        print(f"error: unknown config {args.config!r} (choose from {', '.join(recipes)})", file=sys.stderr)
        raise SystemExit(2)
    cfg = apply_sets(recipes[args.config](**(given or {})), args.set if sets is None else sets)
    try:
        cfg = finish(cfg) if finish is not None else cfg
    except refused as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if getattr(args, "print_config", False):
        print(json.dumps(to_dict(cfg), indent=2, default=str))
        return None
    return cfg
