"""Harness × task: verifier integrity, the built-in harness against the gateway, credit on stored spans, a tiny run."""

from __future__ import annotations

import json

import pytest
import torch

from posttrain import toolcall
from posttrain.agentic.gateway import Gateway, GatewayConfig, ServerThread, build_app
from posttrain.agentic.rl import (
    AgenticConfig,
    ScriptedAgent,
    behaviour_replies,
    run_agentic,
    session_credit,
    session_steps,
)
from posttrain.agentic.tasks import FAIL, INFRA, PASS, SimpleHarness, coding_tasks, network_isolation, verify
from posttrain.objectives.credit import annotate
from posttrain.rollout.engines.scripted import ScriptedTokenEngine
from posttrain.tiny.agentic import build_tokenizer

TOOLS = {"write_file", "read_file", "run_tests"}


@pytest.fixture(scope="module")
def task():
    return coding_tasks()[0]


def test_reference_fix_passes_and_snapshot_fails(task, tmp_path):
    work = task.setup(tmp_path)
    assert verify(task, work).status == FAIL
    for rel, text in task.reference_patch.items():
        (work / rel).write_text(text)
    v = verify(task, work)
    assert v.status == PASS and v.reward == 1.0
    assert v.isolated == network_isolation()


def test_agent_editing_the_tests_still_fails(task, tmp_path):
    work = task.setup(tmp_path)
    (work / "test_calc.py").write_text("def test_sub():\n    assert True\n\n\ndef test_add():\n    assert True\n")
    v = verify(task, work)
    assert v.status == FAIL and v.results["test_calc.py::test_sub"] == "failed"


def test_pass_to_pass_regression_fails(task, tmp_path):
    work = task.setup(tmp_path)
    (work / "calc.py").write_text("def add(a, b):\n    return 0\n\n\ndef sub(a, b):\n    return a - b\n")
    v = verify(task, work)
    assert v.status == FAIL and v.results == {"test_calc.py::test_add": "failed", "test_calc.py::test_sub": "passed"}
    # deleting the function under a pass-to-pass test (import error) is a failure too, not infrastructure
    (work / "calc.py").write_text("def sub(a, b):\n    return a - b\n")
    assert verify(task, work).status == FAIL


def test_verifier_crash_and_missing_artefacts_are_infrastructure_failures(task, tmp_path):
    from dataclasses import replace

    work = task.setup(tmp_path / "a")
    crashing = replace(task, hidden_tests={"test_calc.py": "import os\nos._exit(3)\n"})
    v = verify(crashing, work)
    assert v.status == INFRA and v.reward is None and "unparseable" in v.detail
    work = task.setup(tmp_path / "b")
    (tmp_path / "grading").mkdir()
    v = verify(task, work, grading_dir=tmp_path / "grading")
    assert v.status == INFRA and v.reward is None and "missing" in v.detail


@pytest.fixture()
def served():
    tok = build_tokenizer()
    agent = ScriptedAgent(tok)
    engine = ScriptedTokenEngine(agent)
    gw = Gateway(engine, tok, GatewayConfig(default_max_tokens=192))
    with ServerThread(build_app(gw)) as url:
        yield gw, agent, url, tok


def test_harness_fixes_the_task_through_the_gateway(served, task, tmp_path):
    gw, agent, url, tok = served
    agent.assign("calc:0", behaviour_replies(task, "fix"))
    work = task.setup(tmp_path)
    run = SimpleHarness(url + "/v1", "calc:0").run(task.objective, work)
    assert run.turns == 3 and run.stopped_by == "answer"
    assert [e.name for step in run.tool_events for e in step] == ["run_tests", "write_file"]
    assert run.tool_events[0][0].failed is False  # visible tests pass on the snapshot (the bug is hidden)
    assert verify(task, work).status == PASS
    store = gw.store
    calls = store.session_calls["calc:0"]
    assert len(calls) == 3 and not store.forks
    for cid in calls:
        traj = gw.driver.finished[store.calls[cid]["meta"]["request_id"]]
        assert store.call_input_ids(cid) == traj.prompt_ids and store.call_output_ids(cid) == traj.token_ids
    ex = store.session_export("calc:0")
    assert [i for i, m in enumerate(ex["loss_mask"]) if m] == [i for a, b in ex["spans"] for i in range(a, b)]


