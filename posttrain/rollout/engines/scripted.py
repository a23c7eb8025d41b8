"""The one scripted ``RolloutEngine`` (no model at all): a virtual clock for scheduler tests, or given replies.

Each step gives every running request one token. ``ScriptedEngine``: how long a response is comes from ``length_fn``
(default: ``request.meta["length"]``, else the forced length, else ``max_new_tokens``); its tokens and
logprobs are pure functions of (request id, attempt, position, version), so a test can tell which
policy version produced a token from its logprob alone. ``ScriptedTokenEngine`` (gateway, harness and agentic tests:
random tiny models never emit a valid tool call) emits ``script(request)``'s ids instead, logprobs −0.01·(t+1) −
0.1·version, finishing with ``stop`` at a stop token of the request, else ``length``; ``step_delay_s`` sleeps per
step (benchmarks model a fixed engine cost).

    engine = ScriptedEngine(capacity=16); engine.submit(requests); engine.step()
    engine = ScriptedTokenEngine(lambda req: tok.encode("hello") + [im_end])
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from posttrain.rollout.engine import QueuedEngine, StepOutput
from posttrain.rollout.types import FINISH_LENGTH, FINISH_STOP, Request, Trajectory


def default_length(traj: Trajectory) -> int:
    p = traj.request.params
    return int(traj.request.meta.get("length", p.forced_length or p.max_new_tokens))


def scripted_logprob(position: int, version: int) -> float:
    """Behaviour logprob the scripted engine reports: encodes the version (−0.1·(v+1)) and position."""
    return -0.1 * (version + 1) - 0.001 * position


class Running(NamedTuple):
    """A running request and its scripted reply (drawn from ``script`` when it is admitted; None: the virtual clock)."""

    traj: Trajectory
    ids: list[int] | None


class ScriptedEngine(QueuedEngine):
    """Virtual-clock engine: ``steps`` counts decode steps."""

    def __init__(
        self,
        capacity: int = 16,
        length_fn: Callable[[Trajectory], int] = default_length,
        version: int = 0,
        stop_token: int = -1,
        vocab: int = 1000,
        script: Callable[[Request], list[int]] | None = None,
        step_delay_s: float = 0.0,
    ) -> None:
        super().__init__(capacity, version)
        self.vocab = vocab
        """Token ids are drawn below this (a model's vocabulary size when a learner trains on them)."""
        self.length_fn = length_fn
        self.stop_token = stop_token
        """Token appended as the last one of a response that ends before its length limit (-1: none)."""
        self.script, self.step_delay_s = script, step_delay_s
        self.emitted: dict[str, list[int]] = {}
        """request id → the ids this engine emitted (what tests compare the trace store with)."""
        self.prompts: dict[str, list[int]] = {}
        """request id → the prompt ids it was given."""
        self.steps = 0
        self.resumed: list[str] = []
        """Request ids handed back through ``resume`` (in order)."""

    def submit(self, requests: Sequence[Request]) -> None:
        for r in requests:
            self.prompts[r.request_id] = list(r.prompt_ids)
            self._queue.append(Trajectory(request=r))

    def resume(self, trajectories: Sequence[Trajectory]) -> None:
        super().resume(trajectories)
        self.resumed += [t.request_id for t in trajectories]

    def update_weights(self, state: Mapping[str, Any], version: int) -> None:
        if self._running or self._queue:
            raise RuntimeError("update_weights while requests are held: pause() first")
        self._version = int(version)

    def step(self) -> StepOutput:
        out = StepOutput()
        while self._queue and len(self._running) < self._capacity:
            t = self._queue.popleft()
            out.n_prefilled_tokens += len(t.prompt_ids) + t.n_tokens
            self._running.append(Running(t, None if self.script is None else list(self.script(t.request))))
        if not self._running:
            return out
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        keep = []
        for r in self._running:
            t, ids = r
            if ids is not None:
                if not self._reply(t, ids, out):
                    keep.append(r)
                continue
            limit = t.request.params.target_length
            length = max(1, min(self.length_fn(t), limit))
            pos = t.n_tokens
            last = pos + 1 == length
            stop = last and length < limit and self.stop_token >= 0  # ends before its limit: the stop token
            tok = self.stop_token if stop else zlib.crc32(f"{t.request_id}/{t.attempt}/{pos}".encode()) % self.vocab
            t.append(tok, scripted_logprob(pos, self._version), self._version)
            out.new_tokens[t.request_id] = [tok]
            if last:
                t.finish_reason = FINISH_STOP if length < limit else FINISH_LENGTH
                out.finished.append(t)
            else:
                keep.append(r)
        out.n_decoded = len(self._running)
        self.steps += 1
        self._running = keep
        return out

    def _reply(self, t: Trajectory, ids: list[int], out: StepOutput) -> bool:
        """The next id of a scripted reply; True when the trajectory finished."""
        p, pos = t.request.params, t.n_tokens
        tok = ids[pos] if pos < len(ids) else (p.stop_token_ids[0] if p.stop_token_ids else 0)
        t.append(tok, -0.01 * (pos + 1) - 0.1 * self._version, self._version)
        out.new_tokens[t.request_id] = [tok]
        if tok in p.stop_token_ids and not p.ignore_eos:
            t.finish_reason = FINISH_STOP
        elif t.n_tokens >= p.target_length:
            t.finish_reason = FINISH_LENGTH
        if t.finished:
            self.emitted[t.request_id] = list(t.token_ids)
            out.finished.append(t)
        return t.finished


class ScriptedTokenEngine(ScriptedEngine):
    """Emits ``script(request)``'s ids, one per step (the replies of a scripted agent)."""

    def __init__(
        self, script: Callable[[Request], list[int]], capacity: int = 64, version: int = 0, step_delay_s: float = 0.0
    ) -> None:
        super().__init__(capacity, version=version, script=script, step_delay_s=step_delay_s)
