"""Agentic RL: rollouts of a harness over tasks through the gateway, session credit (Eq 30), learner steps.

Per group (one task, ``group_size`` sessions named ``GROUP:ROLLOUT`` so they share one PrefixTree):
each session runs ``SimpleHarness`` against the gateway; the verifier grades the directory it leaves;
infrastructure failures are dropped from the group (never a 0 reward). Credit: the group-relative
(leave-one-out) session advantage A_i goes to every trainable segment of the session's stored path,
scaled by the deterministic process weight w_{i,k} when A_i > 0 (``posttrain.objectives.credit``), on the exact
token spans the trace store recorded. The learner step is the RL-loop learner's own update (detached IS
weight, BKL mask, Eq 29) with these per-token advantages, which the batch carries (``Batch.advantages``) in place of
the scalar rewards ``Learner.train`` would otherwise shape.

Run: ``python -c "from posttrain.agentic.rl import run_agentic, debug; print(run_agentic(debug(), '/tmp/ag'))"``
"""

from __future__ import annotations

import functools
import json
import tempfile
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from formats.records import Dropped
from posttrain import toolcall
from posttrain.agentic.jail import SandboxConfig
from posttrain.agentic.tasks import INFRA, HarnessRun, SimpleHarness, Task, coding_tasks, verify
from posttrain.agentic.traces import TraceStore
from posttrain.objectives.advantages import loo_advantages
from posttrain.objectives.credit import Step, annotate, segment_advantages
from posttrain.rl import engines
from posttrain.rl.engines import EngineConfig, PolicyConfig, config_is_moe
from posttrain.rl.loop import Stage, run_stage
from posttrain.rollout.scheduler import Batch
from posttrain.rollout.types import Request


# -- credit on stored spans ----------------------------------------------------------------------------
def session_steps(
    store: TraceStore, session: str, run: HarnessRun | None, tools: set[str], export: dict[str, Any] | None = None
) -> list[Step]:
    """One annotator ``Step`` per trainable segment of the session's exported path (``export``: its
    ``session_export``, read here when not given), in order."""
    ex = export if export is not None else store.session_export(session)
    order = store.session_calls[session]
    steps = []
    for cid in ex["calls"]:
        if store.nodes[store.calls[cid]["response_node"]].skip:
            continue
        meta = store.calls[cid]["meta"]
        j = order.index(cid)
        calls = meta.get("tool_calls", [])
        bad = [c for c in calls if c["name"] not in tools]
        call = (bad or calls or [None])[0]
        events = run.tool_events[j] if run is not None and j < len(run.tool_events) else []
        steps.append(
            Step(
                well_formed=bool(meta.get("well_formed", True)),
                tool=None if call is None else call["name"],
                arguments="" if call is None else json.dumps(call["arguments"], sort_keys=True),
                call_failed=any(e.failed for e in events),
                hit_limit=run is not None and run.stopped_by == "max_turns" and j == len(order) - 1,
            )
        )
    return steps


def session_credit(
    store: TraceStore,
    sessions: list[str],
    advantages: list[float],
    weights: list[list[float]],
    exports: list[dict[str, Any]] | None = None,
) -> list[list[float]]:
    """Eq 30 per token of each session's exported path (0 on non-trainable tokens); ``exports``: the sessions'
    ``session_export``, read here when not given."""
    exports = exports if exports is not None else [store.session_export(s) for s in sessions]
    T = max(len(e["token_ids"]) for e in exports)
    K = max(max((len(w) for w in weights), default=0), 1)
    seg = torch.full((len(sessions), T), -1, dtype=torch.long)
    w = torch.zeros(len(sessions), K)
    for i, (e, wi) in enumerate(zip(exports, weights)):
        if len(wi) != e["n_segments"]:
            raise ValueError(f"{sessions[i]}: {len(wi)} weights for {e['n_segments']} trainable segments")
        seg[i, : len(e["segment_ids"])] = torch.tensor(e["segment_ids"])
        w[i, : len(wi)] = torch.tensor(wi)
    out = segment_advantages(torch.tensor(advantages, dtype=torch.float32), w, seg)
    return [out[i, : len(e["token_ids"])].tolist() for i, e in enumerate(exports)]


