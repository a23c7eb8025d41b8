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
    run_agentic(AgenticConfig(**{"steps": 2, "group_size": 2, "n_tasks": 1, "max_turns": 3, **sets}), out)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [json.loads(x)["ids"] for x in (out / "trained.jsonl").read_text().splitlines()]
    return rows, trained


def test_agentic_partial_rollout_trains_groups_in_order_across_syncs(tmp_path):
    """8 session slots, two tasks, groups of 2: step 1 starts groups 0–3 at once and trains groups 0 and 1; groups 2
    and 3 (their first calls long answered at version 0) go on across the sync and are trained at step 2 by version
    1. The synchronous baseline starts only the step's groups: nothing in flight, nothing old. Both train the same
    sessions, and the scripted agent's sessions grade the same across a pause (a resumed call keeps its reply)."""
    partial, trained = _run(tmp_path, "partial", max_sessions=8, n_tasks=2)
    tasks = [trained[0][i].split("-g")[0] for i in (0, 2)]
    assert trained == [[f"{tasks[g % 2]}-g{g}.r0:{r}" for g in (2 * s, 2 * s + 1) for r in range(2)] for s in (0, 1)]
    assert partial[0]["old_version_tokens"] == 0 and partial[1]["old_version_tokens"] > 0
    assert all(r["sessions"] == 4 and r["infra"] == 0 for r in partial)

    sync, trained_sync = _run(tmp_path, "sync", max_sessions=8, n_tasks=2, partial=False)
    assert trained_sync == trained and [r["reward"] for r in sync] == [r["reward"] for r in partial]
    assert all(r["sessions_in_flight"] == 0 and r["old_version_tokens"] == 0 for r in sync), sync
    assert all(r["multi_version_sessions"] == 0 and r["paused_calls"] == 0 for r in sync)


def test_scripted_agent_keeps_a_paused_reply_and_forgets_an_ended_session():
    """A call admitted again after a sync gets the reply it had; once its group is collected, the session's script
    and replies are dropped (a long run kept every session's before)."""
    from posttrain.agentic.rl import ScriptedAgent
    from posttrain.rollout.types import Request

    class Tok:  # ids = character codes; <|im_end|> = 0
        def convert_tokens_to_ids(self, token):
            return 0

        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]

    agent = ScriptedAgent(Tok())
    agent.assign("t-g0.r0:0", ["ab", "c"])
    first = Request("call-1", [1, 2], group_id="t-g0.r0:0")
    assert agent(first) == [97, 98, 0] and agent(first) == [97, 98, 0]  # resumed: same reply, queue untouched
    assert agent(Request("call-2", [1], group_id="t-g0.r0:0")) == [99, 0]
    agent.forget("t-g0.r0:0")
    assert agent.given == {} and agent.replies == {}
