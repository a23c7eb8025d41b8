"""kill -9 + ``--resume`` for the agentic and distillation recipes of the one driver: no metrics row twice, no
trajectory trained twice, nothing lost (``posttrain rl`` has its own, longer test in test_cli_rl.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.posttrain.rl.test_cli_rl import env, rows

pytestmark = pytest.mark.slow

RECIPES = {
    "agentic": ["steps=3", "group_size=2", "n_tasks=1", "max_turns=3"],
    "distill": ["steps=3", "teacher_steps=20", "sft_steps=2", "queries_per_domain=4", "samples_per_query=2"],
}


def cmd(stage: str, out: Path, *extra: str) -> list[str]:
    sets = [x for s in RECIPES[stage] for x in ("--set", s)]
    code = "from pipelines.cli import main; raise SystemExit(main())"
    return [sys.executable, "-c", code, "posttrain", stage, "--config", "debug", "--out", str(out), *sets, *extra]


def checkpoint_step(out: Path) -> int:
    try:
        return int(torch.load(out / "checkpoint" / "state.pt", weights_only=False)["step"])
    except (FileNotFoundError, EOFError, RuntimeError):
        return 0


@pytest.mark.parametrize("stage", sorted(RECIPES))
def test_kill_9_then_resume_repeats_and_loses_nothing(tmp_path, stage):
    ref = tmp_path / "ref"
    subprocess.run(cmd(stage, ref), env=env(), check=True, capture_output=True)
    out = tmp_path / "killed"
    proc = subprocess.Popen(cmd(stage, out), env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while checkpoint_step(out) < 1 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = checkpoint_step(out)
    assert 1 <= killed_at < 3, "killed too late to test a resume"
    subprocess.run(cmd(stage, out, "--resume"), env=env(), check=True, capture_output=True)

    got, want = rows(out), rows(ref)
    assert [r["step"] for r in got] == [r["step"] for r in want]  # every step once (distill: step 0 too)
    trained = [i for r in rows(out, "trained.jsonl") for i in r["ids"]]
    assert len(trained) == len(set(trained))  # no trajectory trained twice
    assert [r["step"] for r in rows(out, "trained.jsonl")] == [1, 2, 3]
    assert (out / "policy" / "config.json").exists()
    assert json.loads((out / "config.json").read_text())["steps"] == 3
    if stage == "distill":  # deterministic stage: the resumed run is the uninterrupted one
        for a, b in zip(got, want, strict=True):
            for k in ("loss", "rkl_reasoning", "rkl_agentic"):
                if k in b:
                    assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), (a["step"], k)
    else:  # the scripted agent's behaviours depend only on the step: same rewards after the restart
        assert [r["reward"] for r in got] == [r["reward"] for r in want]
