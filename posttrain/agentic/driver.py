"""The engine thread driver: one ``RolloutEngine`` stepped in its own thread for many concurrent asyncio callers
(``EngineDriver``). The gateway (``gateway.py``) runs every model call through one; ``benchmarks/gateway.py``
measures it alone.

    python benchmarks/gateway.py   # direct driver calls vs. the gateway over HTTP
"""

import asyncio
import logging
import threading
from typing import Any

from posttrain.rollout.types import Request, Trajectory

log = logging.getLogger(__name__)


class TokenStream:
    """One request's output ids as the engine emits them (``EngineDriver.stream``).

    ``async for ids in stream`` yields the ids each engine step appended (``StepOutput.new_tokens``); after the
    loop ``stream.trajectory`` is the finished ``Trajectory``. An engine failure is raised from the loop, and so is
    an engine whose steps did not report every id it emitted (a streaming consumer would lose text otherwise).
    """

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.trajectory: Trajectory | None = None
        self.n_received = 0
        self._queue: asyncio.Queue = asyncio.Queue()

    def __aiter__(self) -> "TokenStream":
        return self

    async def __anext__(self) -> list[int]:
        kind, item = await self._queue.get()
        if kind == "ids":
            return item
        if kind == "done":
            self.trajectory = item
            raise StopAsyncIteration
        raise item

    def _ids(self, ids: list[int]) -> None:
        self.n_received += len(ids)
        self._queue.put_nowait(("ids", ids))

    def _done(self, traj: Trajectory) -> None:
        if self.n_received != traj.n_tokens:
            n = f"{self.n_received} new ids, but the trajectory finished with {traj.n_tokens}"
            self._fail(RuntimeError(f"{self.request_id}: the engine's steps reported {n}"))
        else:
            self._queue.put_nowait(("done", traj))

    def _fail(self, error: BaseException) -> None:
        self._queue.put_nowait(("error", error))


class DriverClosed(RuntimeError):
    """A model call after ``EngineDriver.shutdown`` (the gateway answers 503)."""


