"""Ray as the distributed engine: a real two-node local Ray cluster (head + one worker node process).

Ray binds every interface, so the cluster is started only inside a loopback-only network namespace (CI runs the
suite in one); elsewhere these tests skip and say so. Run by hand:

    unshare -n sh -c 'ip link set lo up && exec env PYTHONPATH=$PWD /work/main/.venv/bin/python -m pytest \
        tests/posttrain/test_ray_actors.py -q'

The cluster is stopped by terminating the two ``ray start --block`` processes this fixture started (their Ray
daemons share their fate); ``ray stop`` is not used because it kills every Ray process of the user on the machine.
"""

from __future__ import annotations

import functools
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
import torch

from tests.conftest import in_loopback_namespace

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))
VOCAB = 14  # char_tokenizer(): 3 specials + "0123456789:"
STEPS = 3


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


# -- the run being distributed: the real scheduler, HF engine and learner on the countdown task -----------------


def _parts():
    from posttrain.rl.learner import LearnerConfig
    from posttrain.rl.task import JsonlTask, TaskSource, char_tokenizer, countdown_rows, prefix_credit
    from posttrain.rollout.scheduler import PartialRolloutScheduler, SchedulerConfig
    from posttrain.rollout.types import SamplingParams
    from posttrain.tiny import build_tiny_causal_lm

    tok = char_tokenizer()
    source = TaskSource(JsonlTask(countdown_rows(64, seed=0), prefix_credit), tok, seed=0)
    sampling = SamplingParams(max_new_tokens=8, stop_token_ids=(tok.eos_token_id,))
    sched_cfg = SchedulerConfig(batch_target=2, group_size=4, max_stale=3)
    scheduler = functools.partial(
        PartialRolloutScheduler, source=source, reward_fn=source.reward, sampling=sampling, config=sched_cfg
    )
    build_model = functools.partial(build_tiny_causal_lm, VOCAB, 64, 0)
    return scheduler, build_model, LearnerConfig(n_minibatches=2, lr=1e-2)


def _run(engine, steps: int = STEPS):
    from posttrain.ray_actors import LearnerFactory

    scheduler_factory, build_model, learner_cfg = _parts()
    sched = scheduler_factory(engine)
    learner = LearnerFactory(build_model, learner_cfg)()
    batches, rows = [], []
    for _ in range(steps):
        batch = sched.collect()
        metrics = learner.train(batch)
        sched.sync(learner.weights(), learner.version)
        batches.append(batch)
        rows.append({**batch.stats, **metrics})
    return batches, rows


@pytest.fixture(scope="module")
def in_process():
    from posttrain.rollout.engines.hf import HFEngine

    _sched, build_model, _cfg = _parts()
    torch.set_num_threads(1)
    return _run(HFEngine(build_model(), capacity=16))


def _same_batches(a, b) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.version == y.version
        assert [[t.request_id for t in g] for g in x.groups] == [[t.request_id for t in g] for g in y.groups]
        for gx, gy in zip(x.groups, y.groups, strict=True):
            for tx, ty in zip(gx, gy, strict=True):
                assert tx.token_ids == ty.token_ids
                assert tx.versions == ty.versions
                assert tx.reward == ty.reward
                assert torch.allclose(torch.tensor(tx.logprobs), torch.tensor(ty.logprobs), atol=1e-5)


def test_two_engine_workers_on_two_nodes_reproduce_the_in_process_run(ray_cluster, in_process):
    import ray

    from posttrain.ray_actors import HFEngineFactory, RayEngine, start_engine_workers

    _sched, build_model, _cfg = _parts()
    workers = start_engine_workers(HFEngineFactory(build_model, capacity=8), n_workers=2)
    try:
        engine = RayEngine(workers)
        assert engine.capacity == 16
        assert len(set(engine.nodes)) == 2  # one engine worker on the head, one on the worker node
        batches, rows = _run(engine)
    finally:
        for w in workers:
            ray.kill(w)
    ref_batches, ref_rows = in_process
    _same_batches(batches, ref_batches)
    # Partial rollout really crossed weight syncs through the object store.
    assert sum(r["old_version_tokens"] for r in rows) > 0
    assert [r["old_version_tokens"] for r in rows] == [r["old_version_tokens"] for r in ref_rows]
    assert max(r["max_lag"] for r in rows) >= 1


def test_coordinator_and_learner_actors_run_the_same_steps(ray_cluster, in_process):
    import ray

    from posttrain.ray_actors import Coordinator, HFEngineFactory, LearnerFactory, LearnerWorker, run_steps

    scheduler_factory, build_model, learner_cfg = _parts()
    coordinator = Coordinator.options(num_cpus=0).remote(scheduler_factory, HFEngineFactory(build_model, 8), 2)
    learner = LearnerWorker.options(num_cpus=0).remote(LearnerFactory(build_model, learner_cfg))
    try:
        assert len(set(ray.get(coordinator.engine_nodes.remote()))) == 2
        rows = run_steps(coordinator, learner, STEPS)
    finally:
        ray.kill(coordinator)
        ray.kill(learner)
    _batches, ref_rows = in_process
    for row, ref in zip(rows, ref_rows, strict=True):
        for key in ("trained_tokens", "old_version_tokens", "discarded_trajectories", "engine_steps"):
            assert row[key] == ref[key]
        assert abs(row["loss"] - ref["loss"]) < 1e-4
    assert [r["version"] for r in rows] == [1.0, 2.0, 3.0]
