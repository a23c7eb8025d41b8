"""``--ray local``: a Ray head started inside this process (``init_ray("local")``) with two engine workers (HF, and
speculative with the driver's draft synced to them).

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

    from posttrain.ray_actors import RayEngine, init_ray, shutdown_ray, start_engine_workers
    from posttrain.rl.engines import EngineFactory
    from posttrain.rl.recipes import debug

    _sched, build_model, _cfg = parts()
    resources = init_ray("local", num_cpus=2)
    try:
        assert resources["CPU"] == 2
        engine = RayEngine(start_engine_workers(EngineFactory(debug(), 8, build=build_model), n_workers=2))
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


def _drive(engine, requests, pause_after: int = 2) -> list:
    """Submit, step to the end with one pause/resume in the middle; the finished trajectories by id."""
    done, steps = [], 0
    engine.submit(requests)
    while engine.n_active:
        done += engine.step().finished
        steps += 1
        if steps == pause_after:
            engine.resume(engine.pause())
    return sorted(done, key=lambda t: t.request_id)


def test_speculative_engine_workers_load_the_drivers_draft_and_report_like_one_engine():
    """Two ``SpeculativeEngine`` workers (the RL run's policy and draft architecture, built on the workers) against
    one in-process engine of twice the capacity: after ``update_draft`` every worker holds the driver's draft at
    its version, the tokens are the same, and the merged verification log, the acceptance and the counters equal
    the single engine's. Requests whose draft lags by one and those that do not make separate verification groups."""
    if not in_loopback_namespace():
        pytest.skip("Ray binds every interface: run inside `unshare -n sh -c 'ip link set lo up && exec pytest ...'`")

    import ray
    import torch

    from posttrain.ray_actors import RayEngine, init_ray, shutdown_ray, start_engine_workers
    from posttrain.rl.engines import EngineFactory, resolve
    from posttrain.rl.loop import build_draft, build_policy
    from posttrain.rl.recipes import debug
    from posttrain.rollout.engines.speculative import SpeculativeEngine
    from posttrain.rollout.types import Request, SamplingParams

    cfg = debug(**{"speculative.enabled": "true", "speculative.k": "3"})
    torch.set_num_threads(1)
    policy = build_policy(cfg)[0].eval()
    gen = torch.Generator().manual_seed(7)  # the driver's trained draft: not what a worker builds
    state = {n: p + 0.3 * torch.randn(p.shape, generator=gen) for n, p in build_draft(cfg, policy).state_dict().items()}

    def requests() -> list[Request]:
        return [
            Request(
                f"r{i:02d}",
                [3, 4, 5] if i % 3 else [3, 4, 5, 6, 7],
                SamplingParams(max_new_tokens=12, ignore_eos=True, seed=i),
            )
            for i in range(12)
        ]

    def local(draft_state):  # noqa: ANN001, ANN202
        eng = SpeculativeEngine(build_policy(cfg)[0], build_draft(cfg, policy), k=3, capacity=16)
        if draft_state is not None:
            eng.update_draft(draft_state, 5)
        return _drive(eng, requests()), eng

    ref, ref_eng = local(state)
    stale, _ = local(None)
    assert [t.token_ids for t in stale] != [t.token_ids for t in ref]  # the draft's weights change the tokens

    init_ray("local", num_cpus=2)
    try:
        factory = EngineFactory(resolve(cfg), capacity=8)  # what `posttrain rl --ray --speculative` starts
        workers = start_engine_workers(factory, n_workers=2)
        engine = RayEngine(workers)
        assert engine.speculative and engine.capacity == 16
        engine.update_draft(state, 5)
        assert [ray.get(w.spec_stats.remote())["draft_version"] for w in workers] == [5, 5]
        done = _drive(engine, requests())
        log = engine.take_round_log()
        stats = engine.spec_stats()
        acceptance = engine.acceptance
        assert engine.take_round_log() == []  # taken once
    finally:
        shutdown_ray()
    assert [t.token_ids for t in done] == [t.token_ids for t in ref]
    for t, r in zip(done, ref, strict=True):
        assert torch.allclose(torch.tensor(t.logprobs), torch.tensor(r.logprobs), atol=1e-5)
    ref_log = ref_eng.take_round_log()
    assert len(log) == len(ref_log) > 6  # several groups in some steps (draft lag 0 and 1, one singleton)
    assert all(torch.equal(a, b) for a, b in zip(log, ref_log, strict=True))
    for key in ("rounds", "proposed", "reached", "accepted", "emitted"):
        assert stats[key] == getattr(ref_eng, key), key
    assert stats["draft_version"] == 5 and acceptance == ref_eng.acceptance
