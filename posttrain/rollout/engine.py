"""The ``RolloutEngine`` protocol: a step-driven sampler the partial-rollout scheduler drives (SPEC §C1).

Ownership rule: a trajectory is held by exactly one side. ``submit``/``resume`` hand trajectories to
the engine; ``step`` hands finished ones back; ``pause``/``abort`` hand the unfinished ones back. So the
scheduler (not the engine) holds paused trajectories and checkpoints them, and an engine never has to
survive a crash.

Versions: every generated token is stamped with the engine's ``version`` at the moment it was sampled.
KV is never reused across versions: after ``update_weights`` every resumed trajectory's KV is
recomputed (re-prefill of prompt + kept tokens) under the new weights; its already generated tokens,
logprobs and versions are never rewritten.

Implementations: ``engines/hf.py`` (transformers, CPU), ``engines/scripted.py`` (virtual clock, tests),
``engines/vllm.py`` (GPU).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from posttrain.rollout.types import FINISH_ABORT, FINISH_LENGTH, FINISH_STOP, Request, Trajectory


@dataclass
class StepOutput:
    """What one ``step`` did."""

    finished: list[Trajectory] = field(default_factory=list)
    """Trajectories that finished this step (handed back to the caller; the engine forgets them)."""
    n_decoded: int = 0
    """Requests that received a token this step (occupancy = n_decoded / capacity)."""
    n_prefilled_tokens: int = 0
    """Prompt/prefix tokens (re)computed this step (prefill of new and resumed requests)."""
    new_tokens: dict[str, list[int]] = field(default_factory=dict)
    """Request id → the ids appended to its trajectory since the previous ``step`` returned, in order (one per
    step for plain decoding, several for a speculative round or a vLLM poll). Summed over steps they are exactly
    the trajectory's ``token_ids``; lists are fresh per step (only the new ids, never a copy of the trajectory).
    Streaming consumers (the agentic gateway) read them; the scheduler does not need them."""


@runtime_checkable
class ExpertsRecorder(Protocol):
    """R3 hook an MoE-aware component installs on an engine (``engine.experts_recorder = rec``).

    The engine calls ``begin()`` right before each model forward and ``end()`` right after it;
    ``end`` returns the expert ids the routers chose in that forward as a ``[batch, seq, n_layers,
    top_k]`` integer tensor aligned with the forward's ``input_ids`` (left padding included). The
    engine records, per trajectory, one row per fed position (a re-prefill after a resume recomputes
    known positions under the new weights and replaces their rows: the routes behind the engine's
    current KV and its rescored logprobs, which the learner replays at that version).
    """

    def begin(self) -> None: ...

    def end(self) -> Any: ...


@runtime_checkable
class RolloutEngine(Protocol):
    """A sampler driven one decode step at a time."""

    @property
    def version(self) -> int:
        """Policy version of the weights now loaded; stamped on every token sampled from now on."""
        ...

    @property
    def capacity(self) -> int:
        """Most requests decoded concurrently (the occupancy denominator)."""
        ...

    @property
    def n_active(self) -> int:
        """Requests now held by the engine (running or waiting for a slot)."""
        ...

    def submit(self, requests: Sequence[Request]) -> None:
        """Queue new requests. They start (prefill + first token) at a later ``step``, FIFO, as slots free."""
        ...

    def step(self) -> StepOutput:
        """One batched decode step: every running request gets exactly one new token (new and resumed
        ones are prefilled first, their first token sampled from the prefill). Finished trajectories
        are returned and released; the others stay in the engine. ``new_tokens`` says which ids each
        request received."""
        ...

    def pause(self) -> list[Trajectory]:
        """Stop decoding and hand back every unfinished trajectory (running or queued), with all tokens,
        logprobs, versions and routed experts so far; nothing is discarded. KV is dropped. The engine
        is empty afterwards and may take a weight update."""
        ...

    def resume(self, trajectories: Sequence[Trajectory]) -> None:
        """Take back paused trajectories. Their KV is recomputed from prompt + kept tokens with the
        current weights at their next step; sampling continues at position ``n_tokens`` with that
        position's own seeded generator, so the kept prefix is bit-identical."""
        ...

    def abort(self, request_ids: Sequence[str]) -> list[Trajectory]:
        """Remove the given requests and hand them back with ``finish_reason = "abort"`` (tokens kept)."""
        ...

    def update_weights(self, state: Mapping[str, Any], version: int) -> None:
        """Load new policy weights (a full or partial state dict) and set ``version``. Must be called
        while no request is running (after ``pause``); raises otherwise. No KV survives it."""
        ...


