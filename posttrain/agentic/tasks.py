"""Harness × task (SPEC §C6) with verifier integrity (SPEC §C7): executable coding tasks in a sandbox.

A ``Task`` = environment setup (a tiny repository snapshot written to a temp dir) + a natural-language
objective + a verifier (hidden tests, with fail-to-pass and pass-to-pass test names). The verifier
runs only after the agent stopped: it overlays the grading artefacts onto the agent's directory (so
agent edits to test files do not count), runs them in the sandbox, and grades all-correct: every
fail-to-pass and every pass-to-pass test must pass. Missing artefacts, a runner that crashes or times
out, and output that cannot be parsed are ``infra_error`` verdicts with ``reward None``: never a pass
or a fail, and not trained on.

Sandbox: the test runner (``python -I -B``: no stale bytecode), the harness's ``run_tests`` tool and every
command of a third-party harness (``JailedEnvironment``) run in the bubblewrap jail of ``posttrain.agentic.jail``
(what it allows is said there); ``Verdict.jailed`` records whether they did (``SandboxConfig.allow_unjailed``).

``SimpleHarness`` is a harness with its own loop: it talks to a model URL through the official
``openai`` SDK (Chat Completions), executes the tools the model calls (``write_file``, ``read_file``,
``run_tests``), answers an unparseable ``<tool_call>`` with a format-error message (as mini-swe-agent
does), and stops when the model answers without a tool call or at ``max_turns``.

Run the tests: ``python -m pytest tests/posttrain/agentic/test_tasks.py -q``
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from posttrain import toolcall
from posttrain.agentic.chat import canonical_tool
from posttrain.agentic.jail import (
    JailUnavailable,
    SandboxConfig,
    SandboxLimits,
    jail_available,
    jail_problem,
    run_jailed,
    unshare_net_works,
)

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


@lru_cache(maxsize=1)
def network_isolation() -> bool:
    """Whether commands run without the host's network here: in the jail, or else under ``unshare -n``."""
    return jail_available() or unshare_net_works()


def run_tests(
    workdir: Path, files: list[str], limits: SandboxLimits = SandboxLimits(), sandbox: SandboxConfig = SandboxConfig()
) -> tuple[dict | None, str]:
    """Run test files with the built-in runner in the jail; (results or None when unparseable, raw output)."""
    r = run_jailed([sys.executable, "-I", "-B", "-c", RUNNER, *files], workdir, limits, sandbox.allow_unjailed)
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
    jailed: bool = False
    """False when the grader ran outside the bubblewrap jail (``sandbox.allow_unjailed``)."""


def _overlay(workdir: Path, rel: str, text: str) -> None:
    """Write a grading artefact where the agent may have left a symlink or a directory: this runs outside the
    jail, so it must never follow the agent's links out of the repository."""
    root = workdir.resolve()
    target = root / rel
    parent = target.parent
    if parent.is_symlink() or (parent.exists() and root not in (parent.resolve(), *parent.resolve().parents)):
        raise ValueError(f"grading artefact {rel}: its directory leaves the repository")
    parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.exists():
        shutil.rmtree(target)
    target.write_text(text)


def verify(
    task: Task,
    workdir: Path,
    limits: SandboxLimits = SandboxLimits(),
    grading_dir: Path | None = None,
    sandbox: SandboxConfig = SandboxConfig(),
) -> Verdict:
    """Overlay the hidden tests onto ``workdir`` (after the agent stopped), run them in the jail, grade
    all-correct. Raises ``JailUnavailable`` when the jail cannot start and ``sandbox`` does not allow that.

    ``grading_dir``: where the artefacts come from (default: the task's own ``hidden_tests``); a test
    can point it at an incomplete copy to simulate missing artefacts.
    """
    artefacts = dict(task.hidden_tests)
    if grading_dir is not None:
        artefacts = {rel: (grading_dir / rel).read_text() for rel in task.hidden_tests if (grading_dir / rel).exists()}
    missing = sorted(set(task.hidden_tests) - set(artefacts))
    if missing:
        return Verdict(INFRA, None, f"missing grading artefacts: {missing}", jailed=jail_available())
    try:
        for rel, text in artefacts.items():  # overwrite whatever the agent left at these paths
            _overlay(workdir, rel, text)
    except ValueError as e:  # the agent replaced a test directory by a link out: its attempt fails
        return Verdict(FAIL, 0.0, str(e), jailed=jail_available())
    results, raw = run_tests(workdir, sorted(artefacts), limits, sandbox)
    iso, jailed = network_isolation(), jail_available()
    if results is None:
        return Verdict(INFRA, None, "verifier output unparseable or runner crashed:\n" + raw[-2000:], {}, iso, jailed)
    wanted = task.fail_to_pass + task.pass_to_pass
    for t in wanted:  # a test file that no longer imports (the agent broke the code under test) fails its tests
        if t not in results and results.get(t.split("::")[0] + "::<import>") == "error":
            results[t] = "failed"
    absent = [t for t in wanted if t not in results]
    if absent:
        return Verdict(INFRA, None, f"tests not reported by the runner: {absent}", results, iso, jailed)
    bad = [t for t in wanted if results[t] != "passed"]
    if bad:
        return Verdict(FAIL, 0.0, f"not passing: {bad}", results, iso, jailed)
    return Verdict(PASS, 1.0, "all fail-to-pass and pass-to-pass tests pass", results, iso, jailed)


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
_PATH = {"path": {"type": "string"}}
HARNESS_TOOLS = [
    canonical_tool(
        "write_file",
        "Write a file in the repository",
        {"type": "object", "properties": {**_PATH, "content": {"type": "string"}}, "required": ["path", "content"]},
    ),
    canonical_tool(
        "read_file", "Read a file of the repository", {"type": "object", "properties": _PATH, "required": ["path"]}
    ),
    canonical_tool("run_tests", "Run the repository's visible tests", None),
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

    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str = "scifolio",
        max_turns: int = 6,
        sandbox: SandboxConfig = SandboxConfig(),
    ) -> None:
        self.base_url, self.api_key, self.model, self.max_turns = base_url, api_key, model, max_turns
        self.sandbox = sandbox
        if not sandbox.allow_unjailed and not jail_available():  # refuse before the model is called, not mid-run
            raise JailUnavailable(f"{jail_problem()}; refusing to run agent commands unjailed")

    def _tool(self, workdir: Path, name: str, args: dict[str, Any]) -> tuple[str, bool]:
        try:
            if name in ("write_file", "read_file"):
                target = (workdir / args["path"]).resolve()
                if workdir.resolve() not in target.parents:
                    return "Error: path outside the repository", True
            if name == "write_file":
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(args["content"])
                return f"wrote {args['path']}", False
            if name == "read_file":
                return target.read_text(), False
            if name == "run_tests":
                files = sorted(p.name for p in workdir.glob("test_*.py"))
                results, raw = run_tests(workdir, files, sandbox=self.sandbox)
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
            if not m.tool_calls and toolcall.OPEN in (m.content or ""):
                # a tool call the gateway could not parse: say so and go on (a format error, not an answer)
                feedback = f"Error: malformed tool call; emit {toolcall.OPEN}{{json}}{toolcall.CLOSE}"
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
