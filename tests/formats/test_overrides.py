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


def test_an_optional_section_is_created_by_its_keys_and_a_partial_one_names_what_is_missing():
    from posttrain.rl.recipes import debug

    keys = {f"learner.shaping.gepo.{k}": v for k, v in dict(h_low="0.5", h_high="6", c_low="0.25", c_high="2").items()}
    cfg = with_overrides(debug(), {**keys, "steps": "3"})
    g = cfg.learner.shaping.gepo
    assert (g.h_low, g.h_high, g.c_low, g.c_high, cfg.steps) == (0.5, 6.0, 0.25, 2.0, 3)
    with pytest.raises(ValueError, match=r"missing: learner.shaping.gepo.h_high, learner.shaping.gepo.c_low"):
        with_overrides(debug(), {"learner.shaping.gepo.h_low": "0.5", "learner.shaping.gepo.c_high": "2"})
    off = with_overrides(debug(), {"learner.shaping.length": "none"})
    assert off.learner.shaping.length is None
    back = with_overrides(off, {"learner.shaping.length.tau": "0.25"})  # defaults fill the rest
    assert back.learner.shaping.length.tau == 0.25 and back.learner.shaping.length.alpha == 0.2
