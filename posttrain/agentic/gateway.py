"""The agentic gateway: an ordinary model service to the harness, token-in/token-out capture behind it.

Endpoints (FastAPI, bind 127.0.0.1): ``POST /v1/chat/completions``, ``POST /v1/responses``,
``POST /v1/messages``, ``POST /v1/messages/count_tokens``, ``GET /v1/models``; each also under
``/s/{sid}/v1/...``. The session is the API key (``Authorization: Bearer SID`` or ``x-api-key: SID``);
the path prefix wins when present (for harnesses that cannot set a key).

Per call: adapter → ``Conversation`` → chat template text → longest-prefix match in the session's
PrefixTree (``traces.py``) → input ids = stored ids of the matched path + ``encode(delta)`` → engine
(``RolloutEngine``: submit, then steps driven by one asyncio task for all sessions) → the engine's
output ids, logprobs, versions, routed experts are written to the store *before* the output is decoded
and wrapped in the protocol envelope. Returned text is never re-tokenised: the next call's prompt reuses
the stored ids as long as its rendering extends the stored text, and forks (recorded) otherwise.

Serve a model:  ``python -m posttrain.agentic.gateway --model DIR --port 8000``
(``DIR`` holds a causal LM and a tokenizer with a chat template, e.g. ``tiny.write_tiny_agentic``).
"""

import asyncio
import itertools
import threading
import zlib
from dataclasses import dataclass
from typing import Any

from posttrain.agentic.chat import Conversation, Generation, parse_output, render
from posttrain.agentic.protocols import (
    chat_events,
    chat_response,
    messages_events,
    messages_response,
    parse_chat,
    parse_messages,
    parse_responses,
    responses_events,
    responses_response,
    sse,
)
from posttrain.agentic.traces import TraceStore
from posttrain.rollout.types import Request, SamplingParams, Trajectory


@dataclass(frozen=True)
class GatewayConfig:
    """How the gateway samples and where it keeps traces."""

    default_max_tokens: int = 256
    """Completion budget when the request gives none (Anthropic always gives one)."""
    max_context: int = 4096
    """Prompts longer than this are refused with HTTP 400 (the harness sees a context-limit error)."""
    trace_path: str | None = None
    """SQLite file of the trace store (None = in memory)."""
    seed: int = 0
    """Base of the per-call sampling seed (a pure function of session and call index)."""
    return_routed_experts: bool = False
    """Ask the engine for MoE routes (R3; the engine needs an experts recorder) and store them per call."""


