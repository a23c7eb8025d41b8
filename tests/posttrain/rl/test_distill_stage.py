"""Two-teacher OPD stage: the student's held-out reverse KL to each domain's teacher falls over a short run, and a
query of one domain only ever gets its own teacher's signal (routing, scoring, assembly)."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from posttrain.objectives.distill import sampled_logprobs
from posttrain.rl.distill import DOMAINS, build, debug, run
from posttrain.rl.learner import pack
from tests.posttrain.rl.test_cli_rl import env

QUICK = dict(teacher_steps=120, steps=20, sft_steps=40)


def test_reverse_kl_falls_per_domain(tmp_path):
    rows = run(debug(**QUICK), tmp_path)
    assert [r["step"] for r in rows] == list(range(21))
    first = rows[0]  # after the SFT warm-up, before any OPD step
    last = rows[-5:]
    for d in DOMAINS:
        late = sum(r[f"rkl_{d}"] for r in last) / len(last)
        assert late < 0.9 * first[f"rkl_{d}"], (d, first[f"rkl_{d}"], late)
        gaps = [r[f"gap_{d}"] for r in rows[1:]]
        assert sum(gaps[-5:]) / 5 < sum(gaps[:5]) / 5  # the sampled teacher-logprob gap falls too
    assert (tmp_path / "policy" / "config.json").exists()


def test_each_query_gets_only_its_own_teacher():
    stage = build(debug(teacher_steps=60, sft_steps=0, queries_per_domain=3, samples_per_query=2))
    row = stage.step(1)
    assert set(row) >= {"gap_reasoning", "gap_agentic", "rkl_reasoning", "rkl_agentic", "loss"}
    assert {name for name, _ in stage.teacher_calls} == set(DOMAINS)
    for name, ids in stage.teacher_calls:
        assert ids and all(f"-{name}-" in i for i in ids)  # request ids carry their domain
    # Assembled teacher logprobs = the own teacher's, not the other's (which would differ: different languages).
    gen = torch.Generator().manual_seed(3)
    from posttrain.rl.distill import prompts

    by_domain = {d: prompts(stage.cfg, d, 3, gen) for d in DOMAINS}
    trajs = stage._sample(stage.engine, stage._requests("chk", by_domain, 1, 5))
    got, weights = stage.teacher_logprobs(trajs)
    p = pack(trajs)
    with torch.no_grad():
        for i, t in enumerate(trajs):
            own, other = t.request.meta["domain"], [d for d in DOMAINS if d != t.request.meta["domain"]][0]
            ids = p.input_ids[i : i + 1]
            for name, should_match in ((own, True), (other, False)):
                lp = sampled_logprobs(stage.teachers[name](input_ids=ids).logits[:, :-1], ids[:, 1:])
                ref = lp[0, p.positions[i]]
                close = torch.allclose(got[i], ref, atol=1e-5)
                assert close == should_match, (t.request_id, name)
    assert torch.equal(weights, torch.ones(len(trajs)))


@pytest.mark.parametrize("extra", [["--set", "steps=2", "--set", "teacher_steps=20", "--set", "sft_steps=2"]])
def test_cli_distill_writes_one_row_per_step(tmp_path, extra):
    code = "from pipelines.cli import main; raise SystemExit(main())"
    cmd = ["python", "-c", code, "posttrain", "distill", "--config", "debug", "--out", str(tmp_path), *extra]
    import sys

    cmd[0] = sys.executable
    subprocess.run(cmd, env=env(), check=True, capture_output=True)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all("rkl_reasoning" in r and "rkl_agentic" in r for r in rows)
