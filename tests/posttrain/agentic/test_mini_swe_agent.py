"""A third-party harness from PyPI, unmodified: mini-swe-agent (its ``DefaultAgent`` + ``LitellmModel`` +
its shipped ``mini.yaml`` config) solves a coding task against the gateway, its commands run through our
``JailedEnvironment`` (the bubblewrap jail) in place of its ``LocalEnvironment``.

A scripted engine plays the model (3 tool calls of mini-swe-agent's ``bash`` tool); the session's trace
must hold exactly the engine's ids, with the loss mask 1 only on assistant tokens; every command ran jailed.
"""

from __future__ import annotations

import os

import yaml

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm must not fetch its cost map
os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
import minisweagent  # noqa: E402,F401  (dev extra: a missing harness must fail, not skip)

from posttrain import toolcall  # noqa: E402
from posttrain.agentic.gateway import Gateway, GatewayConfig, ServerThread, build_app  # noqa: E402
from posttrain.agentic.jail import JailedEnvironment  # noqa: E402
from posttrain.agentic.rl import ScriptedAgent  # noqa: E402
from posttrain.agentic.tasks import PASS, coding_tasks, verify  # noqa: E402
from posttrain.rollout.engines.scripted import ScriptedTokenEngine  # noqa: E402
from posttrain.tiny.agentic import build_tokenizer  # noqa: E402


def test_mini_swe_agent_unmodified_against_the_gateway(tmp_path):
    from importlib.resources import files

    from minisweagent.agents.default import DefaultAgent
    from minisweagent.models.litellm_model import LitellmModel

    task = coding_tasks()[0]
    work = task.setup(tmp_path)
    ((path, good),) = task.reference_patch.items()
    tok = build_tokenizer()
    agent_script = ScriptedAgent(tok)
    sid = "mswea:0"
    agent_script.assign(
        sid,
        [
            toolcall.render("bash", {"command": "cat calc.py"}, "THOUGHT: look at the code."),
            toolcall.render("bash", {"command": f"cat > {path} <<'EOF'\n{good}EOF"}, "THOUGHT: fix sub."),
            toolcall.render("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}),
        ],
    )
    gw = Gateway(ScriptedTokenEngine(agent_script), tok, GatewayConfig(default_max_tokens=256, max_context=8192))
    cfg = yaml.safe_load((files("minisweagent") / "config" / "mini.yaml").read_text())
    with ServerThread(build_app(gw)) as url:
        model = LitellmModel(
            model_name="openai/scifolio",
            model_kwargs={"api_base": url + "/v1", "api_key": sid, "drop_params": True},
            cost_tracking="ignore_errors",
        )
        env = JailedEnvironment(work)
        agent_cfg = {k: v for k, v in cfg["agent"].items() if k != "mode"}
        agent = DefaultAgent(model, env, **agent_cfg)
        result = agent.run(task.objective)
    assert result["exit_status"] == "Submitted"
    assert [c for c, _ in env.results][:2] == ["cat calc.py", f"cat > {path} <<'EOF'\n{good}EOF"]
    assert all(r.jailed for _, r in env.results)
    assert verify(task, work).status == PASS
    store = gw.store
    calls = store.session_calls[sid]
    assert len(calls) == 3
    assert all(store.calls[c]["meta"]["tool_calls"][0]["name"] == "bash" for c in calls)
    for cid in calls:
        traj = gw.driver.finished[store.calls[cid]["meta"]["request_id"]]
        assert store.call_input_ids(cid) == traj.prompt_ids and store.call_output_ids(cid) == traj.token_ids
    ex = store.session_export(sid)
    assert [i for i, m in enumerate(ex["loss_mask"]) if m] == [i for a, b in ex["spans"] for i in range(a, b)]
    assert [ex["token_ids"][a:b] for a, b in ex["spans"]] == [store.call_output_ids(c) for c in calls]
    assert not store.forks, store.forks
