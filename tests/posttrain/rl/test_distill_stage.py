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
from posttrain.rollout.engine import run_all
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
    row = stage.train(stage.collect())
    assert set(row) >= {"gap_reasoning", "gap_agentic", "rkl_reasoning", "rkl_agentic", "loss"}
    assert {name for name, _ in stage.teacher_calls} == set(DOMAINS)
    for name, ids in stage.teacher_calls:
        assert ids and all(f"-{name}-" in i for i in ids)  # request ids carry their domain
    # Assembled teacher logprobs = the own teacher's, not the other's (which would differ: different languages).
    gen = torch.Generator().manual_seed(3)
    from posttrain.rl.distill import prompts

    by_domain = {d: prompts(stage.cfg, d, 3, gen) for d in DOMAINS}
    trajs = run_all(stage.engine, stage._requests("chk", by_domain, 1, 5))
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


# -- the experts recipe: real model directories, prompt files per domain ------------------------------------------
def _model_dir(out, seed, char_vocab=False):
    """A tiny HF directory with a tokenizer (the pre-training BPE one with the chat template, or a character one)."""
    from formats.chat import CHAT_TEMPLATE
    from posttrain.tiny.lm import causal_lm
    from tests.posttrain.sft_data import tiny_chat_model

    if not char_vocab:
        path = tiny_chat_model(out, seed=seed)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path)
        tok.chat_template = CHAT_TEMPLATE
        tok.save_pretrained(path)
        return path
    from posttrain.rl.task import char_tokenizer

    tok = char_tokenizer()
    torch.manual_seed(seed)
    causal_lm(len(tok), 32, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _prompt_files(tmp_path):
    r = tmp_path / "reasoning.jsonl"
    r.write_text(json.dumps({"prompt": "Add 2 and 3."}) + "\n" + json.dumps({"prompt": "Add 4 and 1."}) + "\n")
    a = tmp_path / "agentic.jsonl"
    chat = {"messages": [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "List files."}]}
    a.write_text(json.dumps(chat) + "\n")
    return {"reasoning": str(r), "agentic": str(a)}


def test_experts_prompts_come_from_the_files_through_the_students_chat_template(tmp_path):
    from transformers import AutoTokenizer

    from posttrain.rl.distill import experts

    student = _model_dir(tmp_path / "student", seed=0)
    teachers = {"reasoning": str(_model_dir(tmp_path / "t1", seed=1)), "agentic": str(_model_dir(tmp_path / "t2", 2))}
    files = _prompt_files(tmp_path)
    cfg = experts(
        teacher_paths=teachers, student_path=str(student), prompts=files,
        steps=1, queries_per_domain=2, samples_per_query=2, max_new_tokens=4, eval_queries=1, lr=1e-3,
    )  # fmt: skip
    stage = build(cfg)
    tok = AutoTokenizer.from_pretrained(student)
    chat = json.loads(open(files["agentic"]).read())["messages"]
    rendered = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert rendered.endswith("<|im_start|>assistant\n")
    assert stage.source.rows["agentic"] == [tok(rendered, add_special_tokens=False)["input_ids"]]
    plain = tok("Add 2 and 3.", add_special_tokens=False)["input_ids"]
    assert [tok.bos_token_id, *plain] in stage.source.rows["reasoning"]
    row = stage.train(stage.collect())
    assert {"gap_reasoning", "gap_agentic", "rkl_reasoning", "rkl_agentic"} <= set(row)
    assert {name for name, _ in stage.teacher_calls} == {"reasoning", "agentic"}
    # every sampled query's prompt is a row of its own domain's file
    trajs = run_all(stage.engine, stage._requests("chk", {d: stage.source.draw(d, 2) for d in DOMAINS}, 1, 0))
    for t in trajs:
        assert t.prompt_ids in stage.source.rows[t.request.meta["domain"]]


def test_experts_refuses_a_tokenizer_mismatch_and_the_toy_recipe_refuses_paths(tmp_path, capsys):
    from posttrain.rl.distill import DistillRefused, TokenizerMismatch, experts

    student = str(_model_dir(tmp_path / "student", seed=0))
    odd = str(_model_dir(tmp_path / "char", seed=1, char_vocab=True))
    files = _prompt_files(tmp_path)
    cfg = experts(teacher_paths={"reasoning": student, "agentic": odd}, student_path=student, prompts=files)
    with pytest.raises(TokenizerMismatch, match=r"tokenizer mismatch: teacher 'agentic' \(.*char\) vs student"):
        build(cfg)
    from pipelines.cli import main

    argv = ["posttrain", "distill", "--config", "experts", "--out", str(tmp_path / "run"), "--student", student]
    argv += ["--teacher", f"reasoning={student}", "--teacher", f"agentic={odd}"]
    argv += [x for d, f in files.items() for x in ("--prompts", f"{d}={f}")]
    assert main(argv) == 2  # the CLI says why on stderr and exits 2, before any model is loaded
    assert "tokenizer mismatch: teacher 'agentic'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    with pytest.raises(DistillRefused, match="need --config experts"):
        build(debug(student_path=student))
    with pytest.raises(DistillRefused, match="missing: prompts"):
        build(experts(teacher_paths={"reasoning": student}, student_path=student))
    with pytest.raises(DistillRefused, match="one prompt file per teacher domain"):
        build(experts(teacher_paths={"reasoning": student}, student_path=student, prompts=files))
