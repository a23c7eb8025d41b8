"""RunDir: fresh runs start empty, resumed runs drop rows past the checkpoint, checkpoints are whole or absent."""

import json
import pickle

import pytest

from formats.rundir import RunDir


def test_fresh_run_resets_logs_and_resume_trims_to_checkpoint(tmp_path):
    run = RunDir(tmp_path, logs=("trained.jsonl",), tensorboard=False)
    run.write_config({"lr": 0.1})
    for step in (1, 2, 3):
        run.log({"step": step, "loss": 1.0 / step})
        run.log({"step": step, "ids": [step]}, file="trained.jsonl")
        if step == 2:
            run.save_checkpoint(lambda f: pickle.dump({"step": 2}, f))
    # killed during step 3, after its rows but before its checkpoint
    resumed = RunDir(tmp_path, resume=True, logs=("trained.jsonl",), tensorboard=False)
    start = resumed.load_checkpoint(lambda p: pickle.loads(p.read_bytes()))["step"]
    resumed.trim(start)
    assert [r["step"] for r in resumed.rows()] == [1, 2]
    assert [r["step"] for r in resumed.rows("trained.jsonl")] == [1, 2]
    assert json.loads((tmp_path / "config.json").read_text()) == {"lr": 0.1}
    RunDir(tmp_path, logs=("trained.jsonl",), tensorboard=False)  # a fresh run over the same directory
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "trained.jsonl").exists()


def test_resume_without_checkpoint_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        RunDir(tmp_path, resume=True)


def test_failed_checkpoint_write_keeps_the_previous_one(tmp_path):
    run = RunDir(tmp_path, tensorboard=False)
    run.save_checkpoint(lambda f: f.write(b"old"))

    def crash(f):
        f.write(b"half")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        run.save_checkpoint(crash)
    assert run.checkpoint.read_bytes() == b"old"
    assert [p.name for p in run.checkpoint.parent.iterdir()] == ["state.pt"]


def test_tensorboard_scalars_are_written(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = RunDir(tmp_path)
    run.log({"step": 1, "loss": 0.5, "note": "x"})
    run.log({"step": 2, "loss": 0.25})
    run.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 0.5), (2, 0.25)]
