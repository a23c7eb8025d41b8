"""``--ray local``: a Ray head started inside this process (``init_ray("local")``) with two engine workers.

Ray binds every interface: the test runs only inside a loopback-only namespace (CI runs the suite in one) and skips
elsewhere with that reason. ``shutdown_ray()`` stops the Ray processes this process started.
"""

from __future__ import annotations

import pytest
from rl_ray_helpers import assert_same_batches, parts, run_in_process, run_steps_in_driver

from tests.conftest import in_loopback_namespace

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_local_ray_with_two_engine_workers_matches_in_process():
    if not in_loopback_namespace():
        pytest.skip("Ray binds every interface: run inside `unshare -n sh -c 'ip link set lo up && exec pytest ...'`")
    import ray

    from posttrain.ray_actors import HFEngineFactory, RayEngine, init_ray, shutdown_ray, start_engine_workers

    _sched, build_model, _cfg = parts()
    resources = init_ray("local", num_cpus=2)
    try:
        assert resources["CPU"] == 2
        engine = RayEngine(start_engine_workers(HFEngineFactory(build_model, capacity=8), n_workers=2))
        batches, rows = run_steps_in_driver(engine)
        reported, done = new_tokens_over_ray(engine)
    finally:
        shutdown_ray()
    assert not ray.is_initialized()
    ref_batches, _ref_rows = run_in_process()
    assert_same_batches(batches, ref_batches)
    assert sum(r["old_version_tokens"] for r in rows) > 0
    assert len(done) == 4 and all(reported[rid] == t.token_ids for rid, t in done.items())


def new_tokens_over_ray(engine) -> tuple[dict, dict]:
    """Requests spread over the two workers; ``StepOutput.new_tokens`` as ``RayEngine.step`` merges them."""
    from posttrain.rollout.types import Request, SamplingParams

    reqs = [Request(f"nt{i}", [2, 3 + i], SamplingParams(max_new_tokens=6 + i, seed=i)) for i in range(4)]
    engine.submit(reqs)
    reported: dict[str, list[int]] = {r.request_id: [] for r in reqs}
    done = {}
    while len(done) < len(reqs):
        out = engine.step()
        for rid, ids in out.new_tokens.items():
            reported.setdefault(rid, []).extend(ids)
        done.update((t.request_id, t) for t in out.finished if t.request_id in reported)
    return reported, done
