"""``scifolio posttrain lemma train`` on the one RL driver: a short debug run writes the OREAL-H rows, and kill -9 +
``--resume`` loses nothing and trains nothing twice (the pattern of tests/posttrain/rl/test_resume_stages.py).

The runs are shrunk through ``--set`` (fewer questions, BC epochs and tokens) so both tests fit in ~2 min on 2 cores.

Run: python -m pytest tests/posttrain/lemma/test_lemma_train.py -q
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.posttrain.rl.test_cli_rl import env, rows
from tests.posttrain.rl.test_resume_stages import checkpoint_step

pytestmark = pytest.mark.slow

SMALL = [
    "steps=2",
    "questions=2",
    "rollouts=2",
    "drop_saturated=false",  # 2 rollouts of a tiny policy are often both wrong: keep them so steps train
    "task.n_train=2",
    "cold_start.rollouts=2",
    "cold_start.epochs=3",
    "agent.max_rounds=1",
    "agent.max_revisions=1",
]


def cmd(out: Path, *extra: str) -> list[str]:
    sets = [x for s in SMALL for x in ("--set", s)]
    code = "from pipelines.cli import main; raise SystemExit(main())"
    return [sys.executable, "-c", code, "posttrain", "lemma", "train", "--config", "debug", "--out", str(out)] + [
        *sets,
        "--no-progress",
        *extra,
    ]


def test_debug_run_writes_oreal_rows(tmp_path) -> None:
    out = tmp_path / "run"
    done = subprocess.run(cmd(out), env=env(), check=True, capture_output=True, text=True)
    assert "accepted lemmas per round" in done.stdout
    got = rows(out)
    assert [r["step"] for r in got] == [0, 1, 2]  # step 0: the cold start
    bc = got[0]
    assert bc["bc_examples"] > 0 and bc["bc_loss_last"] < bc["bc_loss_first"]
    for r in got[1:]:
        for k in ("reward", "solved", "accepted_per_round", "uncertain_per_round", "masked_rounds", "loss", "lr"):
            assert k in r, k
        assert 0.0 <= r["masked_rounds"] <= 1.0 and r["trained_calls"] > 0
        assert r.get("dropped_saturated", 0) == r["questions_dropped"]  # the dead letters, by reason
    assert got[-1]["version"] == 2  # one learner update per step
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["reward"] == "conjugate" and cfg["graph_credit"] is True and cfg["verifier"] == "noisy"
    assert (out / "policy" / "config.json").exists()


def test_print_config_and_s1mo_needs_a_policy(tmp_path, capsys) -> None:
    from pipelines.cli import main

    assert main(["posttrain", "lemma", "train", "--config", "s1mo", "--out", str(tmp_path), "--print-config"]) == 0
    c = json.loads(capsys.readouterr().out)
    assert (c["questions"], c["rollouts"], c["drop_saturated"], c["max_tokens"]) == (64, 16, True, 65536)
    lr = c["learner"]
    assert (lr["optimizer"], lr["lr"], lr["schedule"], lr["min_lr_ratio"], lr["kl_beta"]) == (
        "adamw",
        5e-7,
        "cosine",
        0.2,
        0.01,
    )
    assert main(["posttrain", "lemma", "train", "--config", "s1mo", "--out", str(tmp_path / "x")]) == 2
    assert "needs a policy" in capsys.readouterr().err


def test_kill_9_then_resume_loses_nothing_and_trains_nothing_twice(tmp_path) -> None:
    ref = tmp_path / "ref"
    subprocess.run(cmd(ref), env=env(), check=True, capture_output=True)
    out = tmp_path / "killed"
    proc = subprocess.Popen(cmd(out), env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while checkpoint_step(out) < 1 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = checkpoint_step(out)
    assert killed_at == 1, "killed too late to test a resume"
    subprocess.run(cmd(out, "--resume"), env=env(), check=True, capture_output=True)

    got, want = rows(out), rows(ref)
    assert [r["step"] for r in got] == [r["step"] for r in want] == [0, 1, 2]
    trained = [i for r in rows(out, "trained.jsonl") for i in r["ids"]]
    assert len(trained) == len(set(trained))  # no trajectory trained twice
    assert [r["step"] for r in rows(out, "trained.jsonl")] == [1, 2]
    # rollouts are a function of (seed, step, weights) and the checkpoint restores weights, optimizer and the
    # noisy verifier's draws: the resumed run trains on the very calls the uninterrupted one did
    ref_ids = [i for r in rows(ref, "trained.jsonl") for i in r["ids"]]
    assert trained == ref_ids
    assert [r.get("reward") for r in got] == pytest.approx([r.get("reward") for r in want])


def test_cold_start_stops_at_its_loss_target_and_short_prompts_are_shorter() -> None:
    from dataclasses import replace

    from posttrain.lemma.roles import RolePrompt
    from posttrain.lemma.train import ColdStartConfig, LemmaStage, TaskConfig, debug
    from posttrain.rl.loop import warm_up

    cfg = debug()
    assert cfg.prompts == "short" and cfg.cold_start.loss_target > 0  # the debug recipe as documented
    pool = cfg.task.rows()  # what LemmaStage trains on
    assert len({r["steps"][0]["kind"] for r in pool}) == cfg.task.n_train == 4  # no two questions share a template
    small = replace(
        cfg,
        steps=1,
        task=TaskConfig(n_train=1, steps=1),
        cold_start=ColdStartConfig(rollouts=2, epochs=5, loss_target=50.0),  # any first pass is below 50 nats
    )
    stage = LemmaStage(small)
    bc = warm_up(stage)  # the driver's step 0: fit on the stage's warm-up, sync, its row
    assert bc is not None and bc["bc_epochs"] == 1 and bc["bc_updates"] >= 1
    p = RolePrompt("reasoner", "PROBLEM: x\nMEMORY:\n(empty)\n", "p0", 0)
    short = stage.caller.render(p)
    stage.caller.instructions = None  # the full instructions
    assert short.startswith("ROLE: reasoner\n") and len(short) < len(stage.caller.render(p)) - 200
    with pytest.raises(ValueError, match="prompts"):
        LemmaStage(replace(small, prompts="tiny"))
