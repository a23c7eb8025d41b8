"""DeepSpeed's multi-node path for real: ``scifolio pretrain --hostfile`` with two "nodes" that are both this machine
(127.0.0.1 and 127.0.0.2), reached the way real nodes are, over ssh through pdsh, and ZeRO-3 pre-training across them.

The ssh server is private to the test: its own host key, client key, ``authorized_keys``, config and known_hosts live
in the test's tmp dir (``~/.ssh`` is never read or written: an ``ssh`` wrapper first on PATH passes ``-F``), and it
listens on 127.0.0.1 only; the ssh config sends the second node's name there too.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pretrain.config import debug
from pretrain.data import Packer, ShardIndex
from pretrain.objective import warmup_cosine
from tests.conftest import needs_loopback_namespace


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kw)


@pytest.fixture
def private_ssh(tmp_path: Path) -> Iterator[Path]:
    """A private sshd on 127.0.0.1 and a PATH directory whose ``ssh`` reaches it as 127.0.0.1 or 127.0.0.2."""
    sshd = shutil.which("sshd") or shutil.which("sshd", path="/usr/sbin:/usr/local/sbin")
    missing = [
        t for t, path in (("sshd", sshd), ("ssh", shutil.which("ssh")), ("pdsh", shutil.which("pdsh"))) if not path
    ]
    if missing or not shutil.which("ssh-keygen"):
        pytest.skip(f"{', '.join(missing) or 'ssh-keygen'} not installed (Debian: apt-get install openssh-server pdsh)")
    d = tmp_path / "ssh"
    d.mkdir(mode=0o700)
    for name in ("host_key", "client_key"):
        made = _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(d / name)])
        assert made.returncode == 0, made.stderr
    shutil.copy(d / "client_key.pub", d / "authorized_keys")
    port = _free_port()
    (d / "sshd_config").write_text(
        f"ListenAddress 127.0.0.1\nPort {port}\nHostKey {d / 'host_key'}\nAuthorizedKeysFile {d / 'authorized_keys'}\n"
        f"PidFile {d / 'sshd.pid'}\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PubkeyAuthentication yes\nPermitRootLogin prohibit-password\nUsePAM no\n"
        # pytest's tmp dirs sit under world-writable /tmp, which StrictModes refuses for authorized_keys
        "StrictModes no\nX11Forwarding no\nAllowTcpForwarding no\nPrintMotd no\n"
    )
    if os.geteuid() == 0 and not Path("/run/sshd").exists():  # sshd's privilege-separation dir (Debian's path)
        Path("/run/sshd").mkdir(mode=0o755)
    log = (d / "sshd.log").open("w")
    server = subprocess.Popen([sshd, "-D", "-e", "-f", str(d / "sshd_config")], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while server.poll() is None and time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        if server.poll() is not None or time.monotonic() >= deadline:
            pytest.skip(f"sshd could not start: {(d / 'sshd.log').read_text()[-800:]}")
        host_pub = (d / "host_key.pub").read_text().split()
        (d / "known_hosts").write_text(f"scifolio-node {host_pub[0]} {host_pub[1]}\n")
        (d / "ssh_config").write_text(
            "Host *\n"
            "  HostName 127.0.0.1\n"  # 127.0.0.2 is the same machine; the server binds 127.0.0.1 alone
            f"  Port {port}\n  User {getpass.getuser()}\n  IdentityFile {d / 'client_key'}\n  IdentitiesOnly yes\n"
            f"  HostKeyAlias scifolio-node\n  UserKnownHostsFile {d / 'known_hosts'}\n"
            "  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n  BatchMode yes\n  LogLevel ERROR\n"
        )
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        wrapper = bin_dir / "ssh"
        wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {d / "ssh_config"} "$@"\n')
        wrapper.chmod(0o755)
        env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", PDSH_RCMD_TYPE="ssh")
        probe = _run(["pdsh", "-S", "-w", "127.0.0.1,127.0.0.2", "echo", "node-%n"], env=env)
        if probe.returncode != 0 or sorted(probe.stdout.split()) != ["127.0.0.1:", "127.0.0.2:", "node-0", "node-1"]:
            pytest.skip(f"pdsh over the private sshd failed: {probe.stdout[-400:]} {probe.stderr[-400:]}")
        yield bin_dir
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()


def _pretrain(argv: list[str]) -> int:
    from pipelines.cli.pretrain import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["pretrain", *argv])
    return args.func(args)


@pytest.mark.slow
@pytest.mark.integration
@needs_loopback_namespace()
def test_hostfile_two_nodes_zero3_then_resume_at_world_size_1(
    private_ssh: Path, corpus: Path, tiny_models: Path, tmp_path: Path, monkeypatch, capfd
) -> None:
    monkeypatch.setenv("PATH", f"{private_ssh}{os.pathsep}{os.environ['PATH']}")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("127.0.0.1 slots=1\n127.0.0.2 slots=1\n")
    out = tmp_path / "run"
    common = ["--config", "debug", "--shards", str(corpus), "--models", str(tiny_models), "--out", str(out)]
    common += ["--zero-stage", "3", "--set", "log_spans=True", "--set", "tensorboard=False", "--set", "data.seq_len=64"]
    assert _pretrain([*common, "--hostfile", str(hostfile), "--max-steps", "3", "--save-every", "2"]) == 0
    said = capfd.readouterr()
    # pdsh prefixes each node's output with its host name: both nodes ran a rank, launched over ssh.
    assert "127.0.0.1: " in said.out + said.err and "127.0.0.2: " in said.out + said.err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and all(r["loss"] > 0 for r in rows)
    assert rows[-1]["cursor"]["world_size"] == 2
    ckpt = out / "ckpt" / "step3"
    assert len(list(ckpt.glob("zero_pp_rank_*_optim_states.pt"))) == 2  # ZeRO-3 partitions on both nodes
    assert len(list(ckpt.glob("zero_pp_rank_*_model_states.pt"))) == 2

    # Resume on one rank: DeepSpeed's universal form of step 3 re-partitions the ZeRO-3 state for a world of 1,
    # and the one rank reads both saved readers in turn, each from its cursor.
    assert _pretrain([*common, "--nproc", "1", "--max-steps", "5", "--resume"]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5] and all(r["loss"] > 0 for r in rows)
    assert [(r["cursor"]["world_size"], r["cursor"]["n_readers"]) for r in rows] == [(2, 2)] * 3 + [(1, 2)] * 2
    assert (out / "ckpt" / "step3-universal").is_dir() and (out / "ckpt" / "latest").read_text() == "step5"
    assert (out / "ckpt" / "latest_universal").read_text() == "step3-universal"
    # The weights came back too: a fresh model would start again near step 1's loss.
    assert rows[3]["loss"] < rows[2]["loss"] < rows[0]["loss"]
    assert len(list((out / "ckpt" / "step5").glob("zero_pp_rank_*_optim_states.pt"))) == 1
    # The schedule came back with the optimizer: steps 4-5 run at their own LR, not at a fresh warmup's.
    cfg = debug(shards=str(corpus), models=str(tiny_models), **{"data.seq_len": 64})
    o = cfg.optim
    assert [r["lr"] for r in rows] == pytest.approx(
        [o.lr * warmup_cosine(s, o.warmup_steps, o.decay_steps, o.min_lr_ratio) for s in range(1, 6)]
    )
    # Nothing repeated or skipped: steps 1-3 were reader 0's (rank 0 logs its spans) batches 1-3; steps 4 and 5 are
    # reader 0's batch 4, then reader 1's batch 4 (rank 1 read its batches 1-3 at world size 2).
    index = ShardIndex.open(cfg.data.shards)
    stream = {r: Packer(cfg.data, index, r, 2) for r in (0, 1)}
    reader = {r: [json.loads(json.dumps(stream[r].next_batch()["spans"])) for _ in range(4)] for r in (0, 1)}
    assert [r["spans"] for r in rows] == [*reader[0][:4], reader[1][3]]


def test_hostfile_launch_rendezvouses_at_its_first_host(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# nodes\n\n  node-a slots=8  # master\nnode-b slots=8\n")
    assert _pretrain(["--shards", "s", "--hostfile", str(hostfile), "--master-port", "29600", "--dry-run"]) == 0
    cmd = capsys.readouterr().out.split()
    assert cmd[cmd.index("--hostfile") + 1] == str(hostfile) and cmd[cmd.index("--master_addr") + 1] == "node-a"
    (tmp_path / "empty").write_text("# no host yet\n")
    with pytest.raises(ValueError, match="lists no host"):
        _pretrain(["--shards", "s", "--hostfile", str(tmp_path / "empty"), "--dry-run"])
