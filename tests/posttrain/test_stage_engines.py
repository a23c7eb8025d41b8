"""Every post-training stage on the one engine path (issue 34): ``rl``, ``agentic``, ``distill`` and ``lemma train``
take the same ``policy`` / ``engine`` sections; with a tiny MoE policy and ``engine.kind=hf`` every trained row replays
the engine's routes (R3); on ``--ray local`` each stage's first step equals its in-process one; a kind that cannot
record routes refuses an MoE policy naming R3, and the old spellings exit 2 naming the new key.

    python -m pytest tests/posttrain/test_stage_engines.py -q          # the Ray test needs a loopback namespace:
    unshare -n sh -c 'ip link set lo up && exec python -m pytest tests/posttrain/test_stage_engines.py -q'
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import in_loopback_namespace

MOE = {"policy.arch": "qwen2_moe", "engine.kind": "hf", "steps": "2"}
"""The same keys mean the same to every stage."""
SMALL = {
    "rl": {"scheduler.batch_target": "2", "scheduler.group_size": "2", "sampling.max_new_tokens": "6"},
    "agentic": {"group_size": "2", "n_tasks": "1", "max_turns": "2"},
    "distill": {"teacher_steps": "2", "sft_steps": "0", "eval_queries": "0", "queries_per_domain": "2"},
    "lemma": {
        "questions": "1",
        "rollouts": "2",
        "drop_saturated": "false",
        "task.n_train": "1",
        "cold_start.enabled": "false",
        "agent.max_rounds": "1",
        "agent.max_revisions": "0",
        "agent.reasoner_tokens": "24",
        "agent.summariser_tokens": "16",
        "agent.reviser_tokens": "8",
        "max_tokens": "512",
    },
}


def stage(name: str, out: Path, sets: dict[str, str]):
    """The stage ``name`` of its debug recipe with ``sets`` applied (what ``--set`` does)."""
    from formats.overrides import with_overrides

    if name == "rl":
        from posttrain.rl.loop import RLStage
        from posttrain.rl.recipes import debug

        return RLStage(with_overrides(debug(), sets))
    if name == "agentic":
        from posttrain.agentic.rl import AgenticStage, debug

        return AgenticStage(with_overrides(debug(), sets), out)
    if name == "distill":
        from posttrain.rl.distill import build, debug

        return build(with_overrides(debug(), sets))
    from posttrain.lemma.train import LemmaStage, debug

    return LemmaStage(with_overrides(debug(), sets))


IN_PROCESS: dict[str, tuple[list[dict], list[list[list[int]]]]] = {}
"""Each stage's in-process MoE run (2 steps), kept for the Ray comparison (a first step does not depend on ``steps``:
the recipes' learning rates are constant, or cosine over one optimizer step per learner step)."""


def run(name: str, out: Path, **sets: str) -> tuple[list[dict], list[list[list[int]]]]:
    """The one driver over the stage: its metrics rows and, per step, the token ids it trained on."""
    from posttrain.rl.loop import run_stage

    if not sets and name in IN_PROCESS:
        return IN_PROCESS[name]

    st = stage(name, out, {**MOE, **SMALL[name], **sets})
    sampled, collect = [], st.collect

    def recording():
        batch = collect()
        sampled.append([t.token_ids for g in batch.groups for t in g])
        return batch

    st.collect = recording
    got = run_stage(st, out, progress=False), sampled
    for worker in getattr(st.engine, "workers", ()):  # Ray engine workers: freed for the next stage's
        from posttrain import ray_actors

        ray_actors.ray.kill(worker)
    if not sets:
        IN_PROCESS[name] = got
    return got


@pytest.mark.parametrize("name", ["rl", "agentic", "distill", "lemma"])
def test_every_stage_replays_the_routes_of_an_moe_policy(name, tmp_path, one_torch_thread):
    rows, sampled = run(name, tmp_path)
    assert [r["step"] for r in rows] == [1, 2] and all(sampled)
    assert all(r["r3_replayed_tokens"] > 0 for r in rows), rows