def test_c7_credit_on_stored_spans(served, task, tmp_path):
    """SPEC §C7 worked example (weights 1, 0, −0.5, 1; A = ±0.6) on spans recorded by a real harness run."""
    gw, agent, url, tok = served
    search = toolcall.render("run_tests", {"only": "x"})
    replies = [search, '<tool_call>{"name": "run_tests", oops</tool_call>', search, "Done."]
    weights = []
    for sid in ("c7:0", "c7:1"):
        agent.assign(sid, replies)
        work = task.setup(tmp_path / sid.replace(":", "_"))
        # run_tests with a broken test file fails → the repeated identical call is a repeated failed call
        (work / "test_calc.py").write_text("def test_x():\n    assert False\n")
        run = SimpleHarness(url + "/v1", sid).run(task.objective, work)
        assert run.turns == 4
        steps = session_steps(gw.store, sid, run, TOOLS)
        assert [s.well_formed for s in steps] == [True, False, True, True]
        weights.append(annotate(steps, TOOLS))
        assert weights[-1] == [1.0, 0.0, -0.5, 1.0]
    adv = session_credit(gw.store, ["c7:0", "c7:1"], [0.6, -0.6], weights)
    for sid, a in zip(("c7:0", "c7:1"), adv):
        ex = gw.store.session_export(sid)
        per_span = [sorted(set(a[s:e])) for s, e in ex["spans"]]
        expect = [[0.6], [0.0], [-0.3], [0.6]] if sid == "c7:0" else [[-0.6]] * 4
        assert per_span == [pytest.approx(x) for x in expect]
        assert all(v == 0 for v, m in zip(a, ex["loss_mask"]) if not m)  # zero on system/user/tool tokens
    t = gw.store.session_trajectory("c7:0", 1.0)
    assert t.prompt_ids + t.token_ids == gw.store.session_export("c7:0")["token_ids"]


def test_tiny_agentic_rl_run(tmp_path):
    """Two learner steps over two tasks × four scripted sessions: mixed verdicts, credit, real optimizer steps."""
    out = tmp_path / "run"
    m = run_agentic(AgenticConfig(steps=2, group_size=4, n_tasks=2), out)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]
    for x in lines:
        assert x["sessions"] == 8 and x["infra"] == 0
        assert 0.0 < x["reward_mean"] < 1.0  # fix / malformed_then_fix pass; edit_tests / break_p2p fail
        assert x["kept"] > 0 and torch.isfinite(torch.tensor(x["loss"]))
    assert m["stored_tokens"] < m["flat_tokens"]
    assert (out / "traces.sqlite").exists()


def test_turn_limit_is_annotated_and_context_limit_is_an_error(served, task, tmp_path):
    gw, agent, url, tok = served
    agent.assign("lim:0", [toolcall.render("read_file", {"path": "calc.py"})] * 5)
    run = SimpleHarness(url + "/v1", "lim:0", max_turns=2).run(task.objective, task.setup(tmp_path))
    assert run.stopped_by == "max_turns" and run.turns == 2
    steps = session_steps(gw.store, "lim:0", run, TOOLS)
    assert [s.hit_limit for s in steps] == [False, True]
    assert annotate(steps, TOOLS) == [1.0, -0.5]
    # a prompt beyond max_context is refused as the protocol's own error, and nothing is recorded
    import openai

    small = Gateway(ScriptedTokenEngine(agent), tok, GatewayConfig(max_context=8))
    with ServerThread(build_app(small)) as url2:
        with pytest.raises(openai.BadRequestError, match="context_length_exceeded|max_context"):
            openai.OpenAI(base_url=url2 + "/v1", api_key="big", max_retries=0).chat.completions.create(
                model="m", messages=[{"role": "user", "content": "a long objective " * 10}]
            )
    assert "big" not in small.store.session_calls


def test_sandbox_timeout_kills_the_whole_process_group(tmp_path):
    """A command that forks a sleeper and then hangs: on the wall-clock timeout the grandchild dies too
    (before, only the direct child was killed and the sleeper outlived the task). The grandchild would leave
    a file behind if it lived (inside the jail its pid is not the host's, so the file is the witness)."""
    import os
    import time

    from posttrain.agentic.jail import SandboxLimits, run_jailed

    script = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(4); open(\"alive\", \"w\")'])\n"
        "time.sleep(60)\n"
    )
    t0 = time.monotonic()
    r = run_jailed([os.environ.get("PYTHON", "python3"), "-c", script], tmp_path, SandboxLimits(wall_s=2))
    assert r.returncode is None and r.stderr == "timeout" and time.monotonic() - t0 < 30
    time.sleep(4)
    assert not (tmp_path / "alive").exists(), "the grandchild survived the sandbox timeout"


def test_harness_tools_stay_inside_the_repository(tmp_path):
    (tmp_path / "repo").mkdir()
    (tmp_path / "secret.txt").write_text("hidden tests")
    h = SimpleHarness("http://127.0.0.1:9/v1", "k")
    for name, args in (("read_file", {"path": "../secret.txt"}), ("write_file", {"path": "../x.py", "content": ""})):
        out, failed = h._tool(tmp_path / "repo", name, args)
        assert failed and "outside the repository" in out
    assert not (tmp_path / "x.py").exists()
