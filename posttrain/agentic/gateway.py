"""The agentic gateway: an ordinary model service to the harness, token-in/token-out capture behind it.

Endpoints (``build_app``): one per protocol, ``/v1/messages/count_tokens`` and ``/v1/models``, each also under
``/s/{sid}/v1/...``. The session is the API key (``Authorization: Bearer SID`` or ``x-api-key: SID``); the path
prefix wins when present (for harnesses that cannot set a key).

Per call: adapter → ``Conversation`` → chat template text → longest-prefix match in the session's
PrefixTree (``traces.py``) → input ids = stored ids of the matched path + ``encode(delta)`` → engine
(``RolloutEngine``: submit, then steps driven by one engine thread for all sessions, ``driver.py``) → the engine's
``Trajectory`` (output ids, logprobs, versions, routed experts) goes into the store as it is, *before* the output
is decoded and wrapped in the protocol envelope (``protocols.PROTOCOLS``). Returned text is never re-tokenised: the
next call's prompt reuses the stored ids as long as its rendering extends the stored text, and forks (recorded)
otherwise.

Streaming (``"stream": true``) is incremental: each engine step's new ids (``EngineDriver.stream``) are decoded
(``IncrementalDecoder``) and their final text (``Gateway._final_text``) is sent at once, so a harness's time to
first token is the engine's; the tool calls, finish reason and usage follow the capture. A failure after the stream
began ends it with the protocol's own error event (``Protocol.stream_error``, framed by ``protocols.sse``).

Serve a model:  ``scifolio posttrain gateway --model DIR --port 8000`` (flags in ``pipelines/cli/posttrain.py``)
(``DIR`` holds a causal LM and a tokenizer with a chat template, e.g. ``tiny.write_tiny_agentic``).
"""

import asyncio
import itertools
import logging
import zlib
from dataclasses import dataclass, replace
from typing import Any

from formats.chat_images import BadImage
from posttrain import toolcall
from posttrain.agentic.chat import Conversation, Generation, GenerationStream, parse_output, render
from posttrain.agentic.driver import DriverClosed, EngineDriver
from posttrain.agentic.guard import api_key
from posttrain.agentic.images import MARKER, ImageKeys
from posttrain.agentic.protocols import MESSAGES, PROTOCOLS, Protocol, sse
from posttrain.agentic.traces import TraceStore
from posttrain.rollout.types import Request, SamplingParams, Trajectory

log = logging.getLogger(__name__)


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
    image_root: str | None = None
    """Folder whose files image parts may name by path (a harness on this host); None = data URLs only."""


def byte_level_decode(tokenizer: Any) -> bool:
    """True when the tokenizer's decode is plain byte concatenation: a fast tokenizer whose decoder is
    ``ByteLevel`` (Qwen style) with no clean-up of spaces. Then decode(a + b) == decode(a) + decode(b)
    whenever a's bytes end on a character boundary (``IncrementalDecoder``)."""
    from tokenizers import decoders

    backend = getattr(tokenizer, "backend_tokenizer", None)
    return (
        backend is not None
        and isinstance(backend.decoder, decoders.ByteLevel)
        and not getattr(tokenizer, "clean_up_tokenization_spaces", False)
    )


class IncrementalDecoder:
    """The decoded text of one call's growing output (``Gateway.stream``); ``decoder(ids)`` → text of all ``ids``.

    ``incremental=False``: decode the whole output again every time (exact for any tokenizer; O(n²) over a reply).
    ``incremental=True`` (only for ``byte_level_decode`` tokenizers): remember the longest prefix decoded so far
    that ends on a character boundary (its decoded tail held no U+FFFD) and decode only the ids after it, O(n)
    over a reply (``Gateway._stream`` checks the streamed text against the capture's full decode).
    """

    def __init__(self, tokenizer: Any, incremental: bool) -> None:
        self.tokenizer = tokenizer
        self.incremental = incremental
        self._n = 0
        self._text = ""
        """``ids[:_n]`` decode to ``_text``, which ends on a character boundary."""

    def __call__(self, ids: list[int]) -> str:
        if not self.incremental:
            return self.tokenizer.decode(ids, skip_special_tokens=False)
        tail = self.tokenizer.decode(ids[self._n :], skip_special_tokens=False)
        if "\ufffd" in tail:  # maybe an incomplete character: keep the boundary where it is
            return self._text + tail
        self._n, self._text = len(ids), self._text + tail
        return self._text


