"""The jail every agent command and grader runs in: bubblewrap (Debian ``bubblewrap``, ``bwrap``).

What a jailed command sees and may do:
- the system (``/usr``, ``/etc``) and the Python that runs it (its installation and virtual environment)
  read-only, each bound at its own path; nothing else of the host: not the project checkout, not other
  tasks' directories, not the trace store, not ``~/.ray``;
- the task's repository, the only writable place, and a private, size-capped ``/tmp``;
- its own network namespace (only its own loopback: 127.0.0.1 reaches nothing of the host), new PID, IPC
  and UTS namespaces (it cannot see or signal the host's processes; when its first process ends, the kernel
  kills everything else it started, daemons included);
- an unprivileged uid: when the caller is root (CI), bubblewrap sets up the mounts and ``setpriv`` drops to
  ``nobody`` (65534) before the command runs, so the command is unprivileged inside and outside (RLIMIT_NPROC
  bites, and escaping the mount namespace would still find root's files closed); for any other caller,
  bubblewrap's user namespace keeps the caller's own uid (tested as ``nobody``; where the kernel forbids
  unprivileged user namespaces, ``jail_problem`` says so and which setting is missing);
- ``--die-with-parent``, rlimits (CPU seconds, address space, largest file, processes) and a wall-clock
  timeout that kills the whole process group.

When bubblewrap cannot start here, ``run_jailed`` raises ``JailUnavailable`` unless the caller passed
``allow_unjailed=True`` (``--set sandbox.allow_unjailed=true``); then the command runs with the rlimits only
and its ``SandboxResult.jailed`` is False, which every verdict and metric carries.

Run the tests: ``python -m pytest tests/posttrain/agentic/test_jail.py -q``
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

NOBODY = 65534
_USERNS_HINT = "sysctl user.max_user_namespaces > 0; kernel.unprivileged_userns_clone=1 where it exists"


@dataclass(frozen=True)
class SandboxLimits:
    """Per-command limits of the sandbox."""

    wall_s: float = 20.0
    """Wall-clock timeout (the process group, and with the jail its whole PID namespace, is killed)."""
    cpu_s: int = 10
    """RLIMIT_CPU seconds."""
    memory_mb: int = 1024
    """RLIMIT_AS megabytes."""
    file_mb: int = 16
    """RLIMIT_FSIZE megabytes (largest file the command may write)."""
    nproc: int = 256
    """RLIMIT_NPROC: processes of the jail's uid (a fork bomb stops here; only enforced for a non-root uid)."""
    tmp_mb: int = 64
    """Size of the private ``/tmp`` (a tmpfs: it is memory)."""
    output_kb: int = 256
    """Kept tail of each of stdout and stderr."""


@dataclass(frozen=True)
class SandboxConfig:
    """``--set sandbox.…``: how agent commands and graders are confined."""

    allow_unjailed: bool = False
    """Run commands with rlimits only when bubblewrap cannot start here (refused otherwise). Every verdict
    (``Verdict.jailed``) and the run's metrics (``unjailed``) then say so."""


@dataclass
class SandboxResult:
    returncode: int | None
    """None when it was killed by the wall-clock timeout."""
    stdout: str
    stderr: str
    isolated: bool
    """True when it ran without the host's network (its own network namespace)."""
    jailed: bool = False
    """True when it ran in the bubblewrap jail (filesystem, PID/IPC/UTS/network namespaces, unprivileged uid)."""
    timed_out: bool = False


class JailUnavailable(RuntimeError):
    """bubblewrap cannot start here and running unjailed was not allowed."""


def _python_roots() -> list[str]:
    """Directories the running Python needs, read-only: its installation and its virtual environment (each
    at the path the interpreter is known by, and at its real path)."""
    roots = {sys.base_prefix, sys.prefix, os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}
    return sorted(r for r in roots if r and not r.startswith("/usr/") and r != "/usr")


def _mkdirs(path: str, made: set[str]) -> list[str]:
    """bwrap ``--dir`` arguments (mode 0755) for the ancestors of ``path``: bwrap creates missing parents
    0700, which an unprivileged uid cannot traverse."""
    out: list[str] = []
    cur = ""
    for p in Path(path).parts[1:-1]:
        cur += "/" + p
        if cur not in made:
            made.add(cur)
            out += ["--perms", "0755", "--dir", cur]
    return out


