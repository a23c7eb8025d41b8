"""The PrefixTree trace store: SPEC §C6 worked example, persistence across a crash, skip masks."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from posttrain.agentic.traces import CONTEXT, RESPONSE, TraceStore
from posttrain.rollout.types import Request, Trajectory


def _traj(prompt: list[int], ids: list[int], logprobs: list[float], versions: list[int], experts=None) -> Trajectory:
    """An engine's finished trajectory (what the gateway hands the store)."""
    return Trajectory(Request("r", prompt), ids, logprobs, versions, [1] * len(ids), experts, "stop")


def _ids(tag: int, n: int) -> list[int]:
    return [tag * 10_000 + i for i in range(n)]


def build_c6(store: TraceStore, rollouts=8, turns=10, header=3000, per_turn=1200, shared=2, ctx=200) -> None:
    """80 model calls through the store: a turn = a context delta + a response of 1,200 tokens together.

    Turn t's ids depend only on t for the shared turns and on (rollout, t) after them, so shared turns
    coincide token for token and the store must keep them once.
    """
    for r in range(rollouts):
        session, parent, path = f"g:{r}", None, []
        for t in range(turns):
            tag = t + 1 if t < shared else 1000 * (r + 1) + t
            ctx_ids = (_ids(0, header) if t == 0 else []) + _ids(tag, ctx)
            resp_ids = _ids(tag + 500, per_turn - ctx)
            node, k = store.match_tokens("g", path + [(CONTEXT, ctx_ids)])  # longest token prefix, as stored
            reuse = k == len(path) + 1
            at, delta = (node, []) if reuse else (parent, ctx_ids)
            traj = _traj(store.path_ids(at) + delta, resp_ids, [-0.1] * len(resp_ids), [0] * len(resp_ids))
            c = store.record_call(f"{session}/{t}", session, at, ("", delta), "", traj, "stop")
            parent = c["response_node"]
            path += [(CONTEXT, ctx_ids), (RESPONSE, resp_ids)]


def test_c6_worked_example_from_a_built_store():
    store = TraceStore()
    build_c6(store)
    assert len(store.calls) == 80
    assert store.flat_tokens("g") == 768_000  # each call's full input + output
    assert store.stored_tokens("g") == 82_200  # = 5,400 shared + 8 × 9,600
    # every call's input is still exactly its path: rollout 5, turn 9
    assert len(store.call_input_ids("g:5/9")) == 3000 + 9 * 1200 + 200


def test_persisted_traces_survive_a_crash(tmp_path):
    """A child process writes calls then dies (os._exit, no close); a new store reloads every node and call."""
    db = tmp_path / "traces.sqlite"
    code = textwrap.dedent(
        f"""
        import os
        from posttrain.agentic.traces import TraceStore
        from posttrain.rollout.types import Request, Trajectory
        t0 = Trajectory(Request("r0", [1, 2, 3]), [7, 8], [-0.5, -0.25], [0, 0], [1, 1], None, "stop")
        t1 = Trajectory(Request("r1", [1, 2, 3, 7, 8, 4]), [9], [-0.1], [0], [1], [[[1, 2]]], "stop")
        s = TraceStore({str(db)!r})
        c = s.record_call("c0", "sess", None, ("sys+user", [1, 2, 3]), "hi", t0, "stop")
        s.record_call("c1", "sess", c["response_node"], ("tool", [4]), "ok", t1, "stop")
        s.mark_skip("c0")
        os._exit(0)
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=None)
    s = TraceStore(db)
    assert s.call_input_ids("c1") == [1, 2, 3, 7, 8, 4]
    assert s.call_output_ids("c1") == [9]
    ex = s.session_export("sess")
    assert ex["token_ids"] == [1, 2, 3, 7, 8, 4, 9]
    # c0 is marked skip: kept in context, excluded from the loss
    assert ex["loss_mask"] == [0, 0, 0, 0, 0, 0, 1]
    assert ex["labels"] == [-100] * 6 + [9]
    assert ex["logprobs"] == [0.0, 0.0, 0.0, -0.5, -0.25, 0.0, -0.1]
    assert ex["segment_ids"] == [-1] * 6 + [0]
    assert s.nodes[s.calls["c1"]["response_node"]].experts == [[[1, 2]]]
    # the response node holds the engine's trajectory, reloaded whole: its prompt is the stored path
    t1 = s.nodes[s.calls["c1"]["response_node"]].trajectory
    assert (t1.request_id, t1.prompt_ids, t1.token_ids, t1.finish_reason) == ("r1", [1, 2, 3, 7, 8, 4], [9], "stop")


def test_the_store_keeps_the_trajectory_and_refuses_a_prompt_that_is_not_the_path():
    s = TraceStore()
    t = _traj([1, 2], [5, 6], [-0.5, -0.25], [3, 3], [[[0, 1]]] * 3)
    c = s.record_call("a", "x", None, ("<u>hi</u>", [1, 2]), "hello", t, "stop")
    assert s.nodes[c["response_node"]].trajectory is t
    with pytest.raises(ValueError, match="not the stored path"):
        s.record_call("b", "x", c["response_node"], ("<u>more</u>", [7]), "x", _traj([1, 2, 7], [9], [0], [3]), "stop")
    traj = s.session_trajectory("x", 1.0)
    assert (traj.prompt_ids, traj.token_ids, traj.logprobs, traj.reward) == ([1, 2], [5, 6], [-0.5, -0.25], 1.0)


def test_text_match_reuses_ids_and_forks_on_divergence():
    s = TraceStore()
    c0 = s.record_call("a", "x", None, ("<u>hi</u>", [1, 2]), "hello", _traj([1, 2], [5, 6], [0, 0], [0, 0]), "stop")
    m = s.match_text("x", "<u>hi</u>hello<u>more</u>")
    assert m.node == c0["response_node"] and m.path_ids == [1, 2, 5, 6] and m.fork is None
    m = s.match_text("x", "<u>hi</u>HELLO<u>more</u>")
    assert m.node == c0["context_node"] and m.path_ids == [1, 2]
    assert m.fork["offset"] == len("<u>hi</u>") and m.fork["stored"] == "hello"
