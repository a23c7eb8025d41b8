"""The HTTP API (FastAPI TestClient, in-process: no socket) over a real Lite index and the tiny models."""

from __future__ import annotations

import io

import pytest

from retrieval.index import ShardedIndex
from retrieval.search import SearchConfig, load_searcher
from retrieval.service import ServeConfig, create_app

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(ready_index, tiny_models):
    from fastapi.testclient import TestClient

    s = load_searcher(
        ShardedIndex(ready_index["config"]),
        tiny_models["retrieval-clip"],
        tiny_models["retrieval-captioner"],
        tiny_models["retrieval-reranker"],
        config=SearchConfig(candidates=12),
    )
    app = create_app(s, ServeConfig(shards=str(ready_index["out"]), max_upload_bytes=200_000))
    with TestClient(app) as c:
        yield c
    s.index.close()


def test_page_and_health(client):
    page = client.get("/")
    assert page.status_code == 200 and 'id="query"' in page.text and 'id="grid"' in page.text
    assert client.get("/api/health").json() == {
        "status": "ok",
        "shards": 3,
        "image_queries": True,
        "rerank": True,
        "channels": ["clip"],
    }


def test_text_search_and_thumbnails(client, ready_index):
    r = client.post("/api/search/text", json={"query": "a green circle", "k": 4})
    assert r.status_code == 200
    body = r.json()
    assert body["query"] == "a green circle" and len(body["results"]) == 4
    first = body["results"][0]
    assert first["thumb"].startswith(f"/api/thumb/{first['sha256']}?source=shard-")
    t = client.get(first["thumb"])
    assert t.status_code == 200 and t.headers["content-type"] == "image/png" and t.content[:4] == b"\x89PNG"
    from PIL import Image

    original = next(c for c in ready_index["crops"] if c.sha256 == first["sha256"])
    assert Image.open(io.BytesIO(t.content)).size == (original.width, original.height)  # small: not resized


def test_text_search_with_rerank_scores_in_unit_interval(client):
    body = client.post("/api/search/text", json={"query": "a plot", "k": 3, "rerank": True}).json()
    assert len(body["results"]) == 3 and all(0 <= r["score"] <= 1 and r["quality"] >= 0 for r in body["results"])


def test_image_search(client, ready_index):
    crop = ready_index["crops"][0]
    r = client.post("/api/search/image", files={"file": ("q.png", crop.png, "image/png")}, data={"k": "3"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["caption"] is not None and body["results"][0]["sha256"] == crop.sha256


@pytest.mark.parametrize(
    "payload",
    [{"query": ""}, {"query": "x" * 501}, {"query": "ok", "k": 0}, {"query": "ok", "k": 101}, {"k": 3}],
)
def test_text_validation(client, payload):
    assert client.post("/api/search/text", json=payload).status_code == 422


def test_upload_limits_and_bad_images(client):
    big = b"\x89PNG" + b"0" * 300_000
    assert client.post("/api/search/image", files={"file": ("b.png", big, "image/png")}).status_code == 413
    bad = client.post("/api/search/image", files={"file": ("b.png", b"not an image", "image/png")})
    assert bad.status_code == 422 and "not a readable image" in bad.json()["detail"]
    assert client.post("/api/search/image", files={"file": ("e.png", b"", "image/png")}).status_code == 422


def test_thumb_rejects_bad_ids_and_paths(client, ready_index):
    crop = ready_index["crops"][0]
    assert client.get("/api/thumb/xyz?source=a&row=0").status_code == 422
    assert client.get(f"/api/thumb/{crop.sha256}?source=../../etc/passwd&row=0").status_code == 404
    assert client.get(f"/api/thumb/{crop.sha256}?source={crop.source}&row=3").status_code == 404  # wrong row
    assert client.get(f"/api/thumb/{crop.sha256}?source={crop.source}&row=-1").status_code == 422