def bwrap_argv(argv: list[str], workdir: Path, limits: SandboxLimits, uid: int | None = None) -> list[str]:
    """The bubblewrap command line that runs ``argv`` in ``workdir`` (see the module docstring)."""
    bwrap = shutil.which("bwrap") or "bwrap"
    work = str(Path(workdir).resolve())
    cmd = [bwrap, "--ro-bind", "/usr", "/usr"]
    for d in ("bin", "lib", "lib64", "sbin"):
        p = "/" + d
        if os.path.islink(p):
            cmd += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            cmd += ["--ro-bind", p, p]
    cmd += ["--ro-bind", "/etc", "/etc"]
    made: set[str] = {"/usr", "/etc", "/tmp"}
    # The private /tmp first: a Python (a CI checkout's venv) or a task directory under /tmp is bound over it.
    cmd += ["--size", str(limits.tmp_mb * 2**20), "--perms", "1777", "--tmpfs", "/tmp"]
    for r in _python_roots():
        real = os.path.realpath(r)
        cmd += _mkdirs(r, made) + ["--ro-bind", real, r]
        made.add(r)
    cmd += _mkdirs(work, made) + ["--bind", work, work, "--chdir", work]
    cmd += ["--proc", "/proc", "--dev", "/dev"]
    cmd += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--unshare-cgroup-try"]
    cmd += ["--hostname", "jail", "--die-with-parent", "--new-session", "--remount-ro", "/"]
    if (
        os.geteuid() == 0
    ):  # bwrap (privileged) builds the mounts, then the command drops to an unprivileged uid for good
        u = NOBODY if uid is None else uid
        cmd += ["--", "setpriv", f"--reuid={u}", f"--regid={u}", "--clear-groups", "--"]
    else:
        cmd += ["--unshare-user", "--disable-userns", "--"]
    return cmd + argv


_probe_lock = threading.Lock()


def jail_problem() -> str | None:
    """None when the jail starts here, else why not (cached: probed once per process, by one thread at a time:
    concurrent harness sessions ask at once)."""
    with _probe_lock:
        return _jail_problem()


@lru_cache(maxsize=1)
def _jail_problem() -> str | None:
    if not shutil.which("bwrap"):
        return "bubblewrap (bwrap) is not installed (Debian: apt-get install bubblewrap; `make system-deps`)"
    if os.geteuid() == 0 and not shutil.which("setpriv"):
        return "setpriv (util-linux) is not installed"
    probe = Path(os.environ.get("TMPDIR", "/tmp")) / f"scifolio-jail-probe-{os.getpid()}"
    probe.mkdir(exist_ok=True)
    try:
        _own(probe)
        r = subprocess.run(
            bwrap_argv(["/bin/sh", "-c", "touch ok"], probe, SandboxLimits()), capture_output=True, timeout=30
        )
        if r.returncode != 0 or not (probe / "ok").exists():
            err = r.stderr.decode(errors="replace").strip()[-500:]
            if os.geteuid() != 0 and "namespace" in err.lower():
                err += f" — not root: unprivileged user namespaces are needed ({_USERNS_HINT}), or run as root"
            return f"bubblewrap does not start here: {err}"
        return None
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bubblewrap does not start here: {e!r}"
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def jail_available() -> bool:
    return jail_problem() is None


def _own(workdir: Path) -> None:
    """As root, hand the repository to the jail's uid (it is the only place it may write)."""
    if os.geteuid() != 0:
        return
    for dirpath, dirnames, filenames in os.walk(workdir):
        for name in (dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)):
            with contextlib.suppress(FileNotFoundError):
                os.lchown(name, NOBODY, NOBODY)


