"""Session-wide fixtures: offline environment and tiny locally-built models."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Tests never touch the network: any hub lookup fails fast instead of hanging.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
_ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(_ROOT / ".cache" / "torch_extensions"))
os.environ.setdefault("MINERU_HOME", str(_ROOT / ".cache" / "mineru"))
os.environ.setdefault("SCIFOLIO_NATIVE_CACHE", str(_ROOT / ".cache" / "native"))
# Ray 2.60 turns token auth on for a local ray.init() (writing ~/.ray/auth_token) and for `ray start` whenever
# that file exists, but a driver joining a cluster decides on its own: one test's in-process head then locks
# the next test's `ray start` cluster out. Test clusters live in a loopback-only namespace: say it once.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Groups for pytest-xdist (`make test` runs ``-n 2 --dist loadgroup --no-loadscope-reorder``): a module's tests
    run on one worker, so its module fixtures are built once, and every test on the session's Milvus server shares
    one worker, since the server binds fixed ports (19530, ...) and a second worker could not start its own.
    Groups holding a slow or integration test go first (in collection order otherwise): a multi-minute test
    dealt out last would leave the other worker idle at the end."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(_xdist_group(item)))
    group = {id(item): item.get_closest_marker("xdist_group").args[0] for item in items}
    heavy = {
        group[id(item)] for item in items if item.get_closest_marker("slow") or item.get_closest_marker("integration")
    }
    items.sort(key=lambda item: group[id(item)] not in heavy)  # stable: the order within each part is kept


def _xdist_group(item: pytest.Item) -> str:
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "milvus_server" in getattr(item, "fixturenames", ()) or params.get("index_config_factory") == "server":
        return "milvus-server"
    return item.nodeid.split("::")[0]


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> str:
    from pipelines.tiny import write_tiny_tokenizer

    return str(write_tiny_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer"))


@pytest.fixture(scope="session")
def tiny_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(``scifolio models tiny`` dir, ``scifolio build`` output of the generated PDFs), both written through the CLI
    once for the session; the chain tests read them and write only into their own directories."""
    from tests.pipelines.pdfs import write_corpus
    from tests.test_chain import scifolio

    root = tmp_path_factory.mktemp("tiny_build")
    tiny, out, pdfs = root / "tiny", root / "out", write_corpus(root / "pdfs")
    scifolio("models", "tiny", str(tiny))
    scifolio(
        "build", str(pdfs), "--out", str(out), "--tokenizer", str(tiny / "tokenizer"), "--backend", "pymupdf",
        "--max-tokens", "256", "--overlap", "16", "--page-renders", "--no-progress", "--max-error-rate", "1",
    )  # fmt: skip
    return tiny, out


def needs_loopback_namespace(what: str = "c10d's TCP store"):
    """Skip marker for tests whose servers bind every interface (``what`` names them)."""
    return pytest.mark.skipif(
        not in_loopback_namespace(),
        reason=f"{what} binds every interface: run inside a loopback-only namespace "
        "(unshare -n sh -c 'ip link set lo up && exec pytest ...')",
    )


def in_loopback_namespace() -> bool:
    """True inside a loopback-only network namespace (only `lo`): where all-interface servers may start.

    Asks the kernel for this namespace's interfaces; /sys/class/net is not remounted by `unshare -n`
    and still lists the host's interfaces.
    """
    import socket

    return [name for _, name in socket.if_nameindex()] == ["lo"]


@pytest.fixture(scope="session", autouse=True)
def torch_on_one_thread():
    """The whole session runs torch in process on one intra-op thread: tiny models on a 2-core machine run faster
    on one (200 DeepSpeed SFT steps: 18 s against 35 s on two), and every test, and every module fixture, sees the
    same count whatever ran before it. Subprocesses keep torch's default."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture
def one_torch_thread():
    """One intra-op thread for this test, and whatever count the test itself sets is undone after it (the session
    already starts on one: ``torch_on_one_thread``)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
