"""CLI flags take their defaults from the config dataclasses; ``--set`` reaches nested fields and refuses
unknown ones; every registered subcommand module exists."""

from __future__ import annotations

import argparse

import pytest

from pipelines.cli import COMMANDS, build_parser
from pipelines.cli.options import apply_sets, default


def test_flag_defaults_are_the_config_defaults():
    from parsing.config import ParseConfig
    from pipelines.assembly.build import BuildConfig
    from retrieval.weights import WeightConfig

    p = build_parser()
    b, _ = p.parse_known_args(["build", "in.pdf", "--out", "o"])
    assert b.max_tokens == BuildConfig().max_tokens and b.overlap == BuildConfig().overlap
    assert b.dpi == ParseConfig().dpi and b.page_timeout == ParseConfig().page_timeout_s
    assert b.tokenizer == BuildConfig().tokenizer == ""  # SmolLM2's, resolved by cmd_build (pipelines/real.py)
    w = p.parse_args(["index", "weights", "--queries", "q", "--out", "w", "--shards", "o", "--embed-model", "m"])
    assert (w.min_score, w.max_weight, w.k) == (WeightConfig().min_score, WeightConfig().max_weight, WeightConfig().k)


def test_set_reaches_nested_fields_and_refuses_unknown(capsys):
    from parsing.config import ParseConfig
    from pipelines.assembly.build import BuildConfig

    cfg = BuildConfig(tokenizer="t", parse=ParseConfig())
    out = apply_sets(cfg, ["parse.page_window=32", "docs_per_shard=8", "parse.limits.max_pages=5", "tokenizer=x/y"])
    assert out.parse.page_window == 32 and out.docs_per_shard == 8 and out.parse.limits.max_pages == 5
    assert out.tokenizer == "x/y" and cfg.parse.page_window == default(ParseConfig, "page_window")
    assert apply_sets(ParseConfig(), ["page_timeout_s=5"]).page_timeout_s == 5.0  # int → float field
    with pytest.raises(SystemExit) as e:
        apply_sets(cfg, ["parse.nope=1"])
    assert e.value.code == 2 and "ParseConfig has no field 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        apply_sets(cfg, ["overlap"])


def test_every_subcommand_with_a_config_takes_set():
    p = build_parser()
    argvs = [
        ["build", "x", "--out", "o", "--set", "overlap=8"],
        ["parse", "x", "--out", "o", "--set", "dpi=100"],
        ["index", "build", "--shards", "o", "--embed-model", "m", "--set", "batch_size=4"],
        ["index", "query", "q", "--embed-model", "m", "--set", "candidates=9"],
        ["index", "serve", "--embed-model", "m", "--set", "max_k=5"],
        ["index", "weights", "--queries", "q", "--out", "w", "--shards", "o", "--embed-model", "m", "--set", "k=3"],
        ["review", "export", "d", "--out", "r", "--set", "per_domain=3"],
        ["pretrain", "--shards", "o", "--set", "data.seq_len=64"],
    ]
    for argv in argvs:
        args, _ = p.parse_known_args(argv)
        assert args.set, argv


def test_a_listed_subcommand_without_its_module_is_an_error(monkeypatch):
    import pipelines.cli as cli

    assert isinstance(build_parser(), argparse.ArgumentParser)
    monkeypatch.setattr(cli, "COMMANDS", (*COMMANDS, "no_such_command"))
    with pytest.raises(ModuleNotFoundError, match="no_such_command"):
        cli.build_parser()
