"""The synthetic Memory Decoder experiment end to end through ``scifolio memdec`` (debug recipe, tiny models built
from configs, Milvus Lite): a base pre-trained on general text, a datastore and memory over a generated "biology"
domain, a router, and the held-out claims of issue 15.

Run: python -m pytest tests/posttrain/test_memdec_experiment.py -q -m slow
"""

from __future__ import annotations

import json

import pytest

from pipelines.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.slow
def test_synthetic_experiment_claims(tmp_path, capsys) -> None:
    work = str(tmp_path / "memdec")
    assert main(["memdec", "all", "--config", "debug", "--work-dir", work, "--quiet", "--check"]) == 0
    printed = capsys.readouterr().out
    assert "PPL base" in printed and "[FAIL]" not in printed
    r = json.loads((tmp_path / "memdec" / "eval.json").read_text())
    d, g = r["domain"], r["general"]
    assert d["tokens"] > 300 and g["tokens"] > 1000
    assert d["ppl_memory"] < d["ppl_base"]  # the memory knows the domain's facts, the base only its grammar
    assert d["ppl_fused"] < d["ppl_base"]
    assert g["ppl_fused"] <= 1.02 * g["ppl_base"]  # the router keeps the memory out of general text
    assert d["mean_lambda"] > g["mean_lambda"]
    assert g["ppl_memory"] > g["ppl_base"]  # a memory that is bad off-domain: the router is what protects general
    # The stages resume/reuse: a second build-datastore resumes at the end and stores nothing twice.
    assert main(["memdec", "build-datastore", "--work-dir", work, "--quiet"]) == 0
    out = capsys.readouterr().out
    stats = json.loads(out.split("build-datastore: ", 1)[1].splitlines()[0])
    assert stats["resumed_from"] == {"sft": stats["examples"]} and stats["stored"] == stats["keys"]

    # The seam memdec → RL: the trained memory and router decode RL rollouts of the base (Eq 3 in the engine).
    rows = [json.loads(x) for x in (tmp_path / "memdec" / "data" / "domain_eval.jsonl").read_text().splitlines()[:8]]
    task = tmp_path / "rl_task.jsonl"
    task.write_text("".join(json.dumps({"id": f"q{i}", "prompt": r["question"], "answer": r["answer"]}) + "\n"
                            for i, r in enumerate(rows)))  # fmt: skip
    sets = {
        "policy.path": f"{work}/base",
        "policy.tokenizer": f"{work}/tokenizer",
        "task.name": "jsonl",
        "task.jsonl": str(task),
        "task.verifier": "exact",
        "steps": 2,
        "memdec.enabled": "true",
        "memdec.memory": f"{work}/memory/policy",
        "memdec.router": f"{work}/router.pt",
        "scheduler.batch_target": 2,
        "scheduler.group_size": 4,
        "engine_capacity": 8,
        "sampling.max_new_tokens": 16,
        # the tiny base rarely answers right: DAPO would resample all-zero groups for minutes (the seam is Eq 3)
        "scheduler.dapo": "false",
    }
    out = tmp_path / "rl"
    argv = ["posttrain", "rl", "--config", "debug", "--out", str(out), "--no-progress"]
    assert main([*argv, *(x for k, v in sets.items() for x in ("--set", f"{k}={v}"))]) == 0
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    # on domain prompts the trained router leans on the memory (the experiment above: λ 0.94 domain, 0.07 general)
    assert all(m["memdec_lambda_mean"] > 0.5 for m in metrics), metrics
