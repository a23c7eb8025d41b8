"""``scifolio posttrain lemma solve`` end to end with the scripted reasoner (no model, no network).

Run: python -m pytest tests/posttrain/lemma/test_lemma_cli.py -q
"""

from __future__ import annotations

import json

from formats.fs import write_jsonl
from pipelines.cli import main
from posttrain.lemma.tasks import train_test_split


def test_solve_a_task_file_prints_and_writes_the_trace(tmp_path, capsys) -> None:
    _, test = train_test_split(0, 4, seed=0, steps=4)
    write_jsonl(tmp_path / "test.jsonl", test)
    out = tmp_path / "trace.json"
    rc = main(
        ["posttrain", "lemma", "solve", "--model", "scripted", "--tasks", str(tmp_path / "test.jsonl")]
        + ["--verifier", "noisy", "--set", "p_correct=1.0", "--set", "agent.reasoner_tokens=600", "--out", str(out)]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "4 problems: 4/4 solved" in printed and "memory:" in printed and "graph: M1->M2" in printed
    doc = json.loads(out.read_text())
    assert doc["config"]["verifier"] == "noisy" and doc["config"]["agent"]["reasoner_tokens"] == 600
    assert doc["metrics"]["solved"] == 1.0 and doc["metrics"]["reward"] > 0 and "masked rounds" in printed
    rec = doc["problems"][0]
    assert rec["solved"] is True and rec["credit"]["reward"] > 0
    assert all(len(c["token_ids"]) == len(c["logprobs"]) > 0 for c in rec["calls"])
    assert {c["role"] for c in rec["calls"]} == {"reasoner", "summariser"}


def test_solve_one_problem_text(capsys) -> None:
    text = "Let x0 = 4. Let x1 = gcd(x0 + 8, 36). Find x1."
    assert (
        main(
            [
                "posttrain",
                "lemma",
                "solve",
                "--model",
                "scripted",
                "--problem",
                text,
                "--answer",
                "12",
                "--set",
                "p_correct=1.0",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "int: gcd(4 + 8, 36) = 12" in out and "final answer: 12 (4/4 checks)" in out
