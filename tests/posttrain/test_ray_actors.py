"""Ray as the distributed engine: a real two-node local Ray cluster (head + one worker node process).

Ray binds every interface, so the cluster is started only inside a loopback-only network namespace (CI runs the
suite in one); elsewhere these tests skip and say so. Run by hand:

    unshare -n sh -c 'ip link set lo up && exec env PYTHONPATH=$PWD /work/main/.venv/bin/python -m pytest \
        tests/posttrain/test_ray_actors.py -q'

The cluster is stopped by terminating the two ``ray start --block`` processes this fixture started (their Ray
daemons share their fate); ``ray stop`` is not used because it kills every Ray process of the user on the machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from rl_ray_helpers import assert_same_batches, parts, run_in_process, run_steps_in_driver

from tests.conftest import in_loopback_namespace

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive_nodes() -> int:
    import ray

    return sum(1 for n in ray.nodes() if n["Alive"])


@pytest.fixture(scope="module")
def ray_cluster():
    if not in_loopback_namespace():
        pytest.skip("Ray binds every interface: run inside `unshare -n sh -c 'ip link set lo up && exec pytest ...'`")
    import ray

    from posttrain.ray_actors import init_ray, shutdown_ray

    port = _free_port()
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's unix sockets live under it
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=str(ROOT))
    common = ["--num-cpus", "1", "--block", "--disable-usage-stats"]
    procs = []
    try:
        procs.append(
            subprocess.Popen(
                [RAY, "start", "--head", "--port", str(port), "--include-dashboard=false", "--temp-dir", temp, *common],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        address = f"127.0.0.1:{port}"
        _wait_for_gcs(port, procs[0])
        procs.append(
            subprocess.Popen(
                [RAY, "start", "--address", address, *common],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        init_ray(address)
        deadline = time.time() + 60
        while _alive_nodes() < 2:
            if time.time() > deadline:
                raise RuntimeError("the worker node never joined")
            time.sleep(0.5)
        yield address
    finally:
        shutdown_ray()
        for p in reversed(procs):  # only the processes this fixture started, by pid
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(temp, ignore_errors=True)
        assert not ray.is_initialized()


def _wait_for_gcs(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start --head exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise RuntimeError("Ray head did not come up")


@pytest.fixture(scope="module")
def in_process():
    return run_in_process()


def test_two_engine_workers_on_two_nodes_reproduce_the_in_process_run(ray_cluster, in_process):
    import ray

    from posttrain.ray_actors import RayEngine, start_engine_workers
    from posttrain.rl.engines import EngineFactory
    from posttrain.rl.recipes import debug

    _sched, build_model, _cfg = parts()
    workers = start_engine_workers(EngineFactory(debug(), 8, build=build_model), n_workers=2)
    try:
        engine = RayEngine(workers)
        assert engine.capacity == 16
        assert len(set(engine.nodes)) == 2  # one engine worker on the head, one on the worker node
        batches, rows = run_steps_in_driver(engine)
    finally:
        for w in workers:
            ray.kill(w)
    ref_batches, ref_rows = in_process
    assert_same_batches(batches, ref_batches)
    # Partial rollout really crossed weight syncs through the object store.
    assert sum(r["old_version_tokens"] for r in rows) > 0
    assert [r["old_version_tokens"] for r in rows] == [r["old_version_tokens"] for r in ref_rows]
    assert max(r["max_lag"] for r in rows) >= 1
