"""Partial-rollout scheduling (SPEC §C1) and the synchronous baseline it is measured against.

One learner step's worth of data is collected like this (``PartialRolloutScheduler.collect``):

1. hand the trajectories paused at the last step back to the engine, except those whose oldest token
   is more than ``max_stale`` versions behind the learner: they restart from scratch (counted, their
   tokens reported as waste);
2. keep the engine saturated: submit new prompt groups (``group_size`` samples each) while it has
   room;
3. step the engine; score each finished trajectory with the verifier; a group whose samples all
   finished is *complete*: stale members restart, a group with all-identical rewards is dropped
   (DAPO) and replaced by the next prompt, the rest join the batch. A filter that drops every group
   (a task the policy cannot solve, or has saturated) would sample forever: past ``starve_after_s``
   seconds (or ``starve_after_groups`` groups) of drops with no group kept, ``collect`` raises
   :class:`Starved`, whose message says what to change; ``on_drop`` reports each drop as it happens;
4. once ``batch_target`` groups are complete, **pause**: in-flight trajectories come back with their
   tokens, logprobs and per-token versions, and wait (held here, checkpointable) while the learner
   trains; ``sync`` then loads the new weights into the engine with ``version + 1``.

``SyncScheduler`` submits exactly the groups it needs and waits for all of them: nothing is ever
in flight across a weight sync, so every token is on-policy and the engine idles on the long tail.

    sched = PartialRolloutScheduler(engine, source, reward_fn, SamplingParams(...), SchedulerConfig())
    batch = sched.collect(); ...train...; sched.sync(state, sched.version + 1)
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Protocol

from formats.records import Dropped
from posttrain.rollout.engine import RolloutEngine
from posttrain.rollout.types import Request, SamplingParams, Trajectory


@dataclass(frozen=True)
class Prompt:
    """One prompt from a task: token ids plus whatever the verifier needs."""

    prompt_id: str
    prompt_ids: list[int]
    meta: dict[str, Any] = field(default_factory=dict)
    pixel_values: Any = field(default=None, compare=False, repr=False)
    """A vision-language prompt's images, given to each of its requests (``Request.pixel_values``); the scheduler's
    own group records drop them (a checkpoint never holds pixels)."""
    images: tuple = field(default=(), compare=False, repr=False)
    """The same images decoded (``Request.images``, for vLLM), dropped from the records likewise."""


class PromptSource(Protocol):
    """An endless, checkpointable stream of prompts (the data cursor)."""

    def next_prompt(self) -> Prompt: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class SchedulerConfig:
    """Partial-rollout knobs (SPEC §C1)."""

    batch_target: int = 8
    """Complete groups per learner step."""
    group_size: int = 8
    """Samples per prompt (the LOO group, G)."""
    max_stale: int = 3
    """Discard a trajectory whose oldest token is more than this many versions behind the learner."""
    partial: bool = True
    """False: the synchronous baseline (no trajectory crosses a weight sync)."""
    dapo: bool = True
    """Drop complete groups whose rewards are all identical and replace them (DAPO dynamic sampling)."""
    dapo_atol: float = 0.0
    """Rewards closer than this count as identical."""
    pin_restarted: bool = True
    """A trajectory restarted after a stale discard is never discarded again: when it is trained, its tokens
    more than ``max_stale`` versions old get loss mask 0 (kept as context, counted as ``stale_masked_tokens``).
    Without this a response longer than ``max_stale`` versions' worth of decoding would restart forever,
    which biases training toward short answers."""
    finish_restarted: bool = False
    """Alternative to pinning: after the batch is complete keep decoding (admitting no new prompts) until
    every restarted trajectory finished. Trains them fully fresh, at the price of an idle tail (occupancy)."""
    max_groups_in_flight: int = 0
    """Partial mode: cap on incomplete groups (0 = as many as the engine has room for)."""
    max_engine_steps: int = 1_000_000
    """Safety bound on engine steps per ``collect`` (a task that never finishes raises instead of hanging)."""
    starve_after_s: float = 120.0
    """Stop (:class:`Starved`) once complete groups have been dropped for this many seconds of collecting with
    none kept in between: every group dropped means the policy solves none of the prompts (or all of them), and
    without this the run samples until ``max_engine_steps`` and prints nothing. 0 = never."""
    starve_after_groups: int = 0
    """The same stop after this many groups dropped in a row (0 = no count limit)."""


@dataclass(frozen=True)
class Counters:
    """The scheduler's run-long counters (checkpointed); a ``CollectStats`` holds their increase over one collect."""

    engine_steps: int = 0
    decoded: int = 0
    """Tokens the engine sampled (= ``sampled_tokens``; ``decoded / slots`` is the occupancy)."""
    slots: int = 0
    """Engine capacity summed over the steps taken."""
    sampled_tokens: int = 0
    trained_tokens: int = 0
    """Tokens in the batch's loss (stale-masked ones excluded)."""
    trained_trajectories: int = 0
    old_version_tokens: int = 0
    """Trained tokens sampled by an older policy version than the learner's."""
    discarded_trajectories: int = 0
    """Restarted from scratch: oldest token more than ``max_stale`` versions behind."""
    discarded_tokens: int = 0
    dapo_dropped_groups: int = 0
    dapo_dropped_tokens: int = 0
    groups_submitted: int = 0
    finished_trajectories: int = 0
    finished_tokens: int = 0
    stale_masked_tokens: int = 0


