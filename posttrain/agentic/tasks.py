"""Harness × task (SPEC §C6) with verifier integrity (SPEC §C7): executable coding tasks in a sandbox.

A ``Task`` = environment setup (a tiny repository snapshot written to a temp dir) + a natural-language
objective + a verifier (hidden tests, with fail-to-pass and pass-to-pass test names). The verifier
runs only after the agent stopped: it overlays the grading artefacts onto the agent's directory (so
agent edits to test files do not count), runs them in the sandbox, and grades all-correct: every
fail-to-pass and every pass-to-pass test must pass. Missing artefacts, a runner that crashes or times
out, and output that cannot be parsed are ``infra_error`` verdicts with ``reward None``: never a pass
or a fail, and not trained on.

Sandbox: a subprocess in the task directory, ``python -I -B`` (no stale bytecode), a scrubbed environment, CPU-seconds,
address-space and file-size limits (``resource``), a wall-clock timeout, and no network: inside
``unshare -n`` (a fresh network namespace with no interfaces up) when that works here (root); when it
does not, ``SandboxResult.isolated`` is False and says so.

``SimpleHarness`` is a harness with its own loop: it talks to a model URL through the official
``openai`` SDK (Chat Completions), executes the tools the model calls (``write_file``, ``read_file``,
``run_tests``), answers an unparseable ``<tool_call>`` with a format-error message (as mini-swe-agent
does), and stops when the model answers without a tool call or at ``max_turns``.

Run the tests: ``python -m pytest tests/posttrain/agentic/test_tasks.py -q``
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

PASS, FAIL, INFRA = "pass", "fail", "infra_error"

# Runs every ``test_*`` function of the given files and prints one JSON line; the verifier parses it.
RUNNER = r"""
import importlib.util, json, os, sys
sys.path.insert(0, os.getcwd())
results = {}
for path in sys.argv[1:]:
    spec = importlib.util.spec_from_file_location(path[:-3].replace("/", "."), path)
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except Exception:
        results[path + "::<import>"] = "error"
        continue
    for name in sorted(n for n in dir(mod) if n.startswith("test_")):
        try:
            getattr(mod, name)()
            results[path + "::" + name] = "passed"
        except Exception:
            results[path + "::" + name] = "failed"
print("__RESULTS__ " + json.dumps(results))
"""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-command limits of the sandbox."""

    wall_s: float = 20.0
    """Wall-clock timeout (the process group is killed)."""
    cpu_s: int = 10
    """RLIMIT_CPU seconds."""
    memory_mb: int = 1024
    """RLIMIT_AS megabytes."""
    file_mb: int = 16
    """RLIMIT_FSIZE megabytes (largest file the command may write)."""


@dataclass
class SandboxResult:
    returncode: int | None
    """None when it was killed by the wall-clock timeout."""
    stdout: str
    stderr: str
    isolated: bool
    """True when it ran without network (its own network namespace)."""


@lru_cache(maxsize=1)
def network_isolation() -> bool:
    """Whether ``unshare -n`` works here (needs root / CAP_SYS_ADMIN)."""
    if not shutil.which("unshare"):
        return False
    try:
        return subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def run_sandboxed(argv: list[str], cwd: Path, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s))
        mem = limits.memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        fsz = limits.file_mb * 2**20
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsz, fsz))
        os.setsid()

    isolated = network_isolation()
    cmd = (["unshare", "-n"] if isolated else []) + argv
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8"}
    # Its own session (setsid in ``limit``): on timeout, and after it exits, the whole process group is killed,
    # so a test that forks or leaves a daemon behind cannot outlive its command.
    p = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=limit
    )
    try:
        out, err = p.communicate(timeout=limits.wall_s)
    except subprocess.TimeoutExpired:
        _kill_group(p.pid)
        out, _ = p.communicate()
        return SandboxResult(None, out or "", "timeout", isolated)
    finally:
        _kill_group(p.pid)
    return SandboxResult(p.returncode, out, err, isolated)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # nothing left in the group


def run_tests(workdir: Path, files: list[str], limits: SandboxLimits = SandboxLimits()) -> tuple[dict | None, str]:
    """Run test files with the built-in runner; (results or None when unparseable, raw output)."""
    r = run_sandboxed([sys.executable, "-I", "-B", "-c", RUNNER, *files], workdir, limits)
    for line in r.stdout.splitlines():
        if line.startswith("__RESULTS__ "):
            try:
                return json.loads(line[len("__RESULTS__ ") :]), r.stdout + r.stderr
            except json.JSONDecodeError:
                break
    return None, f"returncode={r.returncode}\n{r.stdout}\n{r.stderr}"


