"""Fixtures: tiny models, generated shards with PIL-drawn crops, and the two Milvus backends.

The "server" backend starts the PyPI ``milvus`` standalone server, which binds every interface, so it only
runs inside a loopback-only network namespace:
    unshare -n sh -c 'ip link set lo up && exec .venv/bin/python -m pytest tests/retrieval -q'
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from retrieval_fakes import COLORS, loopback_only, make_rows

from formats.shards import write_shard


@pytest.fixture
def corpus_out(tmp_path: Path) -> Path:
    """A build output directory with two shard files, 4 chunks, 12 distinct crops (circles in one document,
    squares in the other)."""
    d = tmp_path / "out"
    names = list(COLORS)
    write_shard(d / "shards" / "shard-00000-of-00002.parquet", make_rows("doc-a", names, "circle"))
    write_shard(d / "shards" / "shard-00001-of-00002.parquet", make_rows("doc-b", names, "square"))
    return d


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, str]:
    from pipelines.tiny import write_area

    return write_area(tmp_path_factory.mktemp("tiny"), "retrieval")


@pytest.fixture(scope="session")
def milvus_server(tmp_path_factory):
    """A real Milvus standalone server on 127.0.0.1:19530 for the session; stopped cleanly at the end."""
    if not loopback_only():
        pytest.skip(
            "Milvus server binds all interfaces: run inside a loopback-only namespace "
            "(unshare -n sh -c 'ip link set lo up && exec python -m pytest tests/retrieval')"
        )
    from milvus import default_server

    default_server.set_base_dir(str(tmp_path_factory.mktemp("milvus-server")))
    # Index builds mostly wait on the server's scheduler, not the CPU: run several at once (as
    # benchmarks/index_scale.py and infra/milvus/values.yaml do; the server's default is 1).
    default_server.config.set("indexNode.scheduler.buildParallel", 4)
    default_server.start()
    try:
        yield f"http://127.0.0.1:{default_server.listen_port}"
    finally:
        default_server.stop()


@pytest.fixture(params=["lite", "server"])
def index_config_factory(request, tmp_path: Path):
    """Build IndexConfigs on the backend under test: a fresh Lite file, or unique collections on the server."""
    from retrieval.index import IndexConfig

    if request.param == "lite":
        uri = str(tmp_path / "index.db")
    else:
        uri = request.getfixturevalue("milvus_server")
    prefix = f"t{uuid.uuid4().hex[:8]}"

    def make(**kw) -> IndexConfig:
        kw.setdefault("name", prefix)
        return IndexConfig(uri=uri, **kw)

    made = []
    yield lambda **kw: made.append(make(**kw)) or made[-1]
    if request.param == "server":  # leave the shared server clean for the next test
        from retrieval.index import ShardedIndex

        for cfg in made:
            with ShardedIndex(cfg) as ix:
                ix.drop()


@pytest.fixture(scope="module")
def ready_index(tmp_path_factory, tiny_models):
    """A Milvus Lite index of the 12 fixture crops, embedded with the tiny CLIP (no Beam: fast)."""
    from formats.shards import list_shards
    from retrieval.crops import iter_crops
    from retrieval.embed import EmbedConfig, LoadedEmbedder, STEmbedder
    from retrieval.index import IndexConfig, IndexRow, ShardedIndex

    root = tmp_path_factory.mktemp("ready")
    out = root / "out"
    names = list(COLORS)
    write_shard(out / "shards" / "shard-00000-of-00002.parquet", make_rows("doc-a", names, "circle"))
    write_shard(out / "shards" / "shard-00001-of-00002.parquet", make_rows("doc-b", names, "square"))
    emb = LoadedEmbedder.load(STEmbedder(EmbedConfig(tiny_models["retrieval-clip"])))
    crops = [c for p in list_shards(out) for c in iter_crops(p, out)]
    vecs = emb.encode_images([c.png for c in crops])
    cfg = IndexConfig(uri=str(root / "index.db"), name="crops", n_shards=3)
    with ShardedIndex(cfg) as ix:
        ix.ensure(emb.dim)
        ix.upsert([IndexRow.from_crop(c, v) for c, v in zip(crops, vecs)])
    return {"config": cfg, "out": out, "crops": crops}


@pytest.fixture(scope="session")
def cited_out(tmp_path_factory, tiny_tokenizer: str) -> Path:
    """Two papers whose body cites their figures ("Fig. 2(a)", "Figs. 3 and 4", "Abbildung 2"), built once per
    session through ``scifolio build`` (the citation and text-channel tests share it)."""
    from cited_corpus import build_cited_corpus

    return build_cited_corpus(tmp_path_factory.mktemp("cited"), tiny_tokenizer)