@dataclass
class _Call:
    """A validated model call, before the engine runs it."""

    request: Request
    call_id: str
    match: Any
    """The store's prefix match (``traces.Match``) the prompt was built on."""
    delta: tuple[str, list[int]]
    """Rendered text past the match, and its ids."""
    conv: Conversation
    protocol: str
    images: list[str]
    """Content hashes of the prompt's images, in order (the trace store's image references)."""


class Gateway:
    """Protocol-neutral core: ``await gateway.generate(session, conversation, protocol)`` for a finished
    ``Generation``, or ``await gateway.stream(...)`` for a ``GenerationStream`` of text deltas as they decode."""

    def __init__(
        self, engine: Any, tokenizer: Any, config: GatewayConfig = GatewayConfig(), store=None, processor: Any = None
    ) -> None:
        self.tokenizer = tokenizer
        self.images = ImageKeys(processor, config.image_root) if processor is not None else None
        """A vision-language model's image side (``images.py``): calls with image parts need it."""
        self.config = config
        self.driver = EngineDriver(engine)
        self.store = store if store is not None else TraceStore(config.trace_path)
        self.stop_ids = tuple(
            i for i in tokenizer.convert_tokens_to_ids([tokenizer.eos_token, "<|endoftext|>"]) if isinstance(i, int)
        )
        stop_texts = [tokenizer.decode([i], skip_special_tokens=False) for i in self.stop_ids]
        self._held_markers = tuple(m for m in (toolcall.OPEN, *stop_texts) if m)
        """Text whose beginning at the end of a partial output is not streamed yet (it may become a tool call)."""
        self.incremental_decode = byte_level_decode(tokenizer)
        """Streams decode only the new ids (byte-level tokenizers) instead of the whole output at every step."""
        self._counter = itertools.count()
        self._session_calls: dict[str, int] = {}
        self._session_locks: dict[str, asyncio.Lock] = {}
        self._streams: set[asyncio.Task] = set()

    def count_tokens(self, conv: Conversation) -> int:
        return len(self._encode(self._render(conv)))

    def _render(self, conv: Conversation) -> str:
        """The chat template's text of the conversation; with a vision-language model, keyed text (each image's
        placeholder carries its content hash, ``images.py``). ``InvalidRequest`` for what cannot be rendered."""
        try:
            if self.images is None:
                if any(isinstance(m.get("content"), list) for m in conv.messages):
                    raise InvalidRequest(
                        "this model takes no images: serve a vision-language model (`pretrain export --vlm`)",
                        "images_not_supported",
                    )
                return render(self.tokenizer, conv)
            messages, hashes = self.images.resolve(conv.messages)
            return self.images.key(render(self.tokenizer, replace(conv, messages=messages)), hashes)
        except BadImage as e:
            raise InvalidRequest(f"image part: {e}", f"image_{e.reason}") from e
        except InvalidRequest:
            raise
        except Exception as e:  # the chat template refused the conversation (wrong types, roles): the client's
            raise InvalidRequest(
                f"the conversation cannot be rendered: {type(e).__name__}: {e}", "invalid_request"
            ) from e

    def _encode(self, text: str) -> list[int]:
        if self.images is not None:
            return self.images.encode(text, self.tokenizer)
        return self.tokenizer.encode(text, add_special_tokens=False)

    async def generate(self, session: str, conv: Conversation, protocol: str) -> Generation:
        # One call at a time per session: the store's prefix match must see the previous response.
        lock = self._session_locks.setdefault(session, asyncio.Lock())
        async with lock:
            call = self._prepare(session, conv, protocol)
            try:
                traj = await self.driver.generate(call.request)
            except asyncio.CancelledError:  # the client went away: free the engine slot before its next step
                self.driver.abort(call.request.request_id)
                raise
            return self._capture(call, traj)

    async def stream(self, session: str, conv: Conversation, protocol: str) -> GenerationStream:
        """Validate and submit the call (``InvalidRequest`` is raised here, before any byte is sent), then return
        its ``GenerationStream``. A task of its own runs the call and captures it; it holds the session's lock until
        the capture is done. If the harness goes away (the HTTP stream is closed: ``GenerationStream.abandon``), the
        engine request is aborted before its next step, freeing its slot, and the tokens generated so far are
        captured with finish ``abort``."""
        lock = self._session_locks.setdefault(session, asyncio.Lock())
        await lock.acquire()
        try:
            call = self._prepare(session, conv, protocol)
            out = GenerationStream(call.call_id, len(call.request.prompt_ids))
            out.on_abandon = lambda: self.driver.abort(call.request.request_id)
            task = asyncio.get_running_loop().create_task(self._stream(call, out, lock))
        except BaseException:
            lock.release()
            raise
        self._streams.add(task)
        task.add_done_callback(self._streams.discard)
        return out

    async def _stream(self, call: _Call, out: GenerationStream, lock: asyncio.Lock) -> None:
        try:
            tokens = self.driver.stream(call.request)
            decode = IncrementalDecoder(self.tokenizer, self.incremental_decode)
            ids: list[int] = []
            sent = ""
            async for new in tokens:
                ids += new
                text = self._final_text(ids, decode, len(sent))
                if len(text) > len(sent) and text.startswith(sent):
                    out.put(text[len(sent) :])
                    sent = text
            g = self._capture(call, tokens.trajectory)  # capture first: before the finish/usage events
            if not g.text.startswith(sent):
                raise RuntimeError(f"{call.call_id}: streamed text {sent!r} is not a prefix of the output {g.text!r}")
            if len(g.text) > len(sent):
                out.put(g.text[len(sent) :])
            out.put(g)
        except BaseException as e:  # the stream's reader sees the failure; nothing is swallowed
            out.put(e)
            if not isinstance(e, Exception):
                raise
        finally:
            lock.release()

    def _final_text(self, ids: list[int], decode: IncrementalDecoder, n_sent: int) -> str:
        """The part of a partial output's text that no later token can change: decoded without a trailing stop
        token, cut at ``<tool_call>`` (calls are sent whole at the end), and without a trailing incomplete UTF-8
        character or a trailing prefix of ``<tool_call>`` / a stop token's text."""
        if ids and ids[-1] in self.stop_ids:
            ids = ids[:-1]
        text = decode(ids)
        cut = text.find(toolcall.OPEN, max(0, n_sent - len(toolcall.OPEN)))  # the text sent holds no tool call
        if cut >= 0:
            return text[:cut].rstrip("\ufffd")
        text = text.rstrip("\ufffd")
        held = toolcall.held_prefix(text, self._held_markers)
        return text[: len(text) - held]

    def _prepare(self, session: str, conv: Conversation, protocol: str) -> _Call:
        if conv.temperature < 0 or not 0 < conv.top_p <= 1:
            raise InvalidRequest(
                f"temperature must be >= 0 (0 = greedy) and top_p in (0, 1]; got {conv.temperature}, {conv.top_p}",
                "invalid_sampling_parameters",
            )
        text = self._render(conv)
        m = self.store.match_text(session, text)
        delta_text = text[m.offset :]
        delta_ids = self._encode(delta_text) if delta_text else []
        input_ids = m.path_ids + delta_ids
        if len(input_ids) > self.config.max_context:
            raise InvalidRequest(
                f"prompt has {len(input_ids)} tokens > max_context {self.config.max_context}", "context_length_exceeded"
            )
        n = next(self._counter)
        k = self._session_calls[session] = self._session_calls.get(session, -1) + 1
        rid = f"{session}/{k}"  # the session's k-th call: its seed does not depend on other sessions' timing
        seed = zlib.crc32(f"{self.config.seed}/{rid}".encode())
        params = SamplingParams(
            max_new_tokens=max(1, min(conv.max_tokens, self.config.max_context - len(input_ids))),
            temperature=conv.temperature,  # 0 = greedy (a point mass, see sampling_logprobs)
            top_p=conv.top_p,
            seed=seed,
            stop_token_ids=self.stop_ids,
            return_routed_experts=self.config.return_routed_experts,
        )
        cid = f"{zlib.crc32(rid.encode()):08x}{n:06d}"
        images = MARKER.findall(text)
        pixels, decoded = self.images.pixels(images) if images else (None, ())
        request = Request(rid, input_ids, params, group_id=session, pixel_values=pixels, images=decoded)
        return _Call(request, cid, m, (delta_text, delta_ids), conv, protocol, images)

    def _capture(self, call: _Call, traj: Trajectory) -> Generation:
        """Store the engine's ``Trajectory`` as it is (ids, logprobs, versions, experts), then parse the output."""
        out_ids = list(traj.token_ids)
        resp_text = self.tokenizer.decode(out_ids, skip_special_tokens=False)
        finish = traj.finish_reason if traj.finish_reason in ("length", "abort") else "stop"
        content = resp_text
        if out_ids and out_ids[-1] in self.stop_ids:
            content = self.tokenizer.decode(out_ids[:-1], skip_special_tokens=False)
        body, calls, well_formed = parse_output(content, "stop" if finish == "abort" else finish, call.call_id)
        if calls and finish != "abort":
            finish = "tool_calls"
        meta = {
            "request_id": call.request.request_id,
            "well_formed": well_formed,
            "tools": [t["function"]["name"] for t in call.conv.tools],
            "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in calls],
            "images": call.images,
        }
        self.store.record_call(
            call.call_id,
            call.request.group_id,
            call.match.node,
            call.delta,
            resp_text,
            traj,
            finish,
            call.protocol,
            meta=meta,
            fork=call.match.fork,
        )
        return Generation(body, calls, finish, len(call.request.prompt_ids), len(out_ids), well_formed, call.call_id)


