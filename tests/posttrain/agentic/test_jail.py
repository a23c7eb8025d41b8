"""The jail (``posttrain.agentic.jail``): each hostile agent command of issue 25's list fails, is recorded as
failed in the environment's results, and the task's own grading still runs and grades afterwards."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from posttrain.agentic.jail import (
    JailedEnvironment,
    JailUnavailable,
    SandboxConfig,
    SandboxLimits,
    jail_available,
    jail_problem,
    run_jailed,
)
from posttrain.agentic.tasks import FAIL, PASS, coding_tasks, verify

ROOT = Path(__file__).resolve().parents[3]  # the project checkout


def test_the_jail_starts_here():
    """bubblewrap is a system dependency (``make system-deps``): a missing jail fails, it is not skipped."""
    assert jail_available(), jail_problem()


@pytest.fixture
def repo(tmp_path):
    tasks = coding_tasks()
    work = tasks[0].setup(tmp_path / "tasks")
    other = tasks[1].setup(tmp_path / "tasks")
    return tasks[0], work, other


def run_and_grade(task, work, command: str, limits: SandboxLimits = SandboxLimits(wall_s=10)):
    """The agent's command in the jail, then the grader (after the agent stopped), as a rollout does."""
    env = JailedEnvironment(work, limits)
    out = env.execute({"command": command})
    assert env.results and env.results[-1][0] == command  # recorded
    verdict = verify(task, work)
    assert verdict.status == FAIL and verdict.jailed and verdict.results, verdict  # graded, not infra
    return out, env.results[-1][1]


def test_the_jail_runs_commands_as_an_unprivileged_uid_in_the_repository(repo):
    task, work, _ = repo
    env = JailedEnvironment(work)
    out = env.execute({"command": "id -u; pwd; echo ok > made.txt; hostname"})
    uid, cwd, host = out["output"].split()
    assert out["returncode"] == 0 and cwd == str(work.resolve()) and host == "jail"
    assert uid == ("65534" if os.geteuid() == 0 else str(os.geteuid()))
    assert (work / "made.txt").read_text() == "ok\n"
    ((path, good),) = task.reference_patch.items()
    assert env.execute({"command": f"cat > {path} <<'EOF'\n{good}EOF"})["returncode"] == 0
    v = verify(task, work)
    assert v.status == PASS and v.jailed and v.isolated


@pytest.mark.parametrize(
    "target",
    ["checkout", "other_task", "etc"],
)
def test_writing_outside_the_repository_fails(repo, target):
    task, work, other = repo
    path = {"checkout": ROOT / "JAIL_ESCAPE.txt", "other_task": other / "text.py", "etc": Path("/etc/jail_escape")}[
        target
    ]
    before = path.read_text() if path.exists() else None
    out, r = run_and_grade(task, work, f"echo pwned > {path}")
    assert out["returncode"] != 0 and r.jailed
    # read-only bind, not in the jail at all, or (a checkout under /tmp, as in CI) a directory of the private
    # tmpfs that the unprivileged uid cannot write: each is a failed write, and the host file is untouched
    reasons = ("Read-only file system", "No such file", "Permission denied")
    assert any(x in out["output"] for x in reasons), out
    assert (path.read_text() if path.exists() else None) == before


def test_reading_the_trace_store_or_ray_fails(repo, tmp_path):
    task, work, _ = repo
    store = tmp_path / "run" / "traces.sqlite"
    store.parent.mkdir()
    store.write_text("SECRET-TRACE")
    ray = tmp_path / ".ray" / "session_latest"
    ray.mkdir(parents=True)
    (ray / "token").write_text("SECRET-RAY")
    out, _ = run_and_grade(task, work, f"cat {store} {ray / 'token'} {Path.home() / '.ray'}/*")
    assert out["returncode"] != 0 and "SECRET" not in out["output"]


def test_a_socket_to_the_hosts_loopback_reaches_nothing(repo):
    task, work, _ = repo
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    accepted: list[object] = []
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept())
            except OSError:
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    cmd = f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected"
    out, _ = run_and_grade(task, work, cmd)
    stop.set()
    t.join()
    server.close()
    assert out["returncode"] != 0 and "connected" not in out["output"] and not accepted


def test_a_fork_bomb_is_contained(repo):
    task, work, _ = repo
    t0 = time.monotonic()
    out, r = run_and_grade(task, work, "b(){ b | b & }; b; sleep 30", SandboxLimits(wall_s=4, nproc=64))
    assert r.timed_out and out["returncode"] == -1 and time.monotonic() - t0 < 30
    if os.geteuid() == 0:  # nothing of it survives as the jail's uid
        # The kernel tears the PID namespace down asynchronously: on a loaded machine 64 dying processes can
        # take longer than half a second to leave /proc, so wait for them; a leaked process never leaves.
        deadline = time.monotonic() + 15
        while (
            left := [p for p in os.listdir("/proc") if p.isdigit() and _uid(p) == 65534]
        ) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, left


def test_filling_the_disk_past_the_file_limit_fails(repo):
    task, work, _ = repo
    out, _ = run_and_grade(task, work, "head -c 40000000 /dev/zero > big.bin", SandboxLimits(wall_s=10, file_mb=4))
    assert out["returncode"] != 0
    assert (work / "big.bin").stat().st_size <= 4 * 2**20


