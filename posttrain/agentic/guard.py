"""Access and limits in front of the agentic gateway: an ASGI layer around ``gateway.build_app``.

- **Keys** (``--api-keys FILE``): each allowed key maps to a session prefix. A call must carry a known key
  (``Authorization: Bearer KEY`` or ``x-api-key: KEY``; 401 otherwise), and its session is the path's
  ``/s/{sid}`` only when ``sid`` starts with the key's prefix (403 otherwise), else the prefix itself: a client
  cannot write into, or extend (read through the prefix match), another client's sessions. Without keys the
  gateway is open (the key names the session, as before), which ``serve_gateway`` allows on loopback only.
- **Limits**, checked before anything is parsed or tokenised: body bytes (413, from ``Content-Length`` or while
  reading), then a JSON object (400), message count (400) and ``max_tokens`` (400).

Every refusal has the protocol's own error shape (``Protocol.error``), so SDKs raise their ordinary API errors.
Paths, error shapes and the conversation field come from ``protocols.PROTOCOLS``; nothing here names a protocol.

    pytest tests/posttrain/agentic/test_gateway_guard.py

The key file: JSON ``{"KEY": "PREFIX", ...}``, or one ``KEY PREFIX`` per line (``#`` comments).
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from posttrain.agentic.protocols import PROTOCOLS, Protocol

_PATHS: dict[str, Protocol] = {path: p for p in PROTOCOLS for path in (p.path, *p.extra_paths)}
_PATHS["/v1/models"] = _OPENAI = PROTOCOLS[0]  # an OpenAI endpoint: OpenAI's error shape


@dataclass(frozen=True)
class GatewayLimits:
    """What one request may ask of the gateway."""

    max_body_bytes: int = 1 << 20
    """Request body size (413 above)."""
    max_messages: int = 512
    """Messages (chat, messages) or input items (responses) per request."""
    max_tokens: int = 8192
    """Largest completion budget a request may ask for (``max_tokens`` / ``max_completion_tokens`` /
    ``max_output_tokens``)."""


def load_api_keys(path: str | Path) -> dict[str, str]:
    """key → session prefix, from a JSON object or ``KEY PREFIX`` lines; a clear error on anything else."""
    text = Path(path).read_text()
    if text.lstrip().startswith("{"):
        keys = json.loads(text)
    else:
        keys = {}
        for n, line in enumerate(text.splitlines(), 1):
            if parts := line.split("#", 1)[0].split():
                if len(parts) != 2:
                    raise ValueError(f"{path}:{n}: expected 'KEY PREFIX'")
                keys[parts[0]] = parts[1]
    if not keys or not all(isinstance(k, str) and isinstance(v, str) and k and v for k, v in keys.items()):
        raise ValueError(f"{path}: no keys, or a key or prefix that is not a non-empty string")
    prefixes = sorted(keys.values())
    for a, b in zip(prefixes, prefixes[1:]):
        if b.startswith(a):  # one client's sessions would be another's
            raise ValueError(f"{path}: session prefix {a!r} is a prefix of {b!r}")
    return keys


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Refused(Exception):
    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


def _route(path: str) -> tuple[str | None, Protocol | None, str]:
    """(session from ``/s/{sid}``, protocol, the path without the session part)."""
    sid = None
    if path.startswith("/s/"):
        sid, _, tail = path[3:].partition("/")
        path = "/" + tail
    return sid, _PATHS.get(path), path


def api_key(headers: Any) -> str | None:
    """The request's key: ``Authorization: Bearer KEY`` (OpenAI SDKs), else ``x-api-key`` (Anthropic's); None if
    neither (a blank ``x-api-key`` is none)."""
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return headers.get("x-api-key", "").strip() or None


def _check_body(body: dict[str, Any], protocol: Protocol, limits: GatewayLimits) -> None:
    items = body.get(protocol.items_field)
    if isinstance(items, list) and len(items) > limits.max_messages:
        raise Refused(400, f"{len(items)} messages > the limit of {limits.max_messages}", "too_many_messages")
    for field in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        v = body.get(field)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise Refused(400, f"{field} must be a positive integer", "invalid_max_tokens")
        if v > limits.max_tokens:
            raise Refused(400, f"{field} {v} > the limit of {limits.max_tokens}", "max_tokens_too_large")


class Guard:
    """ASGI middleware: ``Guard(build_app(gateway), keys, limits)``."""

    def __init__(self, app: Any, keys: dict[str, str] | None = None, limits: GatewayLimits = GatewayLimits()) -> None:
        self.app, self.keys, self.limits = app, keys, limits
        self.refused = 0
        """Requests refused here (they never reach the gateway or its trace store)."""

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sid, protocol, tail = _route(scope["path"])
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        try:
            if protocol is None:
                raise Refused(404, f"no such endpoint: {scope['path']}", "not_found")
            scope = self._authorize(scope, headers, sid, tail)
            if scope["method"] != "POST":
                await self.app(scope, receive, send)
                return
            body = await self._read(headers, receive)
            try:
                parsed = json.loads(body)
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise Refused(400, f"the body is not JSON: {e}", "invalid_json") from None
            if not isinstance(parsed, dict):
                raise Refused(400, "the body must be a JSON object", "invalid_json")
            _check_body(parsed, protocol, self.limits)
        except Refused as r:
            self.refused += 1
            await _respond(send, r.status, (protocol or _OPENAI).error(r.status, str(r), r.code))
            return
        await self.app(scope, _replay(body, receive), send)

    def _authorize(self, scope: dict, headers: dict[str, str], sid: str | None, tail: str) -> dict:
        if self.keys is None:
            return scope
        key = api_key(headers)
        prefix = self.keys.get(key) if key else None
        if prefix is None:
            raise Refused(401, "missing or unknown API key", "invalid_api_key")
        if sid is not None and not sid.startswith(prefix):
            raise Refused(403, f"this key may only use sessions starting with {prefix!r}", "session_forbidden")
        session = sid if sid is not None else prefix
        if "/" in session:
            raise Refused(400, "a session id cannot contain '/'", "invalid_session")
        return {**scope, "path": f"/s/{session}{tail}", "raw_path": f"/s/{quote(session, safe='')}{tail}".encode()}

    async def _read(self, headers: dict[str, str], receive: Any) -> bytes:
        limit = self.limits.max_body_bytes
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise Refused(413, f"the body has {declared} bytes > the limit of {limit}", "request_too_large")
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                raise Refused(400, "the client went away", "disconnected")
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise Refused(413, f"the body has more than {limit} bytes", "request_too_large")
            chunks.append(chunk)
            if not msg.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes, receive: Any) -> Any:
    sent = False

    async def inner() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # then the real channel: the app sees the client's disconnect

    return inner


async def _respond(send: Any, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