# -- a scripted agent policy (its tool calls written by ``toolcall.render``) ----------------------------
BEHAVIOURS = ("fix", "edit_tests", "break_p2p", "malformed_then_fix")


def behaviour_replies(task: Task, behaviour: str) -> list[str]:
    """The replies a scripted agent gives, turn by turn (each answers the previous tool results)."""
    ((path, good),) = task.reference_patch.items()
    test_file = next(iter(task.hidden_tests))
    if behaviour == "fix":
        return [
            toolcall.render("run_tests", {}),
            toolcall.render("write_file", {"path": path, "content": good}),
            "Fixed.",
        ]
    if behaviour == "edit_tests":
        trivial = "def test_ok():\n    assert True\n"
        return [toolcall.render("write_file", {"path": test_file, "content": trivial}), "Tests pass."]
    if behaviour == "break_p2p":  # the fix, but every other function of the file is deleted
        fn = task.fail_to_pass[0].split("::test_")[1]
        kept = "def " + fn + good.split("def " + fn, 1)[1].split("\n\n\n")[0]
        return [toolcall.render("write_file", {"path": path, "content": kept + "\n"}), "Done."]
    if behaviour == "malformed_then_fix":
        bad = toolcall.OPEN + '{"name": "write_file", oops' + toolcall.CLOSE
        return [bad, *behaviour_replies(task, "fix")[1:]]
    raise ValueError(behaviour)


class ScriptedAgent:
    """``script`` for ``ScriptedTokenEngine``: session ``GROUP:ROLLOUT`` → its behaviour's next reply."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.replies: dict[str, list[str]] = {}
        self.given: dict[str, dict[str, list[int]]] = {}
        """session → request id → the reply's ids (a call paused across a sync is admitted again: the same reply)"""

    def assign(self, session: str, replies: list[str]) -> None:
        self.replies[session] = list(replies)

    def forget(self, session: str) -> None:
        """Drop a finished session's script and replies (a long run would otherwise keep every one)."""
        self.replies.pop(session, None)
        self.given.pop(session, None)

    def __call__(self, req: Request) -> list[int]:
        given = self.given.setdefault(req.group_id, {})
        if req.request_id not in given:
            queue = self.replies.get(req.group_id)
            text = queue.pop(0) if queue else "I give up."
            given[req.request_id] = self.tok.encode(text, add_special_tokens=False) + [self.im_end]
        return given[req.request_id]


