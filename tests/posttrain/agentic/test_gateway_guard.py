"""The gateway's access and limits layer (``posttrain/agentic/guard.py``): keys map to session prefixes, every
refusal has the protocol's own 4xx shape and leaves nothing in the trace store, a non-loopback bind without keys
is refused at once, and a non-streaming client that goes away aborts its engine request."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from posttrain.agentic.gateway import Gateway, GatewayConfig, ServerThread, build_app
from posttrain.agentic.guard import GatewayLimits, Guard, load_api_keys
from posttrain.rollout.engines.scripted import ScriptedTokenEngine
from posttrain.tiny.agentic import build_tokenizer

ROOT = Path(__file__).resolve().parents[3]
ENDPOINTS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


def body(protocol: str, text: str = "hi", n: int = 1, **extra) -> dict:
    msgs = [{"role": "user", "content": text}] * n
    if protocol == "responses":
        return {"model": "m", "input": msgs, **extra}
    return {"model": "m", "messages": msgs, **({"max_tokens": 16} if protocol == "messages" else {}), **extra}


def assert_shape(protocol: str, r: httpx.Response, status: int) -> None:
    assert r.status_code == status, r.text
    j = r.json()
    if protocol == "messages":
        assert j["type"] == "error" and {"type", "message"} <= set(j["error"])
    else:
        assert {"message", "type", "code"} <= set(j["error"])


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tok = build_tokenizer()
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    engine = ScriptedTokenEngine(lambda req: tok.encode("ok", add_special_tokens=False) + [im_end])
    gw = Gateway(engine, tok, GatewayConfig(default_max_tokens=32, max_context=2048))
    keys_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys_file.write_text("# key prefix\nkey-a team-a:\nkey-b team-b:\n")
    guard = Guard(
        build_app(gw), load_api_keys(keys_file), GatewayLimits(max_body_bytes=4096, max_messages=8, max_tokens=64)
    )
    with ServerThread(guard) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield gw, guard, client


@pytest.mark.parametrize("protocol", list(ENDPOINTS))
def test_a_key_writes_only_under_its_own_prefix(served, protocol):
    gw, _, client = served
    a = {"Authorization": "Bearer key-a"} if protocol != "messages" else {"x-api-key": "key-a"}
    before = set(gw.store.session_calls)
    r = client.post(f"/s/team-a:{protocol}/v1" + ENDPOINTS[protocol][3:], json=body(protocol), headers=a)
    assert r.status_code == 200, r.text
    assert_shape(
        protocol, client.post(f"/s/team-b:{protocol}" + ENDPOINTS[protocol], json=body(protocol), headers=a), 403
    )
    assert_shape(protocol, client.post(ENDPOINTS[protocol], json=body(protocol)), 401)
    assert_shape(protocol, client.post(ENDPOINTS[protocol], json=body(protocol), headers={"x-api-key": "nope"}), 401)
    # no path session: the key's prefix is the session (never the key itself)
    assert client.post(ENDPOINTS[protocol], json=body(protocol), headers=a).status_code == 200
    new = set(gw.store.session_calls) - before
    assert f"team-a:{protocol}" in new and not any(s.startswith("team-b") or "key-" in s for s in new)


@pytest.mark.parametrize("protocol", list(ENDPOINTS))
def test_oversize_and_malformed_requests_get_the_protocols_4xx_and_store_nothing(served, protocol):
    gw, guard, client = served
    h = {"x-api-key": "key-b"}
    url = ENDPOINTS[protocol]
    rows = sum(len(v) for v in gw.store.session_calls.values())
    refused = guard.refused
    assert_shape(protocol, client.post(url, json=body(protocol, "x" * 5000), headers=h), 413)
    assert_shape(protocol, client.post(url, json=body(protocol, n=9), headers=h), 400)
    too_many = "max_output_tokens" if protocol == "responses" else "max_tokens"
    assert_shape(protocol, client.post(url, json={**body(protocol), too_many: 65}, headers=h), 400)
    assert_shape(protocol, client.post(url, json={**body(protocol), too_many: "many"}, headers=h), 400)
    assert_shape(protocol, client.post(url, content=b'{"model": "m", "messages": [', headers=h), 400)
    assert_shape(protocol, client.post(url, content=b"[1, 2]", headers=h), 400)
    assert guard.refused == refused + 6
    # schema-invalid bodies pass the guard and are refused by the protocol adapter: 400, never 500
    for bad in ({"model": "m", "messages": "hello"}, {"model": "m", "input": 7, "messages": [{"role": 3}]}):
        r = client.post(url, json={**bad, **({"max_tokens": 8} if protocol == "messages" else {})}, headers=h)
        assert 400 <= r.status_code < 500, (bad, r.status_code, r.text)
    assert sum(len(v) for v in gw.store.session_calls.values()) == rows


def test_keys_file_rejects_overlapping_prefixes(tmp_path):
    f = tmp_path / "keys.json"
    f.write_text(json.dumps({"k1": "team", "k2": "team-b"}))
    with pytest.raises(ValueError, match="prefix"):
        load_api_keys(f)


def test_a_non_loopback_bind_without_keys_exits_at_once():
    t0 = time.monotonic()
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.cli",
            "posttrain",
            "gateway",
            "--model",
            "no-such-model",
            "--host",
            "0.0.0.0",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode != 0 and "without --api-keys" in p.stderr, p.stderr[-2000:]
    assert time.monotonic() - t0 < 30


def test_a_vanished_non_streaming_client_aborts_its_engine_request():
    tok = build_tokenizer()
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    long = tok.encode("word " * 200, add_special_tokens=False) + [im_end]
    engine = ScriptedTokenEngine(lambda req: long, step_delay_s=0.02)
    gw = Gateway(engine, tok, GatewayConfig(default_max_tokens=400, max_context=4096))
    with ServerThread(Guard(build_app(gw))) as url:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/chat/completions", json=body("chat"), headers={"x-api-key": "s1"}, timeout=0.5)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not gw.driver.finished:
            time.sleep(0.05)
        (traj,) = gw.driver.finished.values()
        assert traj.finish_reason == "abort" and len(traj.token_ids) < len(long)
