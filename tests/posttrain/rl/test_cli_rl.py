"""``scifolio posttrain rl`` end to end: the tiny run learns, kill -9 + --resume loses and repeats nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]


def cli(out: Path, *extra: str) -> list[str]:
    code = "from pipelines.cli import main; raise SystemExit(main())"
    return [
        sys.executable,
        "-c",
        code,
        "posttrain",
        "rl",
        "--config",
        "debug",
        "--out",
        str(out),
        "--no-progress",
        *extra,
    ]


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), e.get("PYTHONPATH", "")) if p)
    e.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return e


def rows(out: Path, name: str = "metrics.jsonl") -> list[dict]:
    return [json.loads(line) for line in (out / name).read_text().splitlines() if line.strip()]


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def test_print_config_and_overrides(tmp_path):
    out = subprocess.run(
        cli(tmp_path, "--print-config", "--set", "steps=3", "--set", "scheduler.partial=false"),
        env=env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    cfg = json.loads(out)
    assert cfg["steps"] == 3 and cfg["scheduler"]["partial"] is False and cfg["policy"]["path"] is None


def test_print_config_of_a_hub_policy_loads_nothing(tmp_path, capsys, monkeypatch):
    """``--config small`` names a hub model: printing its config asks neither the hub nor the disk for it."""
    import transformers

    from pipelines.cli import main

    def refuse(*a, **k):
        raise AssertionError(f"--print-config loaded a model or config: {a}")

    for cls in (transformers.AutoConfig, transformers.AutoModelForCausalLM, transformers.AutoTokenizer):
        monkeypatch.setattr(cls, "from_pretrained", refuse)
    assert main(["posttrain", "rl", "--config", "small", "--out", str(tmp_path), "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out)["policy"]["path"] == "Qwen/Qwen2.5-0.5B-Instruct"


@pytest.mark.slow
def test_tiny_run_learns_with_partial_rollout_like_sync(tmp_path):
    part, sync = tmp_path / "partial", tmp_path / "sync"
    procs = [
        subprocess.Popen(cli(part), env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
        subprocess.Popen(
            cli(sync, "--set", "scheduler.partial=false"),
            env=env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        ),
    ]
    for p in procs:
        log = p.communicate(timeout=600)[0]
        assert p.returncode == 0, log[-3000:]
    p_rows, s_rows = rows(part), rows(sync)
    n = len(p_rows)
    assert n == len(s_rows) >= 30
    first, last = mean([r["reward"] for r in p_rows[:10]]), mean([r["reward"] for r in p_rows[-10:]])
    assert last - first >= 0.3, (first, last)
    old = sum(r["old_version_tokens"] for r in p_rows) / sum(r["trained_tokens"] for r in p_rows)
    assert old >= 0.10, old
    assert all(r["max_lag"] <= 3 for r in p_rows)
    # Compare where the two runs end by the median of their last ten steps: one collapsed step (a batch whose
    # groups all miss) moves a ten-step mean by 0.06 and says nothing about how either run learns.
    part_end, sync_end = median([r["reward"] for r in p_rows[-10:]]), median([r["reward"] for r in s_rows[-10:]])
    assert abs(part_end - sync_end) <= 0.1, (part_end, sync_end)
    assert mean([r["occupancy"] for r in p_rows]) > mean([r["occupancy"] for r in s_rows])
    for key in ("bkl_masked_fraction", "discarded_stale", "response_length", "sampled_length"):
        assert key in p_rows[0]
    assert list((part / "tb").iterdir()), "no TensorBoard events"
    # The exported policy is a Hugging Face checkpoint that reproduces the learner's weights.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(part / "policy")
    tok = AutoTokenizer.from_pretrained(part / "policy")
    state = torch.load(part / "checkpoint" / "state.pt", weights_only=False)["learner"]["model"]
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    assert tok.decode(tok("3:")["input_ids"], skip_special_tokens=True) == "3:"


def _checkpoint(out: Path) -> dict | None:
    try:
        return torch.load(out / "checkpoint" / "state.pt", weights_only=False)
    except (FileNotFoundError, EOFError, RuntimeError):
        return None


@pytest.mark.slow
def test_kill_9_while_paused_then_resume_loses_and_repeats_nothing(tmp_path):
    steps = ["--set", "steps=10"]
    ref = tmp_path / "ref"
    subprocess.run(cli(ref, *steps), env=env(), check=True, capture_output=True)

    out = tmp_path / "killed"
    proc = subprocess.Popen(cli(out, *steps), env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen = None
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        state = _checkpoint(out)
        if state and state["step"] >= 3 and state["stage"]["scheduler"]["paused"]:
            seen = state
            break
        time.sleep(0.02)
    assert seen is not None, "never saw a checkpoint with paused partial trajectories"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    at_kill = _checkpoint(out)
    paused = {t["request"]["request_id"] for t in at_kill["stage"]["scheduler"]["paused"]}
    assert any(t["token_ids"] for t in at_kill["stage"]["scheduler"]["paused"])

    subprocess.run(cli(out, *steps, "--resume"), env=env(), check=True, capture_output=True)
    trained = rows(out, "trained.jsonl")
    assert [r["step"] for r in trained] == list(range(1, 11))
    ids = [i for r in trained for i in r["ids"]]
    assert len(ids) == len(set(ids)), "a trajectory was trained twice"
    final = _checkpoint(out)["stage"]["scheduler"]
    still = {t["request"]["request_id"] for t in final["paused"]}
    still |= {t["request"]["request_id"] for g in final["groups"].values() for t in g["done"]}
    after = {i for r in trained if r["step"] > at_kill["step"] for i in r["ids"]}
    dropped = {i for r in trained if r["step"] > at_kill["step"] for i in r["dapo_dropped"]}
    assert not (after & dropped)
    assert paused <= after | dropped | still, "a paused trajectory was lost"
    assert paused & after, "no paused trajectory was trained after the resume"
    # Seeded per-position draws + exact state: the killed-and-resumed run equals the uninterrupted one.
    assert trained == rows(ref, "trained.jsonl")
    assert [r["reward"] for r in rows(out)] == [r["reward"] for r in rows(ref)]


@pytest.mark.slow
@pytest.mark.integration
def test_ray_local_two_engine_workers_reproduces_the_in_process_run(tmp_path):
    from tests.conftest import in_loopback_namespace

    if not in_loopback_namespace():
        pytest.skip("Ray binds every interface: run inside `unshare -n sh -c 'ip link set lo up && exec pytest ...'`")
    steps = ["--set", "steps=6"]
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    subprocess.run(cli(local, *steps), env=env(), check=True, capture_output=True)
    proc = subprocess.run(
        cli(on_ray, *steps, "--ray", "local", "--engine-workers", "2"), env=env(), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert rows(on_ray, "trained.jsonl") == rows(local, "trained.jsonl")
    assert [r["reward"] for r in rows(on_ray)] == [r["reward"] for r in rows(local)]


def test_a_task_the_policy_cannot_solve_stops_with_advice_not_silence(tmp_path, capsys):
    """DAPO drops every all-zero group; the bar shows the drops as they happen and the run stops (exit 3) once
    it has dropped groups for ``scheduler.starve_after_s`` seconds with none kept, saying what to change."""
    from pipelines.cli import main

    task = tmp_path / "impossible.jsonl"
    rows = [
        {"id": f"q{i}", "prompt": f"Say the number {i}:", "answer": "seven hundred and twelve thousand"}
        for i in range(8)
    ]
    task.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sets = ["task.name=jsonl", f"task.jsonl={task}", "task.verifier=exact", "scheduler.starve_after_s=2", "steps=3"]
    argv = ["posttrain", "rl", "--config", "debug", "--out", str(tmp_path / "run")]
    t0 = time.perf_counter()
    assert main([*argv, *(a for s in sets for a in ("--set", s))]) == 3
    assert time.perf_counter() - t0 < 60
    err = capsys.readouterr().err
    assert "dropped=1 (1 in a row)" in err  # the progress bar, before any step completed
    assert "error: posttrain rl stopped, starved:" in err and "dropped by the DAPO (identical rewards) filter" in err
    assert "Every sample scored 0: the policy solves none of these prompts" in err
    assert "scheduler.dapo=false" in err and "scheduler.starve_after_s=2" in err
    metrics = tmp_path / "run" / "metrics.jsonl"
    assert not metrics.exists() or not metrics.read_text().strip()  # no step was trained
