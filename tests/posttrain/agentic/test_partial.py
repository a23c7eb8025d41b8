"""Partial rollout for agentic RL (issue 34, SPEC §C1): the engine driver pauses the calls in flight across a weight
sync and resumes them under the new version; ``posttrain agentic`` trains groups in start order while later groups'
sessions run across the update, and its synchronous baseline never leaves one in flight.

    python -m pytest tests/posttrain/agentic/test_partial.py -q
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from posttrain.agentic.driver import DriverClosed, EngineDriver
from posttrain.rollout.engines.scripted import ScriptedEngine, scripted_logprob
from posttrain.rollout.types import Request, SamplingParams


def test_a_held_driver_pauses_calls_and_resumes_them_under_the_new_version():
    engine = ScriptedEngine(capacity=4, step_delay_s=0.002)
    driver = EngineDriver(engine)

    async def go():
        stream = driver.stream(Request("a/0", [1, 2], SamplingParams(max_new_tokens=40)))
        got: list[int] = []
        async for ids in stream:
            got += ids
            if len(got) >= 5:
                break
        assert driver.hold() == 1  # the request comes back from the engine with its tokens
        n = engine.steps
        await asyncio.sleep(0.1)
        assert engine.steps == n and driver.held  # no step while held
        driver.release({}, 7)
        async for ids in stream:
            got += ids
        t = stream.trajectory
        assert t.token_ids == got and len(got) == 40 and t.finish_reason == "length"
        k = t.versions.index(7)
        assert 5 <= k < 40 and set(t.versions[:k]) == {0} and set(t.versions[k:]) == {7}
        assert t.logprobs == [scripted_logprob(i, v) for i, v in enumerate(t.versions)]
        assert engine.resumed == ["a/0"]
        # shutdown: the call in flight ends with what was sampled (finish "abort"), new calls are refused
        slow = asyncio.ensure_future(driver.generate(Request("b/0", [1], SamplingParams(max_new_tokens=10**6))))
        await asyncio.sleep(0.05)
        driver.shutdown()
        aborted = await asyncio.wait_for(slow, 10)
        assert aborted.finish_reason == "abort" and aborted.n_tokens > 0
        with pytest.raises(DriverClosed):
            await driver.generate(Request("c/0", [1], SamplingParams(max_new_tokens=2)))

    asyncio.run(go())
    with pytest.raises(RuntimeError, match="without hold"):
        driver.release()


def _run(tmp_path: Path, name: str, **sets) -> tuple[list[dict], list[list[str]]]:
    from posttrain.agentic.rl import AgenticConfig, run_agentic

    out = tmp_path / name
    run_agentic(AgenticConfig(steps=2, group_size=2, n_tasks=1, max_turns=3, **sets), out)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [json.loads(x)["ids"] for x in (out / "trained.jsonl").read_text().splitlines()]
    return rows, trained


def test_agentic_partial_rollout_trains_groups_in_order_across_syncs(tmp_path):
    """4 session slots, groups of 2: step 1 starts groups 0 and 1 at once and trains group 0; group 1's sessions
    (their first calls long answered at version 0) go on across the sync and are trained at step 2 by version 1.
    The synchronous baseline starts only the step's group: nothing in flight, nothing old."""
    rows, trained = _run(tmp_path, "partial", max_sessions=4)
    task = trained[0][0].split("-g")[0]
    assert trained == [[f"{task}-g{g}.r0:{r}" for r in range(2)] for g in (0, 1)]
    assert rows[0]["old_version_tokens"] == 0 and rows[1]["old_version_tokens"] > 0
    assert all(r["sessions"] == 2 and r["infra"] == 0 for r in rows)

    rows, trained = _run(tmp_path, "sync", max_sessions=4, partial=False)
    assert trained == [[f"{task}-g{g}.r0:{r}" for r in range(2)] for g in (0, 1)]
    assert all(r["sessions_in_flight"] == 0 and r["old_version_tokens"] == 0 for r in rows), rows
    assert all(r["multi_version_sessions"] == 0 and r["paused_calls"] == 0 for r in rows)