@pytest.mark.slow
def test_every_stage_on_local_ray_matches_in_process_on_its_first_step(tmp_path, one_torch_thread, monkeypatch):
    if not in_loopback_namespace():
        pytest.skip("Ray binds every interface: run inside `unshare -n sh -c 'ip link set lo up && exec pytest ...'`")
    from posttrain import ray_actors

    shutdown = ray_actors.shutdown_ray  # one local Ray for the four stages (each joins it), shut down once at the end
    monkeypatch.setattr(ray_actors, "shutdown_ray", lambda: None)
    try:
        _every_stage_on_ray(tmp_path)
    finally:
        shutdown()


def _every_stage_on_ray(tmp_path):
    for name in ("rl", "agentic", "distill", "lemma"):
        here, here_ids = run(name, tmp_path / f"{name}-here")
        ray, ray_ids = run(name, tmp_path / f"{name}-ray", steps="1", **{"engine.ray": "local", "engine.workers": "2"})
        assert ray_ids[0] == here_ids[0] and sum(map(len, here_ids[0])) > 0, name
        assert abs(ray[0]["loss"] - here[0]["loss"]) <= 1e-6, (name, ray[0]["loss"], here[0]["loss"])
        assert ray[0]["r3_replayed_tokens"] == here[0]["r3_replayed_tokens"] > 0, name


def test_a_kind_that_cannot_record_routes_refuses_an_moe_policy_naming_r3(tmp_path, capsys):
    from pipelines.cli import main

    argv = ["posttrain", "agentic", "--config", "debug", "--out", str(tmp_path / "a"), "--set", "policy.arch=qwen2_moe"]
    for stage_argv, kind in ((["agentic"], "scripted"), (["rl"], "scripted")):  # the scripted engines record no routes
        argv = [
            "posttrain",
            *stage_argv,
            "--config",
            "debug",
            "--out",
            str(tmp_path / "o"),
            "--set",
            f"engine.kind={kind}",
        ]
        with pytest.raises(SystemExit) as e:
            main([*argv, "--set", "policy.arch=qwen2_moe"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and "(R3)" in err and "use engine.kind=hf" in err and not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("stage_argv", "old", "new"),
    [
        (["agentic"], "engine=hf", "engine.kind=hf"),
        (["lemma", "train"], "policy=/models/qwen", "policy.path=/models/qwen"),
        (["rl"], "policy=/models/qwen", "policy.path=/models/qwen"),
    ],
)
def test_old_spellings_exit_2_naming_the_new_key(stage_argv, old, new, tmp_path, capsys):
    from pipelines.cli import main

    argv = ["posttrain", *stage_argv, "--config", "debug", "--out", str(tmp_path), "--set", old, "--print-config"]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and new in capsys.readouterr().err


def test_print_config_of_every_stage_loads_no_model(tmp_path, capsys, monkeypatch):
    import transformers

    def refuse(*a, **k):
        raise AssertionError(f"--print-config loaded a model or config: {a}")

    for cls in (transformers.AutoConfig, transformers.AutoModelForCausalLM, transformers.AutoTokenizer):
        monkeypatch.setattr(cls, "from_pretrained", refuse)
    from pipelines.cli import main

    for argv in (["rl"], ["agentic"], ["distill"], ["lemma", "train"]):
        sets = ["--set", "policy.path=/nowhere/model", "--set", "engine.kind=hf", "--set", "steps=2"]
        if argv == ["distill"]:
            sets = ["--set", "policy.arch=qwen2_moe", "--set", "engine.kind=hf", "--set", "steps=2"]
        assert main(["posttrain", *argv, "--config", "debug", "--out", str(tmp_path), *sets, "--print-config"]) == 0
        import json

        cfg = json.loads(capsys.readouterr().out)
        assert cfg["engine"]["kind"] == "hf" and cfg["steps"] == 2, argv


def test_agentic_tasks_from_a_jsonl_in_the_built_ins_shape(tmp_path):
    import dataclasses
    import json

    from posttrain.agentic.rl import AgenticStage, debug, read_tasks
    from posttrain.agentic.tasks import coding_tasks

    f = tmp_path / "tasks.jsonl"
    f.write_text("".join(json.dumps(dataclasses.asdict(t)) + "\n" for t in coding_tasks()[::-1]))
    assert read_tasks(str(f)) == coding_tasks()[::-1]
    stage = AgenticStage(dataclasses.replace(debug(), tasks=str(f), n_tasks=1), tmp_path / "run")
    try:
        assert stage.tasks == coding_tasks()[-1:]
    finally:
        stage.close()
