"""``formats.overrides``: the one ``--set key=value`` rule of every area (strings parsed by the field's type)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from formats.overrides import parse_sets, with_overrides


@dataclass(frozen=True)
class Inner:
    lr: float = 1e-3
    size: tuple[int, int] = (4, 4)
    mode: Literal["a", "b"] = "a"


@dataclass(frozen=True)
class Outer:
    steps: int = 10
    flag: bool = False
    name: str = "x"
    path: str | None = None
    out: Path = Path("out")
    inner: Inner = field(default_factory=Inner)


def test_strings_are_parsed_by_the_field_type():
    cfg = with_overrides(
        Outer(),
        parse_sets(
            [
                "steps=7",
                "flag=yes",
                "name=none",  # a plain str field keeps the word
                "path=none",
                "out=/tmp/o",
                "inner.lr=3",
                "inner.size=(8, 2)",
                "inner.mode=b",
            ]
        ),
    )
    assert cfg == Outer(7, True, "none", None, Path("/tmp/o"), Inner(3.0, (8, 2), "b"))
    assert isinstance(cfg.inner.lr, float)
    assert with_overrides(cfg, {"path": "a/b", "inner.size": "[1, 2]"}).inner.size == (1, 2)


def test_typed_values_are_checked_and_ints_promote_to_float():
    cfg = with_overrides(Outer(), {"inner.lr": 2, "steps": 3, "flag": True})
    assert cfg.inner.lr == 2.0 and isinstance(cfg.inner.lr, float) and cfg.steps == 3
    with pytest.raises(TypeError, match="steps"):
        with_overrides(Outer(), {"steps": 1.5})
    with pytest.raises(TypeError, match="section"):
        with_overrides(Outer(), {"inner": "3"})


@pytest.mark.parametrize(
    "item, error, text",
    [
        ("nope=1", KeyError, "Outer has no field 'nope'"),
        ("inner.nope=1", KeyError, "Inner has no field 'nope'"),
        ("steps.x=1", KeyError, "not inside a config section"),
        ("steps=abc", ValueError, "steps"),
        ("flag=maybe", ValueError, "not a boolean"),
        ("inner.mode=c", ValueError, "not one of"),
        ("inner.size=big", TypeError, "expected a tuple"),
    ],
)
def test_bad_keys_and_values_are_errors_not_strings(item, error, text):
    with pytest.raises(error, match=text):
        with_overrides(Outer(), parse_sets([item]))


def test_parse_sets_wants_key_value():
    assert parse_sets(["a.b=1=2", "c="]) == {"a.b": "1=2", "c": ""}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_sets(["novalue"])