class EngineDriver:
    """Runs one ``RolloutEngine`` for many concurrent callers: ``await generate(request)``.

    The engine lives in its own thread, which takes every request queued since its last step, submits them
    and steps while any request is in flight; finished trajectories are handed back to each caller's event
    loop with ``call_soon_threadsafe``. So the step cadence does not wait for the HTTP event loop (a busy
    loop would otherwise delay every step of every request), and the engine is only touched by that thread
    (no locking inside engines). An engine failure fails the calls in flight, loudly, and the thread keeps
    serving later calls.
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._cv = threading.Condition()
        self._pending: list[tuple[Request, asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._thread: threading.Thread | None = None
        self.finished: dict[str, Trajectory] = {}
        """request id → the trajectory exactly as the engine returned it (tests compare the store with it)."""

    async def generate(self, request: Request) -> Trajectory:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self._cv:
            self._pending.append((request, loop, fut))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="engine-driver", daemon=True)
                self._thread.start()
            self._cv.notify()
        return await fut

    def _run(self) -> None:
        waiting: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        while True:
            with self._cv:
                while not self._pending and not waiting:
                    self._cv.wait()
                batch, self._pending = self._pending, []
            try:
                if batch:
                    for r, loop, f in batch:
                        waiting[r.request_id] = (loop, f)
                    self.engine.submit([r for r, _, _ in batch])
                out = self.engine.step()
            except Exception as e:  # an engine failure fails every waiting call, loudly
                for loop, f in waiting.values():
                    loop.call_soon_threadsafe(_settle, f, None, e)
                waiting.clear()
                continue
            for t in out.finished:
                self.finished[t.request_id] = t
                loop, f = waiting.pop(t.request_id)
                loop.call_soon_threadsafe(_settle, f, t, None)


def _settle(fut: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if fut.done():  # the caller went away (cancelled)
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


class Gateway:
    """Protocol-neutral core: ``await gateway.generate(session, conversation, protocol)``."""

    def __init__(self, engine: Any, tokenizer: Any, config: GatewayConfig = GatewayConfig(), store=None) -> None:
        self.tokenizer = tokenizer
        self.config = config
        self.driver = EngineDriver(engine)
        self.store = store if store is not None else TraceStore(config.trace_path)
        self.stop_ids = tuple(
            i for i in tokenizer.convert_tokens_to_ids([tokenizer.eos_token, "<|endoftext|>"]) if isinstance(i, int)
        )
        self._counter = itertools.count()
        self._session_locks: dict[str, asyncio.Lock] = {}

    def count_tokens(self, conv: Conversation) -> int:
        return len(self.tokenizer.encode(render(self.tokenizer, conv), add_special_tokens=False))

    async def generate(self, session: str, conv: Conversation, protocol: str) -> Generation:
        # One call at a time per session: the store's prefix match must see the previous response.
        lock = self._session_locks.setdefault(session, asyncio.Lock())
        async with lock:
            return await self._generate(session, conv, protocol)

    async def _generate(self, session: str, conv: Conversation, protocol: str) -> Generation:
        if conv.temperature < 0 or not 0 < conv.top_p <= 1:
            raise InvalidRequest(
                f"temperature must be >= 0 (0 = greedy) and top_p in (0, 1]; got {conv.temperature}, {conv.top_p}",
                "invalid_sampling_parameters",
            )
        text = render(self.tokenizer, conv)
        m = self.store.match_text(session, text)
        delta_text = text[m.offset :]
        delta_ids = self.tokenizer.encode(delta_text, add_special_tokens=False) if delta_text else []
        input_ids = m.path_ids + delta_ids
        if len(input_ids) > self.config.max_context:
            raise InvalidRequest(
                f"prompt has {len(input_ids)} tokens > max_context {self.config.max_context}", "context_length_exceeded"
            )
        n = next(self._counter)
        rid = f"{session}/{n}"
        seed = zlib.crc32(f"{self.config.seed}/{rid}".encode())
        params = SamplingParams(
            max_new_tokens=max(1, min(conv.max_tokens, self.config.max_context - len(input_ids))),
            temperature=conv.temperature,  # 0 = greedy (a point mass, see sampling_logprobs)
            top_p=conv.top_p,
            seed=seed,
            stop_token_ids=self.stop_ids,
            return_routed_experts=self.config.return_routed_experts,
        )
        traj = await self.driver.generate(Request(rid, input_ids, params, group_id=session))
        out_ids = list(traj.token_ids)
        # Capture first: the exact ids, logprobs, versions and experts, before any decoding/envelope.
        resp_text = self.tokenizer.decode(out_ids, skip_special_tokens=False)
        finish = "length" if traj.finish_reason == "length" else "stop"
        content = resp_text
        if out_ids and out_ids[-1] in self.stop_ids:
            content = self.tokenizer.decode(out_ids[:-1], skip_special_tokens=False)
        cid = f"{zlib.crc32(rid.encode()):08x}{n:06d}"
        body, calls, well_formed = parse_output(content, finish, cid)
        if calls:
            finish = "tool_calls"
        self.store.record_call(
            cid,
            session,
            m.node,
            (delta_text, delta_ids),
            (resp_text, out_ids, list(traj.logprobs), list(traj.versions), traj.routed_experts),
            finish,
            protocol,
            meta={
                "request_id": rid,
                "well_formed": well_formed,
                "tools": [t["function"]["name"] for t in conv.tools],
                "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in calls],
            },
            fork=m.fork,
        )
        return Generation(body, calls, finish, len(input_ids), len(out_ids), well_formed, cid)


class InvalidRequest(ValueError):
    """A request the gateway refuses with HTTP 400 (the harness sees an ordinary API error): ``code`` says why."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def session_of(headers: Any, sid: str | None) -> str:
    if sid:
        return sid
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    key = headers.get("x-api-key")
    if key:
        return key.strip()
    return "anonymous"