@dataclass(frozen=True)
class Task:
    """One executable coding task."""

    task_id: str
    objective: str
    files: dict[str, str]
    """The repository snapshot the agent starts from (path → content), incl. visible tests."""
    hidden_tests: dict[str, str]
    """Grading artefacts (path → content), overlaid after the agent stops."""
    fail_to_pass: tuple[str, ...]
    """Test ids (``file::function``) failing on the snapshot that must pass."""
    pass_to_pass: tuple[str, ...]
    """Test ids passing on the snapshot that must still pass."""
    reference_patch: dict[str, str] = field(default_factory=dict)
    """A known-good solution (path → content): scripted policies and verifier self-tests use it."""

    def setup(self, root: Path) -> Path:
        """Write the snapshot into ``root/task_id`` (a fresh directory) and return it."""
        work = Path(root) / self.task_id
        if work.exists():
            shutil.rmtree(work)
        for rel, text in self.files.items():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).write_text(text)
        return work


@dataclass
class Verdict:
    status: str
    """PASS, FAIL or INFRA (infrastructure failure: not a grade)."""
    reward: float | None
    """1.0 pass, 0.0 fail, None for INFRA (excluded from training)."""
    detail: str = ""
    results: dict[str, str] = field(default_factory=dict)
    isolated: bool = False


def verify(
    task: Task, workdir: Path, limits: SandboxLimits = SandboxLimits(), grading_dir: Path | None = None
) -> Verdict:
    """Overlay the hidden tests onto ``workdir`` (after the agent stopped), run them, grade all-correct.

    ``grading_dir``: where the artefacts come from (default: the task's own ``hidden_tests``); a test
    can point it at an incomplete copy to simulate missing artefacts.
    """
    artefacts = dict(task.hidden_tests)
    if grading_dir is not None:
        artefacts = {rel: (grading_dir / rel).read_text() for rel in task.hidden_tests if (grading_dir / rel).exists()}
    missing = sorted(set(task.hidden_tests) - set(artefacts))
    if missing:
        return Verdict(INFRA, None, f"missing grading artefacts: {missing}")
    for rel, text in artefacts.items():  # overwrite whatever the agent left at these paths
        (workdir / rel).parent.mkdir(parents=True, exist_ok=True)
        (workdir / rel).write_text(text)
    results, raw = run_tests(workdir, sorted(artefacts), limits)
    iso = network_isolation()
    if results is None:
        return Verdict(INFRA, None, "verifier output unparseable or runner crashed:\n" + raw[-2000:], isolated=iso)
    wanted = task.fail_to_pass + task.pass_to_pass
    for t in wanted:  # a test file that no longer imports (the agent broke the code under test) fails its tests
        if t not in results and results.get(t.split("::")[0] + "::<import>") == "error":
            results[t] = "failed"
    absent = [t for t in wanted if t not in results]
    if absent:
        return Verdict(INFRA, None, f"tests not reported by the runner: {absent}", results, iso)
    bad = [t for t in wanted if results[t] != "passed"]
    if bad:
        return Verdict(FAIL, 0.0, f"not passing: {bad}", results, iso)
    return Verdict(PASS, 1.0, "all fail-to-pass and pass-to-pass tests pass", results, iso)


def coding_tasks() -> list[Task]:
    """A small family of executable tasks (each fixable with one ``write_file``)."""
    calc = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a + b\n"
    text = "def shout(s):\n    return s.upper()\n\n\ndef reverse(s):\n    return s\n"
    stats = "def mean(xs):\n    return sum(xs) / len(xs)\n\n\ndef maximum(xs):\n    return min(xs)\n"
    return [
        Task(
            "calc-sub",
            "Fix `sub` in calc.py so that sub(a, b) returns a - b. Keep `add` working.",
            {"calc.py": calc, "test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"},
            {
                "test_calc.py": "from calc import add, sub\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
                "def test_sub():\n    assert sub(5, 3) == 2\n    assert sub(0, 4) == -4\n"
            },
            ("test_calc.py::test_sub",),
            ("test_calc.py::test_add",),
            {"calc.py": calc[: calc.rindex("a + b")] + "a - b\n"},
        ),
        Task(
            "text-reverse",
            "Fix `reverse` in text.py so it returns the string reversed. Keep `shout` working.",
            {
                "text.py": text,
                "test_text.py": "from text import shout\n\n\ndef test_shout():\n    assert shout('a') == 'A'\n",
            },
            {
                "test_text.py": "from text import reverse, shout\n\n\ndef test_shout():\n    assert shout('a') == 'A'\n\n\n"
                "def test_reverse():\n    assert reverse('abc') == 'cba'\n"
            },
            ("test_text.py::test_reverse",),
            ("test_text.py::test_shout",),
            {"text.py": text.replace("    return s\n", "    return s[::-1]\n")},
        ),
        Task(
            "stats-max",
            "Fix `maximum` in stats.py so it returns the largest element. Keep `mean` working.",
            {
                "stats.py": stats,
                "test_stats.py": "from stats import mean\n\n\ndef test_mean():\n    assert mean([1, 3]) == 2\n",
            },
            {
                "test_stats.py": "from stats import maximum, mean\n\n\ndef test_mean():\n    assert mean([1, 3]) == 2\n\n\n"
                "def test_maximum():\n    assert maximum([1, 5, 2]) == 5\n"
            },
            ("test_stats.py::test_maximum",),
            ("test_stats.py::test_mean",),
            {"stats.py": stats.replace("return min(xs)", "return max(xs)")},
        ),
    ]


