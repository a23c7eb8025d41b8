"""One model's lifecycle through the CLI only, each step reading just what the previous one wrote (issue 21):
PDFs → ``build`` → ``pretrain --max-steps`` (from scratch, tiny) → ``pretrain export`` → ``posttrain sft`` → two
experts (``posttrain sft`` from that checkpoint on different data) → ``posttrain distill --config experts`` (experts
as teachers, the SFT model as student, per-domain prompt files) → ``posttrain rl`` from the distilled model →
``eval`` (pass@k of the RL policy; perplexity of the exported base on the build's shards). 1–3 steps a stage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.posttrain.sft_data import chat_rows, write_jsonl
from tests.test_chain import scifolio


@pytest.mark.slow
@pytest.mark.integration  # the deepspeed launcher
def test_whole_lifecycle_through_the_cli(tmp_path: Path, tiny_build: tuple[Path, Path]) -> None:
    tiny, out = tiny_build  # models tiny → build, through the CLI (tests/conftest.py)
    run, base = tmp_path / "pretrain", tmp_path / "base"
    scifolio(
        "pretrain", "--config", "debug", "--shards", str(out), "--models", str(tiny), "--out", str(run),
        "--max-steps", "2", "--save-every", "1", "--set", "tensorboard=False",
    )  # fmt: skip
    said = scifolio("pretrain", "export", str(run), "--out", str(base), "--text-only")
    assert "step 2 (step2, ZeRO-2, 1 rank(s))" in said

    chats = write_jsonl(tmp_path / "chats.jsonl", chat_rows(8))
    sft = tmp_path / "sft"
    said = scifolio(
        "posttrain", "sft", "--config", "debug", "--model", str(base), "--data", str(chats), "--out", str(sft),
        "--set", "steps=3", "--set", "tensorboard=false", "--no-progress",
    )  # fmt: skip
    assert f"policy at {sft}/policy" in said
    assert json.loads((sft / "config.json").read_text())["model"] == str(base)

    # Two domain experts: two SFT runs from that one SFT checkpoint on different data (plain sums / tool calls).
    rows = chat_rows(16)
    experts = {}
    for domain, picked in (("reasoning", [r for i, r in enumerate(rows) if i % 4]), ("agentic", rows[::4])):
        data = write_jsonl(tmp_path / f"{domain}.jsonl", picked)
        experts[domain] = tmp_path / f"expert-{domain}"
        scifolio(
            "posttrain", "sft", "--config", "debug", "--model", str(sft / "policy"), "--data", str(data),
            "--out", str(experts[domain]), "--set", "steps=2", "--set", "tensorboard=false", "--no-progress",
        )  # fmt: skip
        assert json.loads((experts[domain] / "config.json").read_text())["model"] == str(sft / "policy")
    weights = {name: _weights(path) for name, path in [("sft", sft), *experts.items()]}
    assert weights["reasoning"] != weights["sft"] != weights["agentic"] != weights["reasoning"]

    # Distil both experts into the SFT model on per-domain prompt files (a chat's first turns, the student's template).
    prompts = {d: write_jsonl(tmp_path / f"prompts-{d}.jsonl", [{"messages": r["messages"][:2]} for r in picked])
               for d, picked in (("reasoning", rows[1:4]), ("agentic", rows[::4]))}  # fmt: skip
    distilled = tmp_path / "distill"
    said = scifolio(
        "posttrain", "distill", "--config", "experts", "--out", str(distilled), "--student", str(sft / "policy"),
        *(x for d, e in experts.items() for x in ("--teacher", f"{d}={e / 'policy'}")),
        *(x for d, f in prompts.items() for x in ("--prompts", f"{d}={f}")),
        "--set", "steps=1", "--set", "queries_per_domain=2", "--set", "samples_per_query=2",
        "--set", "max_new_tokens=6", "--set", "eval_queries=1", "--set", "lr=1e-3", "--set", "torch_threads=1",
        "--no-progress",
    )  # fmt: skip
    assert f"student at {distilled}/policy" in said
    got = json.loads((distilled / "config.json").read_text())
    assert got["student_path"] == str(sft / "policy") and got["toy"] is False
    assert got["teacher_paths"] == {d: str(e / "policy") for d, e in experts.items()}
    steps = [json.loads(x) for x in (distilled / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps] == [0, 1] and {"gap_reasoning", "gap_agentic"} <= set(steps[1])
    assert _weights(distilled) != weights["sft"]

    # RL from the distilled model on a jsonl task, then pass@k of the RL policy.
    problems = [{"id": f"q{i}", "messages": r["messages"][:2], "answer": r["messages"][-1]["content"]}
                for i, r in enumerate(chat_rows(4))]  # fmt: skip
    test = write_jsonl(tmp_path / "test.jsonl", problems)
    rl = tmp_path / "rl"
    said = scifolio(
        "posttrain", "rl", "--config", "debug", "--out", str(rl), "--set", f"policy.path={distilled / 'policy'}",
        "--set", "task.name=jsonl", "--set", f"task.jsonl={test}", "--set", "task.verifier=prefix",
        "--set", "steps=1", "--set", "scheduler.batch_target=2", "--set", "scheduler.group_size=2",
        "--set", "scheduler.dapo=false", "--set", "sampling.max_new_tokens=6", "--set", "engine_capacity=4",
        "--no-progress",
    )  # fmt: skip
    assert f"policy at {rl}/policy" in said
    assert json.loads((rl / "config.json").read_text())["policy"]["path"] == str(distilled / "policy")
    (row,) = [json.loads(x) for x in (rl / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 1 and row["trained_tokens"] > 0 and 0.0 <= row["reward"] <= 1.0
    # (its weights move only if the two samples of a prompt earned different rewards: not asserted)

    result = tmp_path / "eval.json"
    said = scifolio(
        "eval", "--model", str(rl / "policy"), "--task", "jsonl", "--data", str(test), "--n", "2", "--k", "1,2",
        "--max-new-tokens", "8", "--out", str(result), "--no-progress",
    )  # fmt: skip
    got = json.loads(result.read_text())
    assert said.startswith("jsonl: pass@1 ") and 0.0 <= got["pass@1"] <= got["pass@2"] <= 1.0
    assert [p["id"] for p in got["runs"][0]["problems"]] == ["q0", "q1", "q2", "q3"]

    ppl = tmp_path / "ppl.json"
    scifolio("eval", "--model", str(base), "--task", "perplexity", "--shards", str(out), "--out", str(ppl))
    got = json.loads(ppl.read_text())
    assert got["tokens"] > 0 and 1.0 < got["perplexity"] < 5000


def _weights(run: Path) -> dict[str, list[float]]:
    """A run's ``policy/`` weights (a few numbers per tensor: enough to tell two checkpoints apart)."""
    from safetensors.torch import load_file

    return {k: v.flatten()[:64].tolist() for k, v in sorted(load_file(run / "policy" / "model.safetensors").items())}