def build_app(gateway: Gateway):
    """The FastAPI app over a ``Gateway``."""
    from fastapi import FastAPI
    from fastapi import Request as HttpRequest
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI(title="scifolio agentic gateway")
    app.state.gateway = gateway
    default_max = gateway.config.default_max_tokens

    def stream(events) -> StreamingResponse:
        return StreamingResponse(sse(events), media_type="text/event-stream")

    async def run(req: HttpRequest, sid: str | None, parse, protocol: str):
        body = await req.json()
        conv = parse(body, default_max)
        try:
            g = await gateway.generate(session_of(req.headers, sid), conv, protocol)
        except InvalidRequest as e:
            err = {"type": "invalid_request_error", "message": str(e), "code": e.code}
            if protocol == "messages":
                return None, conv, body, JSONResponse({"type": "error", "error": err}, status_code=400)
            return None, conv, body, JSONResponse({"error": err}, status_code=400)
        return g, conv, body, None

    async def chat(req: HttpRequest, sid: str | None = None):
        g, conv, body, err = await run(req, sid, parse_chat, "chat")
        if err is not None:
            return err
        if conv.stream:
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return stream(chat_events(g, conv.model, usage))
        return JSONResponse(chat_response(g, conv.model))

    async def responses(req: HttpRequest, sid: str | None = None):
        g, conv, _, err = await run(req, sid, parse_responses, "responses")
        if err is not None:
            return err
        return (
            stream(responses_events(g, conv.model)) if conv.stream else JSONResponse(responses_response(g, conv.model))
        )

    async def messages(req: HttpRequest, sid: str | None = None):
        g, conv, _, err = await run(req, sid, parse_messages, "messages")
        if err is not None:
            return err
        return stream(messages_events(g, conv.model)) if conv.stream else JSONResponse(messages_response(g, conv.model))

    async def count_tokens(req: HttpRequest, sid: str | None = None):
        return {"input_tokens": gateway.count_tokens(parse_messages(await req.json(), default_max))}

    async def models(sid: str | None = None):
        return {"object": "list", "data": [{"id": "scifolio", "object": "model", "created": 0, "owned_by": "scifolio"}]}

    for prefix in ("", "/s/{sid}"):
        app.post(prefix + "/v1/chat/completions")(chat)
        app.post(prefix + "/v1/responses")(responses)
        app.post(prefix + "/v1/messages")(messages)
        app.post(prefix + "/v1/messages/count_tokens")(count_tokens)
        app.get(prefix + "/v1/models")(models)
    return app


def load_model_gateway(model: str, config: GatewayConfig = GatewayConfig(), capacity: int = 16) -> Gateway:
    """A gateway over ``HFEngine`` for a Hugging Face name or local dir (tokenizer with a chat template)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrain.rollout.engines.hf import HFEngine

    tok = AutoTokenizer.from_pretrained(model)
    if not tok.chat_template:
        raise ValueError(f"{model}: the tokenizer has no chat template; the gateway cannot render conversations")
    lm = AutoModelForCausalLM.from_pretrained(model)
    return Gateway(HFEngine(lm, capacity=capacity), tok, config)


def serve_gateway(model: str, host: str = "127.0.0.1", port: int = 8000, trace_path: str | None = None) -> int:
    """What ``scifolio posttrain gateway --model M --host H --port P`` runs (blocks until stopped)."""
    import uvicorn

    gw = load_model_gateway(model, GatewayConfig(trace_path=trace_path))
    uvicorn.run(build_app(gw), host=host, port=port, log_level="warning")
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--traces", default=None, help="SQLite file for the trace store")
    a = p.parse_args(argv)
    return serve_gateway(a.model, a.host, a.port, a.traces)


if __name__ == "__main__":
    raise SystemExit(main())


class ServerThread:
    """uvicorn on 127.0.0.1 and a free port, in a daemon thread (tests, benchmarks, in-process harnesses).

    with ServerThread(build_app(gw)) as url: ...   # url = "http://127.0.0.1:PORT"
    """

    def __init__(self, app, host: str = "127.0.0.1") -> None:
        import socket
        import threading

        import uvicorn

        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        self.url = f"http://{host}:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        import time

        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("gateway server did not start")
            time.sleep(0.02)
        return self.url

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