# -- a harness with its own loop -----------------------------------------------------------------------
HARNESS_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file in the repository",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the repository",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_tests",
            "description": "Run the repository's visible tests",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]


@dataclass
class ToolEvent:
    name: str
    arguments: str
    """Canonical (sorted-key JSON) arguments."""
    failed: bool
    output: str


@dataclass
class HarnessRun:
    turns: int
    stopped_by: str
    """"answer" (a reply without tool calls), "max_turns" or "error"."""
    tool_events: list[list[ToolEvent]]
    """Per model call, the tools it called (empty for a plain answer)."""
    final_text: str = ""


class SimpleHarness:
    """Own loop, tools and stop rule; given only an objective, a working directory and a model URL."""

    def __init__(self, base_url: str, api_key: str, model: str = "scifolio", max_turns: int = 6) -> None:
        self.base_url, self.api_key, self.model, self.max_turns = base_url, api_key, model, max_turns

    def _tool(self, workdir: Path, name: str, args: dict[str, Any]) -> tuple[str, bool]:
        try:
            if name == "write_file":
                target = (workdir / args["path"]).resolve()
                if workdir.resolve() not in target.parents:
                    return "Error: path outside the repository", True
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(args["content"])
                return f"wrote {args['path']}", False
            if name == "read_file":
                target = (workdir / args["path"]).resolve()
                if workdir.resolve() not in target.parents:
                    return "Error: path outside the repository", True
                return target.read_text(), False
            if name == "run_tests":
                files = sorted(p.name for p in workdir.glob("test_*.py"))
                results, raw = run_tests(workdir, files)
                if results is None:
                    return "Error: " + raw[-500:], True
                failed = [k for k, v in results.items() if v != "passed"]
                return json.dumps(results), bool(failed)
            return f"Error: unknown tool {name}", True
        except Exception as e:  # a tool error is an observation for the model, not a crash of the harness
            return f"Error: {type(e).__name__}: {e}", True

    def run(self, objective: str, workdir: Path) -> HarnessRun:
        import openai

        client = openai.OpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=0)
        msgs: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a coding agent. Use the tools, then answer briefly."},
            {"role": "user", "content": objective},
        ]
        events: list[list[ToolEvent]] = []
        for turn in range(1, self.max_turns + 1):
            r = client.chat.completions.create(model=self.model, messages=msgs, tools=HARNESS_TOOLS)
            m = r.choices[0].message
            msgs.append(m.model_dump(exclude_none=True))
            if not m.tool_calls and "<tool_call>" in (m.content or ""):
                # a tool call the gateway could not parse: say so and go on (a format error, not an answer)
                feedback = "Error: malformed tool call; emit <tool_call>{json}</tool_call>"
                events.append([ToolEvent("<malformed>", "", True, feedback)])
                msgs.append({"role": "user", "content": feedback})
                continue
            if not m.tool_calls:
                events.append([])
                return HarnessRun(turn, "answer", events, m.content or "")
            step = []
            for c in m.tool_calls:
                try:
                    args = json.loads(c.function.arguments or "{}")
                except json.JSONDecodeError:
                    args = {}
                out, failed = self._tool(workdir, c.function.name, args)
                step.append(ToolEvent(c.function.name, json.dumps(args, sort_keys=True), failed, out))
                msgs.append({"role": "tool", "tool_call_id": c.id, "content": out})
            events.append(step)
        return HarnessRun(self.max_turns, "max_turns", events)