@pytest.mark.parametrize("timeout", [False, True])
def test_a_detached_daemon_does_not_outlive_the_command(repo, timeout):
    task, work, _ = repo
    daemon = "setsid nohup sh -c 'sleep 1.5; echo alive > daemon.txt' >/dev/null 2>&1 &"
    cmd = daemon + (" sleep 30" if timeout else " echo started")
    env = JailedEnvironment(work, SandboxLimits(wall_s=1))
    out = env.execute({"command": cmd})
    assert env.results[-1][1].timed_out == timeout and out["returncode"] == (-1 if timeout else 0)
    time.sleep(2.5)
    assert not (work / "daemon.txt").exists()
    assert verify(task, work).status == FAIL


def test_killing_its_parent_fails_and_the_harness_lives_on(repo):
    task, work, _ = repo
    out, r = run_and_grade(task, work, f"kill -9 $PPID; kill -9 1; kill -9 {os.getpid()}; kill -9 {os.getppid()}")
    assert out["returncode"] != 0 and not r.timed_out
    os.kill(os.getpid(), 0)  # the harness (this process) is alive


def test_an_agent_symlink_cannot_redirect_the_grading_overlay(repo, tmp_path):
    """The overlay runs outside the jail: a test file replaced by a link out must not be written through."""
    task, work, _ = repo
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    (work / "test_calc.py").unlink()
    (work / "test_calc.py").symlink_to(victim)
    assert verify(task, work).status == FAIL
    assert victim.read_text() == "untouched"


def test_without_the_jail_the_run_is_refused_unless_allowed(repo, monkeypatch):
    from posttrain.agentic import jail

    task, work, _ = repo
    monkeypatch.setattr(jail, "jail_problem", lambda: "bubblewrap (bwrap) is not installed")
    with pytest.raises(JailUnavailable, match="allow_unjailed"):
        run_jailed(["true"], work)
    with pytest.raises(JailUnavailable):
        JailedEnvironment(work)
    r = run_jailed(["/bin/sh", "-c", "echo hi"], work, allow_unjailed=True)
    assert r.returncode == 0 and not r.jailed
    env = JailedEnvironment(work, sandbox=SandboxConfig(allow_unjailed=True))
    assert env.execute("echo hi")["output"] == "hi\n" and not env.results[-1][1].jailed


def _uid(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def test_an_agentic_run_without_the_jail_is_refused_unless_allowed_and_then_says_so(tmp_path, monkeypatch):
    from dataclasses import replace

    from posttrain.agentic import jail
    from posttrain.agentic.rl import debug, run_agentic

    monkeypatch.setattr(jail, "jail_problem", lambda: "bubblewrap (bwrap) is not installed")
    cfg = replace(debug(), steps=1, group_size=2, n_tasks=1, max_turns=3)
    with pytest.raises(JailUnavailable, match="unjailed"):
        run_agentic(cfg, tmp_path / "refused")
    metrics = run_agentic(replace(cfg, sandbox=SandboxConfig(allow_unjailed=True)), tmp_path / "allowed")
    assert metrics["unjailed"] == 2
    rows = [json.loads(line) for line in (tmp_path / "allowed" / "metrics.jsonl").read_text().splitlines()]
    assert [r["unjailed"] for r in rows] == [2]


_AS_NOBODY = """
import json, socket, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from jail_copy import jail_problem, run_jailed
server = socket.create_server(("127.0.0.1", 0))  # the caller's loopback: the jail must not reach it
server.settimeout(0.5)
hostile = (
    "id -u; echo ok > made.txt; touch /etc/owned || echo etc-ro; ls {checkout} >/dev/null 2>&1 || echo no-checkout; "
    "kill -9 {parent} 2>/dev/null || echo no-kill; (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null || echo no-net"
).format(checkout=sys.argv[3], parent=sys.argv[4], port=server.getsockname()[1])
r = run_jailed(["/bin/bash", "-c", hostile], Path(sys.argv[2]))
try:
    server.accept()
    reached = True
except OSError:
    reached = False
print(json.dumps({"problem": jail_problem(), "jailed": r.jailed, "out": r.stdout, "reached": reached}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="drops from root to an unprivileged uid with setpriv")
def test_a_non_root_caller_gets_the_same_jail():
    """The jail for a caller that is not root (bubblewrap in a user namespace, the caller's own uid): the module
    runs as ``nobody`` under Debian's Python (the project's venv may sit where nobody cannot read), and a hostile
    command — writes outside its repository, reads the checkout, kills its parent, dials the caller's loopback
    — fails at each step while its repository stays writable."""
    import shutil
    import subprocess
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="scifolio-jail-nonroot-"))  # pytest's tmp_path is closed to nobody
    try:
        pkg, repo = base / "pkg", base / "repo"
        pkg.mkdir()
        repo.mkdir()
        shutil.copy(ROOT / "posttrain" / "agentic" / "jail.py", pkg / "jail_copy.py")  # stdlib only
        os.chown(repo, 65534, 65534)
        for p in (base, pkg, pkg / "jail_copy.py"):
            p.chmod(0o755)
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", _AS_NOBODY]
        cmd += [str(pkg), str(repo), str(ROOT), str(os.getpid())]
        env = {"PATH": "/usr/bin:/bin", "HOME": str(repo), "TMPDIR": str(repo)}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
        made = (repo / "made.txt").read_text(), (repo / "made.txt").stat().st_uid
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["problem"] is None and got["jailed"], got
    assert got["out"].split() == ["65534", "etc-ro", "no-checkout", "no-kill", "no-net"], got
    assert not got["reached"]
    assert made == ("ok\n", 65534)
