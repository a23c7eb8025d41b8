"""One model's lifecycle through the CLI only, each step reading just what the previous one wrote:
PDFs → ``build`` → ``pretrain --max-steps`` (from scratch, tiny) → ``pretrain export`` → ``posttrain sft`` →
``eval`` (pass@k of the SFT policy; perplexity of the exported base on the build's shards).

Experts, ``posttrain distill`` and ``posttrain rl`` from the distilled model (issue 21's full chain) are not here
yet: they wait on the one-RL-driver refactor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.pipelines.pdfs import write_corpus
from tests.posttrain.sft_data import chat_rows, write_jsonl
from tests.test_chain import scifolio


@pytest.mark.slow
@pytest.mark.integration  # the deepspeed launcher
def test_build_pretrain_export_sft_eval_through_the_cli(tmp_path: Path) -> None:
    tiny, out, pdfs = tmp_path / "tiny", tmp_path / "out", write_corpus(tmp_path / "pdfs")
    scifolio("models", "tiny", str(tiny))
    scifolio(
        "build", str(pdfs), "--out", str(out), "--tokenizer", str(tiny / "tokenizer"), "--backend", "pymupdf",
        "--max-tokens", "256", "--overlap", "16", "--page-renders", "--no-progress", "--max-error-rate", "1",
    )  # fmt: skip
    run, base = tmp_path / "pretrain", tmp_path / "base"
    scifolio(
        "pretrain", "--config", "debug", "--shards", str(out), "--models", str(tiny), "--out", str(run),
        "--max-steps", "2", "--save-every", "1", "--set", "tensorboard=False",
    )  # fmt: skip
    said = scifolio("pretrain", "export", str(run), "--out", str(base))
    assert "step 2 (step2, ZeRO-2, 1 rank(s))" in said

    chats = write_jsonl(tmp_path / "chats.jsonl", chat_rows(8))
    sft = tmp_path / "sft"
    said = scifolio(
        "posttrain", "sft", "--config", "debug", "--model", str(base), "--data", str(chats), "--out", str(sft),
        "--set", "steps=3", "--set", "tensorboard=false", "--no-progress",
    )  # fmt: skip
    assert f"policy at {sft}/policy" in said
    assert json.loads((sft / "config.json").read_text())["model"] == str(base)

    problems = [{"id": f"q{i}", "messages": r["messages"][:2], "answer": r["messages"][-1]["content"]}
                for i, r in enumerate(chat_rows(4))]  # fmt: skip
    test = write_jsonl(tmp_path / "test.jsonl", problems)
    result = tmp_path / "eval.json"
    said = scifolio(
        "eval", "--model", str(sft / "policy"), "--task", "jsonl", "--data", str(test), "--n", "2", "--k", "1,2",
        "--max-new-tokens", "8", "--out", str(result), "--no-progress",
    )  # fmt: skip
    got = json.loads(result.read_text())
    assert said.startswith("jsonl: pass@1 ") and 0.0 <= got["pass@1"] <= got["pass@2"] <= 1.0
    assert [p["id"] for p in got["runs"][0]["problems"]] == ["q0", "q1", "q2", "q3"]

    ppl = tmp_path / "ppl.json"
    scifolio("eval", "--model", str(base), "--task", "perplexity", "--shards", str(out), "--out", str(ppl))
    got = json.loads(ppl.read_text())
    assert got["tokens"] > 0 and 1.0 < got["perplexity"] < 5000
