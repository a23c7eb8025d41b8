"""``scifolio posttrain rl --ray local --speculative``: speculative engines as two Ray actors, the draft trained in the
driver with the learner and synced to both workers each step, resumed from the checkpoint.

Ray binds every interface: runs only inside a loopback-only namespace (CI runs the suite in one), skips elsewhere.
Per-request seeded rounds, admission-ordered results and the per-step merge of the workers' verification logs make
the run equal the in-process one: same trained trajectories, same engine counters, and the same running acceptance
ᾱ_k (which would drift if the workers' logs were folded in worker by worker). A worker left on a stale draft
proposes other tokens, so the trained trajectories and the acceptance would differ (checked by hand: with the
workers' draft never loaded, trained.jsonl differs from step 3 and the round acceptance from step 2).
"""

from __future__ import annotations

import subprocess

import pytest
import torch

from tests.conftest import in_loopback_namespace
from tests.posttrain.rl.test_cli_rl import cli, env, rows

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BASE = ["--speculative", "--set", "speculative.k=3", "--set", "engine_capacity=40"]


def test_speculative_run_on_two_ray_engine_workers_equals_in_process_and_resumes(tmp_path):
    if not in_loopback_namespace():
        pytest.skip("Ray binds every interface: run inside `unshare -n sh -c 'ip link set lo up && exec pytest ...'`")
    on_ray, local = tmp_path / "ray", tmp_path / "local"
    # Both runs restart in the middle (the engine's counters, hence the round acceptance, count from its start).
    for extra in (["--set", "steps=2"], ["--set", "steps=4", "--resume"]):
        ray_args = ["--ray", "local", "--engine-workers", "2"]
        done = subprocess.run(cli(on_ray, *BASE, *ray_args, *extra), env=env(), capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        subprocess.run(cli(local, *BASE, *extra), env=env(), check=True, capture_output=True)

    r, ref = rows(on_ray), rows(local)
    assert [x["step"] for x in r] == [1, 2, 3, 4]
    assert [x["draft_version"] for x in r] == [1, 2, 3, 4]  # continued after the restart, not retrained from 0
    # RayEngine.draft_version asks every worker and raises unless they all hold the same one.
    assert [x["engine_draft_version"] for x in r] == [1, 2, 3, 4]
    assert all(0.0 < x["draft_round_acceptance"] <= 1.0 and 1.0 <= x["tokens_per_round"] <= 4.0 for x in r)

    assert rows(on_ray, "trained.jsonl") == rows(local, "trained.jsonl")
    for key in ("reward", "draft_round_acceptance", "tokens_per_round", "trained_tokens", "old_version_tokens"):
        assert [x[key] for x in r] == [x[key] for x in ref], key
    for x, y in zip(r, ref, strict=True):
        assert abs(x["draft_acceptance"] - y["draft_acceptance"]) < 1e-12  # same groups folded in the same order
        assert abs(x["draft_loss"] - y["draft_loss"]) < 1e-5
    state = torch.load(on_ray / "checkpoint" / "state.pt", weights_only=False)
    assert state["stage"]["draft"]["version"] == 4
