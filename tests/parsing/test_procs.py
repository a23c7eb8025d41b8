"""A parse helper whose parent is killed while the helper is still starting must not outlive it.

The kernel's parent-death signal only covers deaths after the request (``die_with_parent``); a helper spawned just
before its worker was killed on a page timeout used to stay behind for good, blocked on a queue whose write end it
holds itself (seen under a loaded CI run: two idle orphans per killed worker).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A parent that starts one helper exactly as parsing.helpers does (spawn, the helpers' initializer), with the
# initializer held back a moment, and kills itself (SIGKILL) while the helper is still starting.
PARENT = textwrap.dedent(
    """
    import multiprocessing, os, sys, time
    from concurrent.futures import ProcessPoolExecutor

    def slow_init():
        time.sleep(2)  # still starting when the parent dies
        from parsing.helpers import _init_helper
        _init_helper()

    if __name__ == "__main__":
        pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=slow_init)
        pool.submit(os.getpid)
        (helper,) = pool._processes
        with open(sys.argv[1], "w") as f:
            f.write(str(helper))
        time.sleep(0.5)
        os.kill(os.getpid(), 9)
    """
)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_helper_of_a_parent_killed_during_its_start_exits(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    pid_file, log = tmp_path / "helper.pid", tmp_path / "log"
    with log.open("w") as out:  # not a pipe: the helper inherits it, and a pipe would stay open as long as it lives
        done = subprocess.run(
            [sys.executable, str(script), str(pid_file)], env=env, stdout=out, stderr=out, timeout=120
        )
    assert done.returncode == -9, log.read_text()[-2000:]
    helper = int(pid_file.read_text())
    deadline = time.monotonic() + 60
    while _alive(helper) and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = _alive(helper)
    if alive:
        os.kill(helper, 9)
    assert not alive, "the helper outlived its killed parent"


def test_die_with_parent_exits_when_the_parent_is_already_gone():
    code = (
        "import os, sys; from parsing.procs import die_with_parent; die_with_parent(int(sys.argv[1])); print('alive')"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = lambda pid: subprocess.run([sys.executable, "-c", code, str(pid)], env=env, capture_output=True, text=True)  # noqa: E731
    assert run(os.getpid()).stdout == "alive\n"  # started by this process: keeps running
    gone = run(os.getpid() + 1_000_000)  # started by a process that is not its parent now: it was reparented
    assert gone.returncode != 0 and gone.stdout == ""