class EngineDriver:
    """Runs one ``RolloutEngine`` for many concurrent callers: ``await generate(request)`` for the finished
    trajectory, or ``async for ids in stream(request)`` for its ids as each step emits them.

    The engine lives in its own thread, which takes every request queued since its last step, submits them
    and steps while any request is in flight; finished trajectories are handed back to each caller's event
    loop with ``call_soon_threadsafe``. So the step cadence does not wait for the HTTP event loop (a busy
    loop would otherwise delay every step of every request), and the engine is only touched by that thread
    (no locking inside engines). An engine failure fails the calls in flight, loudly, and the thread keeps
    serving later calls. A step's ``new_tokens`` reach the streams before its finished trajectories do.

    Partial rollout across a weight sync (SPEC §C1, ``posttrain.agentic.rl``): ``hold()`` pauses the engine (the
    requests in flight keep their tokens; calls made meanwhile queue), ``release(weights, version)`` resumes them.
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._cv = threading.Condition()
        self._pending: list[tuple[Request, asyncio.AbstractEventLoop, asyncio.Future | TokenStream]] = []
        self._aborts: list[str] = []
        self._thread: threading.Thread | None = None
        self._waiting: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future | TokenStream]] = {}
        self._step_lock = threading.Lock()
        """Held by the engine thread for each round of submit/abort/step, and by ``hold`` until ``release``."""
        self._paused: list[Trajectory] | None = None
        self._closed = False
        self.finished: dict[str, Trajectory] = {}
        """request id → the trajectory exactly as the engine returned it (tests compare the store with it)."""

    async def generate(self, request: Request) -> Trajectory:
        fut = asyncio.get_running_loop().create_future()
        self._enqueue(request, fut)
        return await fut

    def stream(self, request: Request) -> TokenStream:
        """Submit ``request`` and return its ``TokenStream`` (call from the event loop's thread)."""
        s = TokenStream(request.request_id)
        self._enqueue(request, s)
        return s

    def _enqueue(self, request: Request, waiter: asyncio.Future | TokenStream) -> None:
        with self._cv:
            if self._closed:
                raise DriverClosed("the engine driver is shut down (the run is ending); no new model calls")
            self._pending.append((request, asyncio.get_running_loop(), waiter))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="engine-driver", daemon=True)
                self._thread.start()
            self._cv.notify()

    def abort(self, request_id: str) -> None:
        """Stop a request before its next step (thread-safe); its caller gets the trajectory so far with
        ``finish_reason = "abort"``. Unknown or finished ids are ignored."""
        with self._cv:
            self._aborts.append(request_id)
            self._cv.notify()

    def hold(self) -> int:
        """Pause the engine after the step under way and stop stepping; returns how many requests were paused."""
        self._step_lock.acquire()
        self._paused = self.engine.pause()
        return len(self._paused)

    def release(self, weights: Any = None, version: int | None = None) -> None:
        """Load ``weights`` as ``version`` (None: keep the engine's), resume the paused requests, step again."""
        if self._paused is None:
            raise RuntimeError("release() without hold()")
        try:
            if weights is not None:
                self.engine.update_weights(weights, version)
            if self._paused:
                self.engine.resume(self._paused)
        finally:
            self._paused = None
            self._step_lock.release()
        with self._cv:
            self._cv.notify()

    @property
    def held(self) -> bool:
        return self._paused is not None

    def shutdown(self) -> None:
        """Refuse new calls and abort those in flight (their callers get what was sampled, finish ``abort``)."""
        with self._cv:
            self._closed = True
            self._aborts += list(self._waiting)
        if self.held:
            self.release()

    def _run(self) -> None:
        waiting = self._waiting
        while True:
            with self._cv:
                while not self._pending and not waiting:
                    self._aborts.clear()  # nothing in flight: nothing to abort
                    self._cv.wait()
                batch, self._pending = self._pending, []
                aborts, self._aborts = self._aborts, []
            with self._step_lock:  # not while held: a weight sync is under way
                self._round(batch, aborts)

    def _round(self, batch: list, aborts: list[str]) -> None:
        """Submit the queued calls, apply the aborts, take one engine step and hand out what it produced."""
        waiting = self._waiting
        try:
            if batch:
                for r, loop, w in batch:
                    waiting[r.request_id] = (loop, w)
                self.engine.submit([r for r, _, _ in batch])
            for t in self.engine.abort([a for a in aborts if a in waiting]) if aborts else []:
                self.finished[t.request_id] = t
                loop, w = waiting.pop(t.request_id)
                loop.call_soon_threadsafe(_settle, w, t, None)
            if not waiting:
                return
            out = self.engine.step()
        except Exception as e:  # an engine failure fails every waiting call, loudly
            log.exception("engine step failed; failing %d waiting calls", len(waiting))
            for loop, w in waiting.values():
                loop.call_soon_threadsafe(_settle, w, None, e)
            waiting.clear()
            return
        for rid, ids in out.new_tokens.items():
            lw = waiting.get(rid)
            if lw is not None and isinstance(lw[1], TokenStream):
                lw[0].call_soon_threadsafe(lw[1]._ids, ids)
        for t in out.finished:
            self.finished[t.request_id] = t
            loop, w = waiting.pop(t.request_id)
            loop.call_soon_threadsafe(_settle, w, t, None)


def _settle(waiter: asyncio.Future | TokenStream, result: Any, error: BaseException | None) -> None:
    """On the caller's event loop: finish a ``generate`` future or a ``TokenStream`` with a result or an error."""
    if isinstance(waiter, TokenStream):
        if error is not None:
            waiter._fail(error)
        else:
            waiter._done(result)
    elif waiter.done():  # the caller went away (cancelled)
        return
    elif error is not None:
        waiter.set_exception(error)
    else:
        waiter.set_result(result)
