"""A ``RolloutEngine`` that emits given token sequences, one token per step (gateway and harness tests).

Random tiny models never emit a valid tool call, so tests script the model: ``script(request)``
returns the ids of the reply (e.g. the tokenizer's encoding of ``'<tool_call>{...}</tool_call>'`` plus
``<|im_end|>``); the engine emits them one per ``step``, with deterministic logprobs (−0.01·(t+1) −
0.1·version), and finishes with ``stop`` when the last emitted id is a stop token of the request, else
``length``. ``step_delay_s`` sleeps per step (benchmarks model a fixed engine cost).

    engine = ScriptedTokenEngine(lambda req: tok.encode("hello") + [im_end])
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from posttrain.rollout.engine import QueuedEngine, StepOutput
from posttrain.rollout.types import FINISH_ABORT, FINISH_LENGTH, FINISH_STOP, Request, Trajectory


class ScriptedTokenEngine(QueuedEngine):
    def __init__(
        self,
        script: Callable[[Request], list[int]],
        capacity: int = 64,
        version: int = 0,
        step_delay_s: float = 0.0,
    ) -> None:
        self.script = script
        self._capacity = capacity
        self._version = version
        self.step_delay_s = step_delay_s
        self._queue: deque[tuple[Trajectory, list[int]]] = deque()
        self._running: list[tuple[Trajectory, list[int]]] = []
        self.emitted: dict[str, list[int]] = {}
        """request id → the ids this engine emitted (what tests compare the trace store with)."""
        self.prompts: dict[str, list[int]] = {}
        """request id → the prompt ids it was given."""
        self.steps = 0

    def submit(self, requests: Sequence[Request]) -> None:
        for r in requests:
            self.prompts[r.request_id] = list(r.prompt_ids)
            self._queue.append((Trajectory(request=r), list(self.script(r))))

    def resume(self, trajectories: Sequence[Trajectory]) -> None:
        for t in trajectories:
            self._queue.append((t, list(self.script(t.request))))

    def pause(self) -> list[Trajectory]:
        out = [t for t, _ in self._running] + [t for t, _ in self._queue]
        self._running, self._queue = [], deque()
        return out

    def abort(self, request_ids: Sequence[str]) -> list[Trajectory]:
        ids = set(request_ids)
        out = [t for t, _ in [*self._running, *self._queue] if t.request_id in ids]
        self._running = [x for x in self._running if x[0].request_id not in ids]
        self._queue = deque(x for x in self._queue if x[0].request_id not in ids)
        for t in out:
            t.finish_reason = FINISH_ABORT
        return out

    def update_weights(self, state: Mapping[str, Any], version: int) -> None:
        if self.n_active:
            raise RuntimeError("update_weights while requests are held: pause() first")
        self._version = int(version)

    def step(self) -> StepOutput:
        out = StepOutput()
        while self._queue and len(self._running) < self._capacity:
            t, ids = self._queue.popleft()
            out.n_prefilled_tokens += len(t.prompt_ids) + t.n_tokens
            self._running.append((t, ids))
        if not self._running:
            return out
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        keep = []
        for t, ids in self._running:
            p = t.request.params
            pos = t.n_tokens
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
            else:
                keep.append((t, ids))
        out.n_decoded = len(self._running)
        self._running = keep
        self.steps += 1
        return out
