"""Issue 37, items 2 (eval) and 3 on tiny models: ``build`` on synthetic pages → ``posttrain tasks figures`` →
a 3-step pre-training run → ``pretrain export --vlm`` → ``eval --task jsonl`` on the figure task's test split
(image rows through the processor, pixel values into the HF engine's prefill; broken images skipped and counted);
and the engine's prefill with pixel values checked against the model's own forward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.pretrain.test_export import _train


@pytest.fixture(scope="module")
def vlm(corpus: Path, tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(run, exported VLM): one 3-step ZeRO-2 run on the fixture corpus, exported with ``--vlm``."""
    from pipelines.cli import main

    run, model = tmp_path_factory.mktemp("vlm-run"), tmp_path_factory.mktemp("vlm") / "model"
    _train(corpus, tiny_models, run, 2, 1)
    assert main(["pretrain", "export", str(run), "--out", str(model), "--vlm"]) == 0
    return run, model


def test_figure_task_from_a_build_evaluates_on_the_exported_vlm(vlm, tiny_models, tmp_path, capsys) -> None:
    from parsing.synthetic import synthetic_pdf
    from pipelines.cli import main

    run, model = vlm
    pdfs, out, task = tmp_path / "pdfs", tmp_path / "out", tmp_path / "figures"
    pdfs.mkdir()
    for seed in range(3):
        (pdfs / f"paper{seed}.pdf").write_bytes(synthetic_pdf(1, seed=seed)[0])
    build = ["build", str(pdfs), "--out", str(out), "--tokenizer", str(tiny_models / "tokenizer"), "--backend",
             "pymupdf", "--max-tokens", "256", "--overlap", "16", "--no-progress", "--runner", "DirectRunner"]  # fmt: skip
    assert main(build) == 0
    capsys.readouterr()

    assert main(["posttrain", "tasks", "figures", "--shards", str(out), "--out", str(task)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary == json.loads((task / "summary.json").read_text())
    rows = {s: [json.loads(x) for x in (task / f"{s}.jsonl").read_text().splitlines()] for s in ("train", "test")}
    assert summary["rows"] == {s: len(r) for s, r in rows.items()} and rows["train"] and rows["test"]
    assert summary["documents"]["train"] + summary["documents"]["test"] == 3
    assert not {r["doc_id"] for r in rows["train"]} & {r["doc_id"] for r in rows["test"]}
    for r in rows["train"] + rows["test"]:  # the answer's option is a caption labelled as the crop's kind
        text = r["messages"][0]["content"][1]["text"]
        picked = next(x for x in text.splitlines() if x.startswith(r["answer"] + ") "))[3:]
        assert picked.startswith("Figure" if r["kind"] == "figure" else "Table"), (r["kind"], picked)
    assert summary["skipped"].get("equation_text_not_in_shards", 0) >= 1  # synthetic pages carry display equations

    # eval on the test split, plus two rows whose images are broken: skipped with their reasons, never a crash
    test = tmp_path / "test_plus_broken.jsonl"
    broken = [json.loads(json.dumps(rows["test"][0])) for _ in range(2)]
    broken[0]["id"], broken[0]["messages"][0]["content"][0]["image_url"]["url"] = "missing", "nowhere/figure.png"
    broken[1]["id"], broken[1]["messages"][0]["content"][0]["image_url"]["url"] = (
        "corrupt",
        "data:image/png;base64,AAAA",
    )
    test.write_text("".join(json.dumps(r) + "\n" for r in [*rows["test"], *broken]))
    args = ["eval", "--model", str(model), "--task", "jsonl", "--data", str(test), "--n", "2", "--k", "1,2",
            "--max-new-tokens", "2", "--out", str(tmp_path / "eval.json"), "--no-progress"]  # fmt: skip
    assert main(args) == 0
    said = capsys.readouterr().out
    got = json.loads((tmp_path / "eval.json").read_text())
    assert {"pass@1", "pass@2", "pass@1_std"} <= set(got) and 0.0 <= got["pass@1"] <= 1.0
    assert got["problems_count"] == len(rows["test"]) and len(got["runs"][0]["problems"]) == len(rows["test"])
    assert {(s["id"], s["reason"]) for s in got["skipped"]} == {("missing", "missing_file"), ("corrupt", "unreadable")}
    assert "skipped 2 (missing_file 1, unreadable 1)" in said

    # a text-only export of the same run refuses image rows with a clear message
    text_only = tmp_path / "text-only"
    assert main(["pretrain", "export", str(run), "--out", str(text_only)]) == 0
    capsys.readouterr()
    assert main([*args[:2], str(text_only), *args[3:]]) == 2
    assert "holds images and this is a text-only model" in capsys.readouterr().err


def test_hf_engine_prefills_with_each_requests_pixel_values(vlm, tmp_path) -> None:
    """Two image prompts of different lengths in one prefill (left padding): each first token's logprob is the
    model's own with its image (≤ 1e-5), not what the prompt gives without it."""
    from PIL import Image
    from transformers import AutoProcessor

    from formats.chat_images import data_url, encode_chat
    from posttrain.rl.engines import PolicyConfig, build_policy
    from posttrain.rollout.engine import run_all
    from posttrain.rollout.engines.hf import HFEngine
    from posttrain.rollout.types import Request, SamplingParams

    _, model_dir = vlm
    model, _ = build_policy(PolicyConfig(path=str(model_dir)))  # the one policy loader takes the VLM
    assert type(model).__name__ == "LlavaForConditionalGeneration"
    processor = AutoProcessor.from_pretrained(model_dir)
    prompts = []
    for i, question in enumerate(["What?", "What does this figure show, in one word?"]):
        img = Image.new("RGB", (40 + 30 * i, 50), (250 - 90 * i, 30 * i, 120))
        img.save(tmp_path / f"{i}.png")
        url = data_url((tmp_path / f"{i}.png").read_bytes())
        chat = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": question}]}]  # fmt: skip
        prompts.append(encode_chat(chat, processor))
    assert len(prompts[0][0]) != len(prompts[1][0])
    requests = [
        Request(f"r{i}", ids, SamplingParams(3, seed=i), pixel_values=px) for i, (ids, px) in enumerate(prompts)
    ]
    assert "pixel_values" not in requests[0].to_dict()
    trajs = run_all(HFEngine(model.eval(), capacity=4), requests)
    for (ids, px), t in zip(prompts, trajs):
        with torch.no_grad():
            ref = torch.log_softmax(model(input_ids=torch.tensor([ids]), pixel_values=px).logits[0, -1], -1)
            blind = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, -1], -1)
        assert abs(t.logprobs[0] - ref[t.token_ids[0]].item()) <= 1e-5
        assert (ref - blind).abs().max().item() > 1e-3
