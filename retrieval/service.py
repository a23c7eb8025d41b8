"""HTTP API and search page for the image index (FastAPI; binds 127.0.0.1 by default).

    scifolio index serve --uri ./index.db --embed-model tiny/retrieval/clip --captioner tiny/retrieval/captioner \\
        --reranker tiny/retrieval/reranker --shards out --port 8000
    curl -s localhost:8000/api/search/text -H 'content-type: application/json' -d '{"query": "phase diagram"}'

Endpoints: ``GET /`` page; ``GET /api/health``; ``POST /api/search/text`` JSON ``{query, k, rerank}``;
``POST /api/search/image`` multipart ``file`` (+ form ``k``, ``rerank``); ``GET /api/thumb/{sha256}?source=&row=``
(PNG thumbnail read from the crop's shard row).
"""

# No `from __future__ import annotations`: FastAPI resolves the locally defined request model at runtime.

import io
import re
import threading
from dataclasses import dataclass
from importlib import resources
from typing import Any

SHA_RE = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"
    """Interface to bind; loopback by default (put a reverse proxy in front to expose it)."""
    port: int = 8000
    """TCP port."""
    max_upload_bytes: int = 5 * 1024 * 1024
    """Largest accepted request body (image uploads); bigger requests get 413 before being read."""
    max_query_chars: int = 500
    """Longest accepted text query."""
    max_k: int = 100
    """Largest k a client may ask for."""
    max_pixels: int = 40_000_000
    """Uploaded images above this many pixels are refused (decompression bombs)."""
    thumb_px: int = 256
    """Longest side of served thumbnails."""
    shards: str | None = None
    """Build output directory the index was built from; thumbnails are read from it (None: no thumbnails)."""


def create_app(searcher, cfg: ServeConfig = ServeConfig()):
    """The FastAPI app around a ready ``Searcher`` (models loaded, index connected)."""
    from fastapi import FastAPI, File, Form, HTTPException, Query, Request, UploadFile
    from fastapi.responses import HTMLResponse, JSONResponse, Response
    from pydantic import BaseModel, Field

    app = FastAPI(title="scifolio image index", version="1")
    # One query at a time through the models: torch already uses every core per forward pass, and the
    # tokenizers/Milvus client are then never shared across threads mid-call.
    lock = threading.Lock()

    class TextQuery(BaseModel):
        query: str = Field(min_length=1, max_length=cfg.max_query_chars)
        k: int = Field(default=10, ge=1, le=cfg.max_k)
        rerank: bool = False

    @app.middleware("http")
    async def limit_body(request: Request, call_next):
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > cfg.max_upload_bytes):
            return JSONResponse({"detail": f"request body over {cfg.max_upload_bytes} bytes"}, status_code=413)
        return await call_next(request)

    def with_thumbs(payload: dict[str, Any]) -> dict[str, Any]:
        for r in payload["results"]:
            r["thumb"] = (
                f"/api/thumb/{r['sha256']}?source={r['source']}&row={r['row']}" if cfg.shards and r["source"] else None
            )
        return payload

    def run(fn, *a, **kw):
        try:
            with lock:
                return fn(*a, **kw)
        except ValueError as e:  # e.g. rerank asked but no reranker configured
            raise HTTPException(status_code=400, detail=str(e)) from e

    @app.get("/", response_class=HTMLResponse)
    def page() -> str:
        # Shipped beside the modules by the package-data "*.html" rule.
        return resources.files("retrieval").joinpath("search_page.html").read_text(encoding="utf-8")

    @app.get("/api/health")
    def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "shards": searcher.index.config.n_shards,
            "image_queries": searcher.captioner is not None,
            "rerank": searcher.reranker is not None,
            "channels": list(searcher.channels),
        }

    @app.post("/api/search/text")
    def search_text(q: TextQuery) -> dict[str, Any]:
        res = run(searcher.text, q.query, k=q.k, rerank=q.rerank)
        return with_thumbs(res.to_json())

    @app.post("/api/search/image")
    def search_image(
        file: UploadFile = File(...),
        k: int = Form(10, ge=1, le=cfg.max_k),
        rerank: bool = Form(False),
    ) -> dict[str, Any]:
        data = file.file.read(cfg.max_upload_bytes + 1)
        if len(data) > cfg.max_upload_bytes:  # chunked uploads carry no content-length
            raise HTTPException(status_code=413, detail=f"image over {cfg.max_upload_bytes} bytes")
        if not data:
            raise HTTPException(status_code=422, detail="empty upload")
        check_image(data, cfg.max_pixels)
        res = run(searcher.image, data, k=k, rerank=rerank)
        return with_thumbs(res.to_json())

    @app.get("/api/thumb/{sha256}")
    def thumb(sha256: str, source: str = Query(..., max_length=512), row: int = Query(..., ge=0)) -> Response:
        from retrieval.crops import read_image

        if not SHA_RE.match(sha256):
            raise HTTPException(status_code=422, detail="sha256 must be 64 lowercase hex characters")
        if not cfg.shards:
            raise HTTPException(status_code=404, detail="server started without --shards")
        try:
            png = read_image(cfg.shards, source, row, sha256)
        except FileNotFoundError as e:
            raise HTTPException(status_code=404, detail=str(e)) from e
        return Response(
            content=thumbnail(png, cfg.thumb_px),
            media_type="image/png",
            headers={"Cache-Control": "public, max-age=86400, immutable"},
        )

    return app


def check_image(data: bytes, max_pixels: int) -> None:
    """422 unless ``data`` decodes as an image of at most ``max_pixels`` pixels."""
    from fastapi import HTTPException
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:
            if im.width * im.height > max_pixels:
                raise HTTPException(status_code=413, detail=f"image over {max_pixels} pixels")
            im.verify()
    except (UnidentifiedImageError, OSError, SyntaxError) as e:
        raise HTTPException(status_code=422, detail=f"not a readable image: {e}") from e


def thumbnail(png: bytes, px: int) -> bytes:
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        im.thumbnail((px, px))
        out = io.BytesIO()
        im.save(out, format="PNG")
        return out.getvalue()


def serve(searcher, cfg: ServeConfig) -> None:
    """Run the API with uvicorn until interrupted."""
    import uvicorn

    uvicorn.run(create_app(searcher, cfg), host=cfg.host, port=cfg.port, log_level="info")