@dataclass(frozen=True)
class CollectStats(Counters):
    """What one ``collect`` cost: the counters' increase over it, then what they imply (every field a column of
    the driver's metrics row)."""

    occupancy: float = float("nan")
    """``decoded / slots`` of this collect (NaN when it took no engine step: carried-over groups filled it)."""
    occupancy_cumulative: float = 0.0
    """Run to date."""
    old_version_fraction: float = 0.0
    mean_trained_length: float = 0.0
    mean_finished_length: float = 0.0
    max_lag: int = 0
    """Largest learner-version lag of a trained token."""
    multi_version_trajectories: int = 0
    """Trained trajectories whose tokens span several policy versions (paused across a sync)."""
    in_flight: int = 0
    """Trajectories paused at the end, waiting for the next collect."""


_TOTAL_KEYS = tuple(f.name for f in fields(Counters))


@dataclass
class Batch:
    """Complete groups for one learner step, and what collecting them cost."""

    groups: list[list[Trajectory]]
    version: int
    """Learner version that trains on it."""
    stats: CollectStats | None = None
    """The partial-rollout scheduler's accounting; None for a stage that collects without it."""
    metrics: dict[str, float] = field(default_factory=dict)
    """What a stage's own ``collect`` measured (agentic's ``reward_mean``/``unjailed``, lemma's rewards and kept
    questions): logged in its row, read by nothing else."""
    dropped: list[Dropped] = field(default_factory=list)
    """What collecting it finished and will never train, each with its reason (``formats.records.Dropped``, the
    corpus job's dead letters): DAPO's uniform groups (``dapo_all_equal``), lemma's saturated questions, agentic's
    infrastructure failures; the driver's row counts them by reason (``dropped_REASON``)."""
    advantages: list[list[float]] | None = None
    """Per trajectory (in group order) the per-token advantages its stage computed (agentic's Eq 30 session credit,
    lemma's round advantages); None: the learner shapes them from the rewards (Eq 28)."""
    teacher_logprobs: list[list[float]] | None = None
    """On-policy distillation: per trajectory the teacher's logprob of each sampled token (the OPD advantage is
    their gap to the proximal student's, computed in the update)."""

    def row(self) -> dict[str, float]:
        """The collect side of a metrics row: the scheduler's stats, then the stage's own."""
        return (asdict(self.stats) if self.stats is not None else {}) | self.metrics


class Starved(RuntimeError):
    """Every complete group was dropped for longer than the scheduler's starvation limit: no batch can form."""


def starved_message(reason: str, groups: int, seconds: float, rewards: dict[float, int], cfg: SchedulerConfig) -> str:
    """What the run did and what to change: the stop's message (the CLI prints it and exits non-zero)."""
    seen = ", ".join(f"{r:g} ×{n}" for r, n in sorted(rewards.items()))
    lines = [
        f"starved: {groups} complete groups in a row were dropped by the {reason} filter over {seconds:.0f} s of "
        f"collecting (group rewards: {seen}); none was kept, so no batch can form.",
    ]
    if rewards and max(rewards) <= 0:
        lines.append(
            "Every sample scored 0: the policy solves none of these prompts. Give it a task it can partly solve "
            "(easier rows in task.jsonl; a verifier its answers can pass, task.verifier=...), longer answers "
            "(sampling.max_new_tokens), or warm it up first (scifolio posttrain sft)."
        )
    elif rewards and min(rewards) >= 1:
        lines.append("Every sample scored 1: the policy has saturated this task; give it harder prompts.")
    lines.append(
        f"Or: more samples per prompt make a mixed group likelier (scheduler.group_size={cfg.group_size}); "
        "scheduler.dapo=false trains on uniform groups anyway (zero advantage, no signal); "
        f"the limit is scheduler.starve_after_s={cfg.starve_after_s:g} / scheduler.starve_after_groups="
        f"{cfg.starve_after_groups} (0 = never)."
    )
    return "\n".join(lines)