class InvalidRequest(ValueError):
    """A request the gateway refuses with HTTP 400 (the harness sees an ordinary API error): ``code`` says why."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def build_app(gateway: Gateway):
    """The FastAPI app over a ``Gateway``: one route per protocol of ``PROTOCOLS`` (and its ``/s/{sid}`` twin),
    plus Messages' ``count_tokens`` and ``/v1/models``."""
    from fastapi import FastAPI
    from fastapi import Request as HttpRequest
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI(title="scifolio agentic gateway")
    app.state.gateway = gateway
    default_max = gateway.config.default_max_tokens

    def stream(events, protocol: Protocol, g: GenerationStream) -> StreamingResponse:
        async def body():
            done = False
            try:
                async for chunk in sse(events, protocol):
                    yield chunk
                done = True
            finally:  # closed or cancelled before the end: the client went away
                if not done:
                    g.abandon()

        return StreamingResponse(body(), media_type="text/event-stream")

    async def _unless_disconnected(req: HttpRequest, work):
        """Await a non-streaming call, cancelling it (and so aborting its engine request) if the client goes away."""
        task = asyncio.ensure_future(work)
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.25)
            if done:
                return task.result()
            if await req.is_disconnected():
                task.cancel()
                raise InvalidRequest("the client went away", "client_disconnected")

    def route(protocol: Protocol):
        async def call(req: HttpRequest, sid: str | None = None):
            try:
                try:
                    body = await req.json()
                    conv = protocol.parse(body, default_max)
                except (ValueError, TypeError, KeyError, AttributeError, IndexError) as e:  # malformed: the client's
                    raise InvalidRequest(f"malformed request: {type(e).__name__}: {e}", "invalid_request") from None
                session = sid or (key if (key := api_key(req.headers)) is not None else "anonymous")
                if conv.stream:
                    s = await gateway.stream(session, conv, protocol.name)
                    return stream(protocol.events(s, conv, body), protocol, s)
                g = await _unless_disconnected(req, gateway.generate(session, conv, protocol.name))
                if g.finish == "abort":  # aborted by the driver's shutdown (the client is still here)
                    raise DriverClosed("the call was aborted: the run serving this gateway is ending")
            except InvalidRequest as e:
                return JSONResponse(protocol.error(400, str(e), e.code), status_code=400)
            except DriverClosed as e:  # the run serving this gateway is ending
                return JSONResponse(protocol.error(503, str(e), "shutting_down"), status_code=503)
            return JSONResponse(protocol.response(g, conv, body))

        return call

    async def count_tokens(req: HttpRequest, sid: str | None = None):
        try:
            return {"input_tokens": gateway.count_tokens(MESSAGES.parse(await req.json(), default_max))}
        except InvalidRequest as e:
            return JSONResponse(MESSAGES.error(400, str(e), e.code), status_code=400)

    async def models(sid: str | None = None):
        return {"object": "list", "data": [{"id": "scifolio", "object": "model", "created": 0, "owned_by": "scifolio"}]}

    for prefix in ("", "/s/{sid}"):
        for protocol in PROTOCOLS:
            app.post(prefix + protocol.path)(route(protocol))
        app.post(prefix + "/v1/messages/count_tokens")(count_tokens)
        app.get(prefix + "/v1/models")(models)
    return app


