"""The DeepSpeed loop on CPU: the loss falls, resume reproduces the uninterrupted run, world size 2 launches."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from pretrain.config import debug, deepspeed_config


def _cfg(corpus: Path, models: Path, out: Path, max_steps: int):
    return debug(
        shards=str(corpus),
        models=str(models),
        out_dir=str(out),
        max_steps=max_steps,
        save_every=10,
        log_spans=True,
        tensorboard=False,
        zero_stage=2,
    )


def test_deepspeed_config_from_dataclass(tmp_path: Path) -> None:
    cfg = debug(shards="s", models="m", grad_accum=4, zero_stage=3, precision="bf16")
    ds = deepspeed_config(cfg, world_size=2)
    assert ds["train_batch_size"] == cfg.data.micro_batch * 4 * 2
    assert ds["zero_optimization"]["stage"] == 3 and ds["bf16"]["enabled"] and ds["gradient_clipping"] == 1.0
    with pytest.raises(ValueError):
        deepspeed_config(debug(precision="fp16"), 1)


@pytest.fixture(scope="module")
def straight_run(corpus: Path, tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    from pretrain.train import train

    return train(_cfg(corpus, tiny_models, tmp_path_factory.mktemp("straight"), 30))


@pytest.mark.slow
def test_loss_falls_with_zero2(straight_run: list[dict]) -> None:
    first, last = straight_run[:5], straight_run[-5:]

    def mean(rows, key):
        return sum(r[key] for r in rows) / len(rows)

    assert [r["step"] for r in straight_run] == list(range(1, 31))
    assert mean(last, "loss") < mean(first, "loss") - 1.0
    assert mean(last, "l_text") < mean(first, "l_text") and mean(last, "l_vp") < mean(first, "l_vp")
    assert all(r["tokens_per_s"] > 0 and r["samples_per_s"] >= 0 for r in straight_run)


@pytest.mark.slow
def test_resume_reproduces_steps_21_to_30(straight_run, corpus: Path, tiny_models: Path, tmp_path: Path) -> None:
    from pretrain.train import train

    first = train(_cfg(corpus, tiny_models, tmp_path, 20))  # stops at 20 (checkpoints at 10 and 20)
    resumed = train(_cfg(corpus, tiny_models, tmp_path, 30), resume=True)
    assert [r["step"] for r in resumed] == list(range(21, 31))
    for want, got in zip(straight_run[20:], resumed):
        assert got["loss"] == pytest.approx(want["loss"], abs=1e-6)
        assert got["l_vp"] == pytest.approx(want["l_vp"], abs=1e-6)
    # The cursor proves the stream: the same spans, so no sample repeated or skipped across the restart.
    assert [r["spans"] for r in first + resumed] == [r["spans"] for r in straight_run]
    assert resumed[-1]["cursor"] == straight_run[-1]["cursor"]
    # The frozen encoder is not in the checkpoint; the trainable parts are.
    state = torch.load(tmp_path / "ckpt" / "step30" / "mp_rank_00_model_states.pt", weights_only=False)
    keys = list(state["module"])
    assert keys and not any(k.startswith("encoder.") for k in keys)
    assert any(k.startswith("w_in.") for k in keys) and any(k.startswith("psi.") for k in keys)
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 30


def _loopback_only() -> bool:
    # Ask the kernel about *this* network namespace: /sys/class/net still shows the host's interfaces after
    # `unshare -n` unless sysfs is remounted.
    import socket

    return [name for _, name in socket.if_nameindex()] == ["lo"]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.skipif(
    not _loopback_only(),
    reason="c10d's TCP store binds every interface: run inside a "
    "loopback-only namespace (unshare -n sh -c 'ip link set lo up && exec pytest ...')",
)
def test_world_size_2_through_deepspeed_launcher(corpus: Path, tiny_models: Path, tmp_path: Path) -> None:
    from pipelines.cli.pretrain import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(
        [
            "pretrain",
            "--config",
            "debug",
            "--shards",
            str(corpus),
            "--models",
            str(tiny_models),
            "--out",
            str(tmp_path),
            "--max-steps",
            "4",
            "--zero-stage",
            "2",
            "--nproc",
            "2",
            "--set",
            "log_spans=True",
            "--set",
            "tensorboard=False",
        ]
    )
    assert args.func(args) == 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all(r["loss"] > 0 for r in rows)
    assert rows[-1]["cursor"]["world_size"] == 2
    ckpt = tmp_path / "ckpt" / "step4"
    assert len(list(ckpt.glob("zero_pp_rank_*_optim_states.pt"))) == 2  # ZeRO-2 partitions across both ranks


def test_cli_dry_run_builds_deepspeed_command(capsys: pytest.CaptureFixture[str]) -> None:
    from pipelines.cli.pretrain import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(
        [
            "pretrain",
            "--shards",
            "out/shards",
            "--max-steps",
            "7",
            "--nproc",
            "2",
            "--set",
            "data.seq_len=64",
            "--dry-run",
        ]
    )
    assert args.func(args) == 0
    cmd = capsys.readouterr().out.split()
    assert cmd[1:4] == ["-m", "deepspeed.launcher.runner", "--num_gpus"] and cmd[4] == "2"
    assert "--module" in cmd and "pretrain.train" in cmd and "--no_local_rank" in cmd
    tail = cmd[cmd.index("pretrain.train") + 1 :]
    from pretrain.args import build_parser, config_from_args

    cfg = config_from_args(build_parser().parse_args(tail))
    assert cfg.max_steps == 7 and cfg.data.seq_len == 64 and cfg.data.shards == "out/shards"
