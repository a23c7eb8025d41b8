"""``scifolio posttrain rl --ray local --engine-workers 2``: the debug run with its engines as two Ray actors.

Ray binds every interface: runs only inside a loopback-only namespace (CI runs the suite in one), skips elsewhere.
The run must learn as the issue asks, and since the scheduler sees the same events as in-process (per-position
seeded sampling, admission-ordered results), it must train exactly the trajectories an in-process run trains.
"""

from __future__ import annotations

import subprocess

import pytest
from test_cli_rl import cli, env, mean, rows

from tests.conftest import in_loopback_namespace

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_debug_run_on_local_ray_with_two_engine_workers_learns_and_equals_in_process(tmp_path):
    if not in_loopback_namespace():
        pytest.skip("Ray binds every interface: run inside `unshare -n sh -c 'ip link set lo up && exec pytest ...'`")
    on_ray, local = tmp_path / "ray", tmp_path / "local"
    done = subprocess.run(
        cli(on_ray, "--ray", "local", "--engine-workers", "2"), env=env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    r = rows(on_ray)
    assert len(r) >= 30
    first, last = mean([x["reward"] for x in r[:10]]), mean([x["reward"] for x in r[-10:]])
    assert last - first >= 0.3, (first, last)
    old = sum(x["old_version_tokens"] for x in r) / sum(x["trained_tokens"] for x in r)
    assert old >= 0.10, old
    assert all(x["max_lag"] <= 3 for x in r)

    steps = 10
    subprocess.run(cli(local, "--set", f"steps={steps}"), env=env(), check=True, capture_output=True)
    assert rows(local, "trained.jsonl") == rows(on_ray, "trained.jsonl")[:steps]
    assert [x["reward"] for x in rows(local)] == [x["reward"] for x in r[:steps]]
