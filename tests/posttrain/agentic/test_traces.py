"""The PrefixTree trace store: SPEC §C6 worked example, persistence across a crash, skip masks."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from posttrain.agentic.traces import CONTEXT, RESPONSE, TraceStore


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
            c = store.record_call(
                f"{session}/{t}",
                session,
                node if reuse else parent,
                ("", [] if reuse else ctx_ids),
                ("", resp_ids, [-0.1] * len(resp_ids), [0] * len(resp_ids), None),
                "stop",
            )
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
        s = TraceStore({str(db)!r})
        c = s.record_call("c0", "sess", None, ("sys+user", [1, 2, 3]), ("hi", [7, 8], [-0.5, -0.25], [0, 0], None), "stop")
        s.record_call("c1", "sess", c["response_node"], ("tool", [4]), ("ok", [9], [-0.1], [0], [[[1, 2]]]), "stop")
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


def test_text_match_reuses_ids_and_forks_on_divergence():
    s = TraceStore()
    c0 = s.record_call("a", "x", None, ("<u>hi</u>", [1, 2]), ("hello", [5, 6], [0, 0], [0, 0], None), "stop")
    m = s.match_text("x", "<u>hi</u>hello<u>more</u>")
    assert m.node == c0["response_node"] and m.path_ids == [1, 2, 5, 6] and m.fork is None
    m = s.match_text("x", "<u>hi</u>HELLO<u>more</u>")
    assert m.node == c0["context_node"] and m.path_ids == [1, 2]
    assert m.fork["offset"] == len("<u>hi</u>") and m.fork["stored"] == "hello"