def load_model_gateway(model: str, config: GatewayConfig = GatewayConfig(), capacity: int = 16) -> Gateway:
    """A gateway over ``HFEngine`` for a Hugging Face name or local dir (tokenizer with a chat template); a
    vision-language model (``pretrain export --vlm``) takes image parts through its processor."""
    from posttrain.rl.engines import PolicyConfig, build_policy, load_processor
    from posttrain.rollout.engines.hf import HFEngine

    policy = PolicyConfig(path=model)
    lm, tok = build_policy(policy)  # the one policy loader
    if not tok.chat_template:
        raise ValueError(f"{model}: the tokenizer has no chat template; the gateway cannot render conversations")
    processor = load_processor(policy)
    return Gateway(HFEngine(lm.eval(), capacity=capacity), tok, config, processor=processor)


def serve_gateway(
    model: str, host: str = "127.0.0.1", port: int = 8000, trace_path: str | None = None, api_keys: str | None = None
) -> int:
    """What ``scifolio posttrain gateway --model M --host H --port P [--api-keys FILE]`` runs (blocks until
    stopped), behind ``guard.Guard`` (keys and request limits). Without keys it binds loopback only: refused
    (exit 2, before the model loads) for any other host."""
    import sys

    import uvicorn

    from posttrain.agentic.guard import Guard, is_loopback, load_api_keys

    if api_keys is None and not is_loopback(host):
        print(
            f"error: refusing to bind {host} without --api-keys: any client that can reach the port could write into "
            "any session's traces (give --api-keys FILE, or bind 127.0.0.1)",
            file=sys.stderr,
        )
        return 2
    keys = load_api_keys(api_keys) if api_keys else None
    gw = load_model_gateway(model, GatewayConfig(trace_path=trace_path))
    uvicorn.run(Guard(build_app(gw), keys), host=host, port=port, log_level="warning")
    return 0


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
