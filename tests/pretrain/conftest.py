from __future__ import annotations

from pathlib import Path

import pytest

from tests.pretrain.fixtures import write_corpus


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pipelines.tiny import write_area, write_tiny_tokenizer

    out = tmp_path_factory.mktemp("tiny")
    write_area(out, "pretrain", write_tiny_tokenizer(out / "tokenizer"))
    return out


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory, tiny_models: Path) -> Path:
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(tiny_models / "pretrain-lm"))
    return write_corpus(tmp_path_factory.mktemp("shards"), n_docs=24, n_shards=2, vocab=vocab)