def run_jailed(
    argv: list[str],
    cwd: Path,
    limits: SandboxLimits = SandboxLimits(),
    allow_unjailed: bool = False,
    stdin: str | None = None,
) -> SandboxResult:
    """Run ``argv`` in the jail with ``cwd`` (the task's repository) as its only writable directory."""
    problem = jail_problem()
    if problem is not None and not allow_unjailed:
        raise JailUnavailable(problem + "; refusing to run agent code unjailed (--set sandbox.allow_unjailed=true)")
    jailed = problem is None

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s))
        mem = limits.memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        fsz = limits.file_mb * 2**20
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsz, fsz))
        if jailed:  # unjailed the caller's own uid runs it: its other processes would count
            resource.setrlimit(resource.RLIMIT_NPROC, (limits.nproc, limits.nproc))
        os.setsid()

    if jailed:
        _own(Path(cwd))
        cmd = bwrap_argv(argv, Path(cwd), limits)
        isolated = True
    else:
        isolated = unshare_net_works()
        cmd = (["unshare", "-n"] if isolated else []) + argv
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8"}
    # Its own session (setsid in ``limit``): on timeout, and after it exits, the whole process group is killed;
    # in the jail, killing bwrap ends its PID namespace, so a daemon that left the group dies too.
    p = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=limit,
    )
    keep = limits.output_kb * 1024
    try:
        out, err = p.communicate(stdin.encode() if stdin is not None else None, timeout=limits.wall_s)
    except subprocess.TimeoutExpired:
        _kill_group(p.pid)
        out, _ = p.communicate()
        return SandboxResult(None, _tail(out, keep), "timeout", isolated, jailed, True)
    finally:
        _kill_group(p.pid)
    return SandboxResult(p.returncode, _tail(out, keep), _tail(err, keep), isolated, jailed)


def _tail(b: bytes | None, keep: int) -> str:
    return (b or b"")[-keep:].decode(errors="replace")


@lru_cache(maxsize=1)
def unshare_net_works() -> bool:
    """Whether ``unshare -n`` works here (needs root / CAP_SYS_ADMIN): the unjailed fallback's network cut."""
    try:  # not installed: OSError
        return subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # nothing left in the group
        os.killpg(pgid, signal.SIGKILL)


class JailedEnvironment:
    """The environment through which a third-party harness runs its shell commands: each ``execute`` is one
    ``bash -c`` in the jail, in the task's repository. Shaped as mini-swe-agent's ``LocalEnvironment``
    (``execute(action) -> {"output", "returncode", "exception_info"}``, ``get_template_vars``, ``serialize``)
    without importing it; ``results`` records every command's outcome (a hostile command's failure included).
    """

    SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"

    def __init__(
        self,
        cwd: str | Path,
        limits: SandboxLimits = SandboxLimits(),
        sandbox: SandboxConfig = SandboxConfig(),
        timeout: float | None = None,
    ) -> None:
        self.cwd, self.limits, self.sandbox, self.timeout = Path(cwd), limits, sandbox, timeout
        self.results: list[tuple[str, SandboxResult]] = []
        if jail_problem() is not None and not sandbox.allow_unjailed:
            raise JailUnavailable(str(jail_problem()) + "; refusing to run agent commands unjailed")

    def execute(self, action: dict | str, cwd: str = "", *, timeout: float | None = None) -> dict:
        command = action if isinstance(action, str) else action.get("command", "")
        wall = timeout or self.timeout or self.limits.wall_s
        limits = SandboxLimits(**{**self.limits.__dict__, "wall_s": float(wall)})
        r = run_jailed(["/bin/bash", "-c", command], self.cwd, limits, self.sandbox.allow_unjailed)
        self.results.append((command, r))
        output = {
            "output": r.stdout + ("" if r.timed_out else r.stderr),
            "returncode": -1 if r.returncode is None else r.returncode,
            "exception_info": f"the command timed out after {wall:g} s and was killed" if r.timed_out else "",
        }
        lines = output["output"].lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == self.SUBMIT and output["returncode"] == 0:
            from minisweagent.exceptions import Submitted  # only a mini-swe-agent run gets here

            submission = "".join(lines[1:])
            raise Submitted(
                {"role": "exit", "content": submission, "extra": {"exit_status": "Submitted", "submission": submission}}
            )
        return output

    def get_template_vars(self, **kwargs: object) -> dict:
        import platform

        return {"cwd": str(self.cwd), "timeout": self.limits.wall_s, **platform.uname()._asdict(), **kwargs}

    def serialize(self) -> dict:
        env = {"cwd": str(self.cwd), "jailed": jail_available(), "limits": self.limits.__dict__}
        return {"info": {"config": {"environment": env, "environment_type": f"{__name__}.JailedEnvironment"}}}