def _prompt_of(t: Trajectory) -> Prompt:
    meta = {k: v for k, v in t.request.meta.items() if k != "prompt_id"}
    return Prompt(t.request.meta.get("prompt_id", t.group_id), list(t.prompt_ids), meta)


class PartialRolloutScheduler:
    """Drives a ``RolloutEngine`` for a learner (see the module docstring)."""

    def __init__(
        self,
        engine: RolloutEngine,
        source: PromptSource,
        reward_fn: Callable[[Trajectory], float],
        sampling: SamplingParams,
        config: SchedulerConfig = SchedulerConfig(),
        seed: int = 0,
        params_fn: Callable[[Prompt, int, SamplingParams], SamplingParams] | None = None,
    ) -> None:
        self.engine = engine
        self.source = source
        self.reward_fn = reward_fn
        self.sampling = sampling
        self.config = config
        self.seed = seed
        self.params_fn = params_fn
        """Optional per-sample override (prompt, sample index, default params) → params (benchmarks force lengths)."""
        self.version = engine.version
        self._next_group = 0
        self._groups: dict[str, dict[str, Any]] = {}
        """Incomplete groups: id → {"prompt": Prompt, "done": {request_id: Trajectory}}."""
        self._paused: list[Trajectory] = []
        self._restarted: set[str] = set()
        """Request ids restarted after a stale discard and not finished yet."""
        self._dropped: list[Dropped] = []
        self._carry: list[list[Trajectory]] = []
        """Complete groups beyond ``batch_target`` (trained at the next step; batches keep a fixed size)."""
        self.totals = dict.fromkeys(_TOTAL_KEYS, 0)
        self.on_drop: Callable[[int, int], None] | None = None
        """Called at every dropped group with (groups dropped this run, dropped in a row): the progress bar."""
        self._streak = 0
        """Complete groups dropped since the last one kept (the starvation stop's count)."""
        self._streak_s = 0.0
        """Seconds of collecting, in earlier ``collect`` calls, since the streak's first drop (learner time excluded)."""
        self._streak_since = 0.0
        self._streak_rewards: dict[float, int] = {}

    # -- the cycle ------------------------------------------------------------------------------------
    def collect(self) -> Batch:
        """Run the engine until ``batch_target`` groups are complete; pause the rest (kept, not discarded)."""
        cfg = self.config
        before = dict(self.totals)
        self._resume_paused()
        self._dropped = []
        self._streak_since = time.monotonic()
        ready: list[list[Trajectory]] = []
        carried, self._carry = self._carry, []
        for members in carried:  # complete groups left over from the last batch: re-checked for staleness
            self._complete(members, ready)
        steps = 0
        while len(ready) < cfg.batch_target or (cfg.finish_restarted and self._restarted):
            if len(ready) < cfg.batch_target:  # while only draining restarted ones, admit no new prompts
                self._fill(len(ready))
            out = self.engine.step()
            steps += 1
            if steps > cfg.max_engine_steps:
                raise RuntimeError(f"no batch after {cfg.max_engine_steps} engine steps")
            self.totals["engine_steps"] += 1
            self.totals["decoded"] += out.n_decoded
            self.totals["slots"] += self.engine.capacity
            self.totals["sampled_tokens"] += out.n_decoded
            for t in out.finished:
                self._on_finished(t, ready)
        if self._streak:
            self._streak_s += time.monotonic() - self._streak_since
        self._paused = self.engine.pause()
        ready, self._carry = ready[: cfg.batch_target], ready[cfg.batch_target :]  # fixed batch size
        if not cfg.partial and self._paused:
            raise AssertionError("synchronous scheduler left trajectories in flight")
        stats = self._account(ready, before)
        return Batch(groups=ready, version=self.version, stats=stats, dropped=self._dropped)

    def sync(self, state: dict[str, Any], version: int) -> None:
        """Load the learner's new weights into the (paused, empty) engine; later tokens carry ``version``."""
        if version <= self.version:
            raise ValueError(f"version must increase ({self.version} → {version})")
        self.engine.update_weights(state, version)
        self.version = version

    @property
    def paused(self) -> list[Trajectory]:
        """Trajectories waiting across the current learner step (read-only view for tests/metrics)."""
        return list(self._paused)

    # -- internals ------------------------------------------------------------------------------------
    def _stale(self, t: Trajectory) -> bool:
        """Discard (restart) it? Pinned restarted trajectories are masked at train time instead."""
        if self.config.pin_restarted and t.attempt > 0:
            return False
        return (self.version - t.versions[0] if t.versions else 0) > self.config.max_stale  # its oldest token's lag

    def _mask_stale_tokens(self, t: Trajectory) -> None:
        floor = self.version - self.config.max_stale
        for i, v in enumerate(t.versions):
            if v >= floor:
                break
            if t.loss_mask[i]:
                t.loss_mask[i] = 0
                self.totals["stale_masked_tokens"] += 1

    def _discard(self, t: Trajectory) -> None:
        self.totals["discarded_trajectories"] += 1
        self.totals["discarded_tokens"] += t.n_tokens
        t.restart()
        self._restarted.add(t.request_id)

    def _resume_paused(self) -> None:
        back, self._paused = self._paused, []
        for t in filter(self._stale, back):
            self._discard(t)
        if back:
            self.engine.resume(back)

    def _fill(self, n_ready: int) -> None:
        cfg = self.config
        if cfg.partial:
            cap = cfg.max_groups_in_flight or 10**9
            while self.engine.n_active + cfg.group_size <= self.engine.capacity and len(self._groups) < cap:
                self._submit_group()
        else:
            while n_ready + len(self._groups) < cfg.batch_target:
                self._submit_group()

    def _submit_group(self) -> None:
        g = self._next_group
        self._next_group += 1
        prompt = self.source.next_prompt()
        gid = f"g{g}"
        reqs = []
        for j in range(self.config.group_size):
            params = replace(self.sampling, seed=zlib.crc32(f"{self.seed}/{g}/{j}".encode()))
            if self.params_fn is not None:
                params = self.params_fn(prompt, j, params)
            meta = dict(prompt.meta, prompt_id=prompt.prompt_id)
            reqs.append(
                Request(f"{gid}-{j}", list(prompt.prompt_ids), params, gid, meta, prompt.pixel_values, prompt.images)
            )
        self._groups[gid] = {"prompt": replace(prompt, pixel_values=None, images=()), "done": {}}  # on the requests
        self.totals["groups_submitted"] += 1
        self.engine.submit(reqs)

    def _on_finished(self, t: Trajectory, ready: list[list[Trajectory]]) -> None:
        self._restarted.discard(t.request_id)
        self.totals["finished_trajectories"] += 1
        self.totals["finished_tokens"] += t.n_tokens
        t.reward = float(self.reward_fn(t))
        group = self._groups[t.group_id]
        group["done"][t.request_id] = t
        if len(group["done"]) < self.config.group_size:
            return
        members = [group["done"][k] for k in sorted(group["done"], key=lambda k: int(k.rsplit("-", 1)[1]))]
        del self._groups[t.group_id]
        self._complete(members, ready)

    def _complete(self, members: list[Trajectory], ready: list[list[Trajectory]]) -> None:
        """A group whose samples all finished: restart stale members, drop it (DAPO) or add it to the batch."""
        gid = members[0].group_id
        stale = [m for m in members if self._stale(m)]
        if stale:
            done = {m.request_id: m for m in members if m not in stale}
            self._groups[gid] = {"prompt": _prompt_of(members[0]), "done": done}
            for m in stale:
                self._discard(m)
            self.engine.resume(stale)
            return
        rewards = [m.reward for m in members]
        if self.config.dapo and max(rewards) - min(rewards) <= self.config.dapo_atol:  # all identical
            self.totals["dapo_dropped_groups"] += 1
            self.totals["dapo_dropped_tokens"] += sum(m.n_tokens for m in members)
            self._dropped += [
                Dropped(m.request_id, "scheduler", "dapo_all_equal", {"reward": m.reward}) for m in members
            ]
            self._starving("DAPO (identical rewards)", members[0].reward)
            return
        self._streak, self._streak_s, self._streak_rewards = 0, 0.0, {}
        ready.append(members)

    def _starving(self, reason: str, reward: float) -> None:
        """One more group dropped with none kept since the streak began: report it; past the limit, stop."""
        now = time.monotonic()
        if self._streak == 0:
            self._streak_since = now
        self._streak += 1
        self._streak_rewards[reward] = self._streak_rewards.get(reward, 0) + 1
        if self.on_drop is not None:
            self.on_drop(self.totals["dapo_dropped_groups"], self._streak)
        cfg, seconds = self.config, self._streak_s + now - self._streak_since
        if (cfg.starve_after_s and seconds >= cfg.starve_after_s) or (
            cfg.starve_after_groups and self._streak >= cfg.starve_after_groups
        ):
            raise Starved(starved_message(reason, self._streak, seconds, self._streak_rewards, cfg))

    def _account(self, ready: list[list[Trajectory]], before: dict[str, int]) -> CollectStats:
        trajs = [t for g in ready for t in g]
        for t in trajs:
            self._mask_stale_tokens(t)
        trained = sum(sum(t.loss_mask) for t in trajs)  # tokens in the loss (stale-masked ones excluded)
        old = sum(sum(1 for v, m in zip(t.versions, t.loss_mask) if m and v < self.version) for t in trajs)
        self.totals["trained_tokens"] += trained
        self.totals["trained_trajectories"] += len(trajs)
        self.totals["old_version_tokens"] += old
        d = {k: self.totals[k] - before[k] for k in _TOTAL_KEYS}
        lags = [self.version - v for t in trajs for v, m in zip(t.versions, t.loss_mask) if m]
        return CollectStats(
            **d,
            occupancy=d["decoded"] / d["slots"] if d["slots"] else float("nan"),
            occupancy_cumulative=self.totals["decoded"] / max(self.totals["slots"], 1),
            old_version_fraction=old / max(trained, 1),
            mean_trained_length=sum(t.n_tokens for t in trajs) / max(len(trajs), 1),
            mean_finished_length=d["finished_tokens"] / max(d["finished_trajectories"], 1),
            max_lag=max(lags, default=0),
            multi_version_trajectories=sum(1 for t in trajs if t.versions and t.versions[-1] > t.versions[0]),
            in_flight=len(self._paused),
        )

    # -- checkpoint -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: version, data cursor, paused and waiting trajectories.

        Only valid between ``collect`` and the next ``collect`` (the engine holds nothing then)."""
        if self.engine.n_active:
            raise RuntimeError("state_dict while the engine holds requests: call it after collect()")
        return {
            "version": self.version,
            "next_group": self._next_group,
            "source": self.source.state_dict(),
            "groups": {
                gid: {"prompt": asdict(g["prompt"]), "done": [t.to_dict() for t in g["done"].values()]}
                for gid, g in self._groups.items()
            },
            "paused": [t.to_dict() for t in self._paused],
            "carry": [[t.to_dict() for t in g] for g in self._carry],
            "totals": dict(self.totals),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict``; a source with ``images(meta)`` (``TaskSource``) gives every restored
        trajectory its images back, rebuilt from the task row (images are never checkpointed)."""
        if self.engine.n_active:
            raise RuntimeError("load_state_dict needs an empty engine")
        if self.engine.version != state["version"]:
            raise ValueError(
                f"engine has version {self.engine.version}, checkpoint {state['version']}: sync weights first"
            )
        self.version = state["version"]
        self._next_group = state["next_group"]
        self.source.load_state_dict(state["source"])
        images = getattr(self.source, "images", lambda meta: (None, ()))

        def restored(d: dict[str, Any]) -> Trajectory:
            t = Trajectory.from_dict(d)
            t.request.pixel_values, t.request.images = images(t.request.meta)
            return t

        self._groups = {}
        for gid, g in state["groups"].items():
            done = {t.request_id: t for t in map(restored, g["done"])}
            self._groups[gid] = {"prompt": Prompt(**g["prompt"]), "done": done}
        self._paused = [restored(d) for d in state["paused"]]
        self._carry = [[restored(d) for d in g] for g in state.get("carry", [])]
        self._restarted = {t.request_id for t in self._paused if t.attempt > 0 and t.n_tokens == 0}
        self.totals = dict.fromkeys(_TOTAL_KEYS, 0) | state["totals"]


class SyncScheduler(PartialRolloutScheduler):
    """The synchronous baseline: submit exactly the groups a step needs, wait for all, never pause work."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.config = replace(self.config, partial=False)