def run_all(
    engine: RolloutEngine,
    requests: Sequence[Request],
    max_steps: int = 1_000_000,
    progress: Callable[[int], None] | None = None,
) -> list[Trajectory]:
    """Submit ``requests`` and step ``engine`` until every one is back: the trajectories in request order.
    ``progress(n)`` is told of each step's ``n`` finished requests as they come."""
    engine.submit(requests)
    done: dict[str, Trajectory] = {}
    steps = 0
    while len(done) < len(requests):
        if steps == max_steps:
            raise RuntimeError(f"engine did not finish {len(requests) - len(done)} requests in {steps} steps")
        finished = engine.step().finished
        done.update((t.request_id, t) for t in finished)
        if progress is not None and finished:
            progress(len(finished))
        steps += 1
    return [done[r.request_id] for r in requests]


class QueuedEngine:
    """The bookkeeping every local engine shares: a version, a capacity, a queue of submitted requests and the
    running ones. ``resume``/``pause``/``abort`` here serve engines whose running entries carry their trajectory as
    ``.traj``; others override them."""

    def __init__(self, capacity: int, version: int) -> None:
        self._capacity, self._version = capacity, version
        self._queue: deque[Trajectory] = deque()
        self._running: list[Any] = []

    @property
    def version(self) -> int:
        return self._version

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def n_active(self) -> int:
        return len(self._queue) + len(self._running)

    def resume(self, trajectories: Sequence[Trajectory]) -> None:
        for t in trajectories:
            if t.finished:
                raise ValueError(f"{t.request_id} is finished; only paused trajectories resume")
            self._queue.append(t)

    def pause(self) -> list[Trajectory]:
        out = [r.traj for r in self._running] + list(self._queue)
        self._running, self._queue = [], deque()
        return out

    def abort(self, request_ids: Sequence[str]) -> list[Trajectory]:
        ids = set(request_ids)
        out = [r.traj for r in self._running if r.traj.request_id in ids]
        out += [t for t in self._queue if t.request_id in ids]
        self._running = [r for r in self._running if r.traj.request_id not in ids]
        self._queue = deque(t for t in self._queue if t.request_id not in ids)
        for t in out:
            t.finish_reason = FINISH_ABORT
        return out

    def _append(self, t: Trajectory, tok: int, logprob: float) -> None:
        """Append a sampled token (at this engine's version) and set ``finish_reason`` when it ends the request:
        the forced length, else a stop token (unless ``ignore_eos``), else ``max_new_tokens``."""
        p = t.request.params
        t.append(tok, logprob, self._version)
        if p.forced_length is not None:
            if t.n_tokens >= p.forced_length:
                t.finish_reason = FINISH_LENGTH
        elif not p.ignore_eos and tok in p.stop_token_ids:
            t.finish_reason = FINISH_STOP
        elif t.n_tokens >= p.max_new_tokens:
            t.finish_reason = FINISH_LENGTH

    def _admit(self, wrap: Any) -> None:
        """Move queued trajectories into the running set (as ``wrap(trajectory)``) while capacity allows."""
        while self._queue and len(self._running) < self._capacity:
            self._running.append(wrap(self._queue.popleft()))

    def _retire(self, out: StepOutput) -> None:
        """Hand the running entries whose trajectory finished this step to ``out.finished``; keep the rest."""
        out.finished += [r.traj for r in self._running if r.traj.finished]
        self._running = [r for r in self._running if not r.traj.finished]

    def update_weights(self, state: Mapping[str, Any], version: int) -> None:
        """The policy (``self.model``) takes the new weights (see ``_load_weights``) and ``version``."""
        self._load_weights(self.model, state)
        self._version = int(version)

    def _load_weights(self, model: Any, state: Mapping[str, Any]) -> None:
        """Load a (full or partial) state dict into ``model`` between pause and resume; unknown names raise."""
        if self._running or self._queue:
            raise RuntimeError("weight update while requests are held: pause() first")
        if state:
            result = model.load_state_dict(dict(state), strict=False)
            if result.unexpected_keys:
                raise KeyError(f"unknown parameters in weight update: {result.unexpected_keys[:5]}")
