"""A deterministic ``RolloutEngine`` on a virtual clock, for scheduler tests (no model at all).

Each step gives every running request one token. How long a response is comes from ``length_fn``
(default: ``request.meta["length"]``, else the forced length, else ``max_new_tokens``); its tokens and
logprobs are pure functions of (request id, attempt, position, version), so a test can tell which
policy version produced a token from its logprob alone.

    engine = ScriptedEngine(capacity=16); engine.submit(requests); engine.step()
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from posttrain.rollout.engine import QueuedEngine, StepOutput
from posttrain.rollout.types import FINISH_ABORT, FINISH_LENGTH, FINISH_STOP, Request, Trajectory


def default_length(traj: Trajectory) -> int:
    p = traj.request.params
    return int(traj.request.meta.get("length", p.forced_length or p.max_new_tokens))


def scripted_token(traj: Trajectory, position: int, vocab: int = 1000) -> int:
    key = f"{traj.request_id}/{traj.attempt}/{position}".encode()
    return zlib.crc32(key) % vocab


def scripted_logprob(position: int, version: int) -> float:
    """Behaviour logprob the scripted engine reports: encodes the version (−0.1·(v+1)) and position."""
    return -0.1 * (version + 1) - 0.001 * position


class ScriptedEngine(QueuedEngine):
    """Virtual-clock engine: ``steps`` counts decode steps, ``decoded`` the slot-steps used."""

    def __init__(
        self,
        capacity: int = 16,
        length_fn: Callable[[Trajectory], int] = default_length,
        version: int = 0,
        stop_token: int = -1,
        vocab: int = 1000,
    ) -> None:
        self.vocab = vocab
        """Token ids are drawn below this (a model's vocabulary size when a learner trains on them)."""
        self._capacity = capacity
        self._version = version
        self.length_fn = length_fn
        self.stop_token = stop_token
        """Token appended as the last one of a response that ends before its length limit (-1: none)."""
        self._queue: deque[Trajectory] = deque()
        self._running: list[Trajectory] = []
        self.steps = 0
        self.decoded = 0
        self.resumed: list[str] = []
        """Request ids handed back through ``resume`` (in order)."""
        self.weight_updates: list[int] = []

    def submit(self, requests: Sequence[Request]) -> None:
        self._queue.extend(Trajectory(request=r) for r in requests)

    def resume(self, trajectories: Sequence[Trajectory]) -> None:
        for t in trajectories:
            if t.finished:
                raise ValueError(f"{t.request_id} is finished; only paused trajectories resume")
            self.resumed.append(t.request_id)
            self._queue.append(t)

    def pause(self) -> list[Trajectory]:
        out = self._running + list(self._queue)
        self._running, self._queue = [], deque()
        return out

    def abort(self, request_ids: Sequence[str]) -> list[Trajectory]:
        ids = set(request_ids)
        out = [t for t in [*self._running, *self._queue] if t.request_id in ids]
        self._running = [t for t in self._running if t.request_id not in ids]
        self._queue = deque(t for t in self._queue if t.request_id not in ids)
        for t in out:
            t.finish_reason = FINISH_ABORT
        return out

    def update_weights(self, state: Mapping[str, Any], version: int) -> None:
        if self._running or self._queue:
            raise RuntimeError("update_weights while requests are held: pause() first")
        self._version = int(version)
        self.weight_updates.append(int(version))

    def step(self) -> StepOutput:
        out = StepOutput()
        while self._queue and len(self._running) < self._capacity:
            t = self._queue.popleft()
            out.n_prefilled_tokens += len(t.prompt_ids) + t.n_tokens
            self._running.append(t)
        if not self._running:
            return out
        keep = []
        for t in self._running:
            limit = t.request.params.target_length
            length = max(1, min(self.length_fn(t), limit))
            pos = t.n_tokens
            last = pos + 1 == length
            tok = (
                self.stop_token
                if (last and length < limit and self.stop_token >= 0)
                else scripted_token(t, pos, self.vocab)
            )
            t.append(tok, scripted_logprob(pos, self._version), self._version)
            out.new_tokens[t.request_id] = [tok]
            if last:
                t.finish_reason = FINISH_STOP if length < limit else FINISH_LENGTH
                out.finished.append(t)
            else:
                keep.append(t)
        out.n_decoded = len(self._running)
        self.steps += 1
        self.decoded += out.n_decoded
        self._running = keep
        return out
