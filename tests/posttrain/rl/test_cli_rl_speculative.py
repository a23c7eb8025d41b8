"""``scifolio posttrain rl --speculative``: rollouts through the speculative engine, the draft trained online each
step, its state (weights, optimizer, running acceptance, version) resumed from the checkpoint."""

from __future__ import annotations

import json
import subprocess

import torch

from tests.posttrain.rl.test_cli_rl import cli, env, rows


def test_speculative_flag_trains_the_draft_and_resumes_it(tmp_path):
    base = ["--speculative", "--set", "speculative.k=3", "--set", "engine_capacity=40"]
    subprocess.run(cli(tmp_path, *base, "--set", "steps=3"), env=env(), check=True, capture_output=True)
    first = rows(tmp_path)
    assert [r["draft_version"] for r in first] == [1, 2, 3]
    assert all(0.0 <= r["draft_round_acceptance"] <= 1.0 and 1.0 <= r["tokens_per_round"] <= 4.0 for r in first)
    state = torch.load(tmp_path / "checkpoint" / "state.pt", weights_only=False)
    config = json.loads((tmp_path / "config.json").read_text())
    assert state["stage"]["draft"]["version"] == 3 and config["speculative"]["k"] == 3
    subprocess.run(cli(tmp_path, *base, "--set", "steps=5", "--resume"), env=env(), check=True, capture_output=True)
    after = rows(tmp_path)
    assert [r["draft_version"] for r in after] == [1, 2, 3, 4, 5]  # the draft continued, not restarted
    assert [r["step"] for r in after] == [1, 2, 3, 4, 5]


def test_feature_draft_trains_online_through_the_cli(tmp_path):
    """``speculative.feature_draft``: the EAGLE-style draft built from the policy, trained each step like the LM one."""
    sets = ["speculative.feature_draft=true", "speculative.k=2", "engine_capacity=40", "steps=2"]
    cmd = cli(tmp_path, "--speculative", *[a for s in sets for a in ("--set", s)])
    subprocess.run(cmd, env=env(), check=True, capture_output=True)
    got = rows(tmp_path)
    assert [r["draft_version"] for r in got] == [1, 2]
    assert all(0.0 <= r["draft_round_acceptance"] <= 1.0 and 1.0 <= r["tokens_per_round"] <= 3.0 for r in got)