# -- the run -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AgenticConfig:
    """``scifolio posttrain agentic`` (rollouts of a harness over tasks, then learner steps)."""

    steps: int = 2
    """Learner steps (one group per task per step)."""
    group_size: int = 4
    """Sessions per task per step (the group of the leave-one-out baseline)."""
    n_tasks: int = 2
    """Tasks used (the first ``n_tasks`` of ``tasks`` or of the built-in ``coding_tasks()``)."""
    tasks: str | None = None
    """A jsonl of tasks in the built-ins' shape (``Task``: task_id, objective, files, hidden_tests, fail_to_pass,
    pass_to_pass, reference_patch), used instead of the built-ins."""
    max_turns: int = 4
    """Harness turn limit."""
    max_sessions: int = 8
    """Harness sessions running at once: the gateway's engine driver batches their model calls."""
    partial: bool = True
    """Partial rollout (SPEC §C1, as ``rl``'s scheduler): once a step's groups are complete, the sessions still running
    pause across the learner step (their model calls wait, the engine's requests keep their tokens) and go on under
    the new weights, so the engine never idles on a step's slowest session. False: the synchronous baseline (a
    step's sessions all finish before the update; none is ever in flight across a sync)."""
    max_stale: int = 3
    """A session whose oldest sampled token is more than this many versions behind the learner when its group is
    trained is dropped (``stale``), as ``rl``'s scheduler discards such trajectories."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """As in every stage: ``policy.path`` (a chat model with its tokenizer and template), or None for the tiny random
    policy over the agentic tokenizer (``policy.arch=qwen2_moe``: MoE, routes replayed by R3)."""
    engine: EngineConfig = field(default_factory=lambda: EngineConfig(kind="scripted"))
    """``engine.kind=scripted``: a scripted agent (``BEHAVIOURS`` round-robin) drives the tool calls; the learner
    trains the policy on those stored spans (off-policy: the behaviour logprobs are the script's).
    ``engine.kind=hf``: the policy itself samples (on-policy; a random model rarely calls a tool), in process or on
    Ray (``engine.ray``)."""
    lr: float = 1e-2
    """Learner AdamW learning rate."""
    seed: int = 0
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """The jail of the harness's commands and the grader (``--set sandbox.allow_unjailed=true``)."""


def debug() -> AgenticConfig:
    """Tiny: 2 tasks × 4 scripted sessions, 2 learner steps (what the tests run)."""
    return AgenticConfig()


RECIPES = {"debug": debug}
"""Named configs for ``scifolio posttrain agentic --config NAME``."""


@dataclass
class _Group:
    """One task's group of sessions ``KEY:ROLLOUT`` (they share the PrefixTree ``KEY``), started in order."""

    index: int
    key: str
    task: Task
    round: int
    """Which pass over the tasks started it (the scripted behaviours rotate by it)."""
    started: int = 0
    results: dict[int, tuple[HarnessRun, Any]] = field(default_factory=dict)
    """rollout → (the harness's run, the verifier's verdict), as sessions finish."""


class AgenticStage(Stage):
    """``posttrain agentic`` as a stage of the one driver (``posttrain.rl.loop.run_stage``): per step, one group of
    sessions per task (see the module docstring), one ``Learner.update``.

    Sessions run ``max_sessions`` at a time in threads, so the engine batches their calls. Groups start in task
    order and a step trains the first ``len(tasks)`` groups in that order once all their sessions are graded (the
    batch does not depend on which session finishes first). With ``partial``, later groups' sessions start as slots
    free; those still running at the end of ``collect`` are held in the engine (``EngineDriver.hold``) until
    ``sync``. Groups are named ``TASK-gGROUP.rRESUME``: after a crash the groups not yet trained start again with fresh
    sessions, never the half-stored ones of the killed attempt."""

    name = "posttrain agentic"

    def __init__(self, config: AgenticConfig, out: str | Path) -> None:
        from posttrain.agentic.gateway import Gateway, GatewayConfig, ServerThread, build_app
        from posttrain.rl.learner import Learner, LearnerConfig
        from posttrain.rollout.engines.scripted import ScriptedTokenEngine
        from posttrain.tiny.agentic import build_tokenizer

        config = self.cfg = resolve(config)
        if config.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {config.max_sessions}")
        self.steps = config.steps
        Path(out).mkdir(parents=True, exist_ok=True)
        tiny = config.policy.path is None  # the tiny policy: 1024 ids over the agentic tokenizer
        kw = dict(tokenizer=build_tokenizer(), vocab_size=1024, max_position_embeddings=2048) if tiny else {}
        model, self.tokenizer = engines.build_policy(config.policy, **kw)
        tok = self.tokenizer
        # BKL at matched weights as in rl; off under the scripted agent, whose logprobs are no model's
        bkl = LearnerConfig.bkl_phi if config.engine.kind != "scripted" else 0.0
        lcfg = LearnerConfig(lr=config.lr, bkl_phi=bkl, n_minibatches=1, seed=config.seed)
        self.learner = Learner(model, lcfg, total_versions=config.steps)
        self.agent = ScriptedAgent(tok)
        if config.engine.kind == "scripted":
            self.engine = ScriptedTokenEngine(self.agent)
        else:
            self.engine = engines.start_engine(config, self.learner.weights(), 0, capacity=8, model=model)
        self.store = TraceStore(Path(out) / "traces.sqlite")
        gcfg = GatewayConfig(
            default_max_tokens=192, max_context=2048, return_routed_experts=config_is_moe(model.config)
        )
        gw = Gateway(self.engine, tok, gcfg, store=self.store)
        self.driver = gw.driver
        self._server = ServerThread(build_app(gw))
        self.url = self._server.__enter__()
        self.tasks = (read_tasks(config.tasks) if config.tasks else coding_tasks())[: config.n_tasks]
        self.tools = {"write_file", "read_file", "run_tests"}
        self.pool = ThreadPoolExecutor(config.max_sessions, thread_name_prefix="agentic-session")
        self.running: dict[Future, tuple[_Group, int]] = {}
        self.open: deque[_Group] = deque()
        """Groups started and not yet trained, in start order."""
        self.next_group, self.attempt = 0, 0

    # -- sessions ------------------------------------------------------------------------------------------------
    def _session(self, task: Task, sid: str) -> tuple[HarnessRun, Any]:
        """One harness session in a fresh copy of the task's repository, then the verifier (a pool thread)."""
        cfg = self.cfg
        with tempfile.TemporaryDirectory() as tmp:
            work = task.setup(Path(tmp))
            harness = SimpleHarness(self.url + "/v1", sid, max_turns=cfg.max_turns, sandbox=cfg.sandbox)
            run = harness.run(task.objective, work)
            return run, verify(task, work, sandbox=cfg.sandbox)

    def _start(self, limit: int | None) -> None:
        """Start sessions while fewer than ``max_sessions`` run: the open groups' next sessions, then new groups
        (only while fewer than ``limit`` groups are open; None: no limit)."""
        cfg = self.cfg
        while len(self.running) < cfg.max_sessions:
            g = next((g for g in self.open if g.started < cfg.group_size), None)
            if g is None:
                if limit is not None and len(self.open) >= limit:
                    return
                n = self.next_group
                task = self.tasks[n % len(self.tasks)]
                g = _Group(n, f"{task.task_id}-g{n}.r{self.attempt}", task, n // len(self.tasks))
                self.open.append(g)
                self.next_group += 1
            r, sid = g.started, f"{g.key}:{g.started}"
            self.agent.assign(sid, behaviour_replies(g.task, BEHAVIOURS[(r + g.round) % len(BEHAVIOURS)]))
            self.running[self.pool.submit(self._session, g.task, sid)] = (g, r)
            g.started += 1

    def collect(self) -> Batch:
        cfg, want = self.cfg, len(self.tasks)
        ready: list[_Group] = []
        while len(ready) < want:
            # partial: keep every slot busy (later groups start early); synchronous: only this step's groups
            self._start(None if cfg.partial else want - len(ready))
            done, _ = wait(self.running, return_when=FIRST_COMPLETED)
            for f in done:
                g, r = self.running.pop(f)
                g.results[r] = f.result()  # a harness that crashed is a bug: raised, never a silent 0 reward
            while self.open and len(ready) < want and len(self.open[0].results) == cfg.group_size:
                ready.append(self.open.popleft())
        # sessions still running wait across the update (partial rollout); with partial off there are none
        paused = self.driver.hold()
        groups, rewards_all, unjailed, advs, dropped = [], [], 0, {}, []
        for g in ready:
            sessions, rewards, weights, exports = [], [], [], []
            for r in range(cfg.group_size):
                sid, (run, verdict) = f"{g.key}:{r}", g.results[r]
                self.agent.forget(sid)  # the session has ended: its script is spent
                unjailed += not verdict.jailed
                if verdict.status == INFRA or sid not in self.store.session_calls:  # never a 0 reward
                    dropped.append(Dropped(sid, self.name, "infra", {"task": g.task.task_id}))
                    continue
                ex = self.store.session_export(sid)
                oldest = min(ex["versions"], default=self.learner.version)
                if self.learner.version - oldest > cfg.max_stale:
                    dropped.append(Dropped(sid, self.name, "stale", {"task": g.task.task_id, "version": oldest}))
                    continue
                if ex["images"]:  # the store keeps image references, not the pixels the learner would need
                    dropped.append(Dropped(sid, self.name, "images", {"task": g.task.task_id}))
                    continue
                sessions.append(sid)
                exports.append(ex)  # one export per session: the path walk is the costly part of a long session
                rewards.append(float(verdict.reward))
                weights.append(annotate(session_steps(self.store, sid, run, self.tools, ex), self.tools))
            if len(sessions) < 2:  # no leave-one-out baseline
                dropped += [Dropped(s, self.name, "group_too_small", {"task": g.task.task_id}) for s in sessions]
                continue
            a = loo_advantages(torch.tensor([rewards]))[0].tolist()
            for s, ex, adv in zip(sessions, exports, session_credit(self.store, sessions, a, weights, exports)):
                advs[s] = adv[ex["spans"][0][0] :]
            groups.append([self.store.session_trajectory(s, rw, ex) for s, rw, ex in zip(sessions, rewards, exports)])
            rewards_all += rewards
        # unjailed: sessions graded outside the jail (sandbox.allow_unjailed), said per step
        trajs = [t for grp in groups for t in grp]
        stats = {
            "reward_mean": sum(rewards_all) / max(len(rewards_all), 1),
            "infra": sum(d.reason == "infra" for d in dropped),
            "unjailed": unjailed,
            "sessions_in_flight": len(self.running),
            "paused_calls": paused,
            "multi_version_sessions": sum(len(set(t.versions)) > 1 for t in trajs),
            "old_version_tokens": sum(
                v < self.learner.version for t in trajs for v, m in zip(t.versions, t.loss_mask) if m
            ),
        }
        credit = [advs[t.request_id] for t in trajs]  # Eq 30 per token of each session's trajectory
        return Batch(groups, self.learner.version, metrics=stats, dropped=dropped, advantages=credit)

    def train(self, batch: Batch) -> dict[str, Any]:
        trajs = [t for g in batch.groups for t in g]
        if not trajs:
            return {"loss": 0.0}
        m = self.learner.train(batch)  # Learner.update on the batch's per-token credit
        # On-policy check: before the update, the learner's logprobs of the stored response tokens the engine sampled
        # at the learner's version against the behaviour logprobs the gateway captured (≈ 0 when the engine served
        # this model; large for a scripted agent). Tokens of older versions differ by the policy's drift.
        return {**m, "kept": m["kept_tokens"], "max_behaviour_logprob_gap": m["matched_mismatch_abs_max"]}

    def sync(self) -> None:
        """Resume the paused sessions' calls under the learner's new weights (the scripted agent has none: its
        engine only takes the new version)."""
        weights = {} if self.cfg.engine.kind == "scripted" else self.learner.weights()
        if not self.driver.held:
            self.driver.hold()
        self.driver.release(weights, self.learner.version)

    def row(self, batch: Batch, metrics: dict[str, Any]) -> dict[str, Any]:
        trajs = [t for g in batch.groups for t in g]
        return {"reward": batch.metrics["reward_mean"], **batch.metrics, **metrics, "sessions": len(trajs)}

    def state_dict(self) -> dict[str, Any]:
        """The first group not yet trained and the attempt: a resume starts the open groups again, fresh."""
        return {"next_group": self.open[0].index if self.open else self.next_group, "attempt": self.attempt}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # checkpoints from before partial rollout counted steps, one group per task each
        self.next_group = state.get("next_group", state.get("step_index", 0) * len(self.tasks))
        self.attempt = state["attempt"] + 1
        self.sync()

    def close(self) -> None:
        self.driver.shutdown()  # sessions still running get their calls aborted or refused, and end
        self.pool.shutdown(wait=True, cancel_futures=True)
        self._server.__exit__(None, None, None)
        engines.stop_engine(self.cfg)


def run_agentic(config: AgenticConfig, out: str | Path, resume: bool = False, progress: bool = False) -> dict[str, Any]:
    """What ``scifolio posttrain agentic --config debug --out DIR`` runs: the one driver over an ``AgenticStage``.
    Writes ``traces.sqlite``, ``metrics.jsonl``, ``checkpoint/`` and ``policy/`` under ``out``; returns the last
    step's metrics with the trace store's token counts."""
    stage = AgenticStage(config, out)
    rows = run_stage(stage, out, resume=resume, progress=progress)
    metrics = dict(rows[-1]) if rows else {}
    metrics["stored_tokens"] = stage.store.stored_tokens()
    metrics["flat_tokens"] = stage.store.flat_tokens()
    return metrics


resolve = functools.partial(engines.resolve, kinds=("hf", "scripted"), stage="posttrain agentic")
"""The engine section checked: hf (in process or Ray) or the scripted agent (an MoE policy refused, naming R3)."""


def read_tasks(path: str) -> list[Task]:
    """Tasks from a jsonl file, one ``Task`` a line in the built-ins' shape (test ids as lists)."""
    from formats import fs

    return [
        Task(**{**r, "fail_to_pass": tuple(r["fail_to_pass"]), "pass_to_pass": tuple(r["pass_to_pass"])})
        for r in fs.read_jsonl(path)
    ]
