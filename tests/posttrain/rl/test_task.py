"""Verifiable tasks: the countdown family, verifiers, the jsonl interface and the data cursor."""

from __future__ import annotations

from collections import Counter

import pytest

from posttrain.rl.task import (
    CHARS,
    JsonlTask,
    TaskSource,
    char_tokenizer,
    countdown_answer,
    countdown_rows,
    exact_match,
    prefix_credit,
)
from posttrain.rollout.types import FINISH_LENGTH, FINISH_STOP, Request, Trajectory


def test_countdown_answers_are_long_tailed():
    rows = countdown_rows(2000, seed=1)
    lengths = Counter(len(r["answer"]) for r in rows)
    assert countdown_answer(4) == "3210"
    assert lengths[1] > 0.35 * len(rows)  # most answers are short...
    assert lengths[9] > 0 and lengths[9] < lengths[1] / 8  # ...a few are 9x longer


def test_prefix_credit_and_exact_match():
    row = {"answer": "3210"}
    assert prefix_credit("3210", row, stopped=True) == 1.0
    assert prefix_credit("3210", row, stopped=False) == pytest.approx(4 / 5)  # never stopped: no credit for the end
    assert prefix_credit("32x", row, stopped=True) == pytest.approx(2 / 5)
    assert prefix_credit("", row, stopped=True) == 0.0
    assert exact_match("3210", row, True) == 1.0 and exact_match("3210", row, False) == 0.0


def test_char_tokenizer_roundtrip_and_special_ids():
    tok = char_tokenizer()
    ids = tok("7:", add_special_tokens=False)["input_ids"]
    assert len(ids) == 2 and tok.decode(ids) == "7:"
    assert {tok.pad_token_id, tok.eos_token_id, tok.bos_token_id} == {0, 1, 2}


def test_jsonl_task_source_rewards_and_cursor(tmp_path):
    tok = char_tokenizer()
    task = JsonlTask(countdown_rows(5), prefix_credit)
    task.write_jsonl(tmp_path / "t.jsonl")
    loaded = JsonlTask.from_jsonl(tmp_path / "t.jsonl", exact_match)
    assert list(loaded.rows) == list(task.rows)
    src = TaskSource(loaded, tok, seed=3)
    seen = [src.next_prompt() for _ in range(7)]  # wraps into a second epoch
    assert {p.prompt_id for p in seen[:5]} == {r["id"] for r in task.rows}
    state = src.state_dict()
    nxt = src.next_prompt()
    src2 = TaskSource(loaded, tok)
    src2.load_state_dict(state)
    assert src2.next_prompt() == nxt
    p = seen[0]
    row = next(r for r in task.rows if r["id"] == p.prompt_id)
    answer_ids = tok(row["answer"], add_special_tokens=False)["input_ids"]
    t = Trajectory(Request("x", p.prompt_ids, meta=dict(p.meta)))
    t.token_ids, t.finish_reason = answer_ids + [tok.eos_token_id], FINISH_STOP
    assert src.reward(t) == 1.0
    t.token_ids, t.finish_reason = answer_ids, FINISH_LENGTH
    assert src.reward(t) == 0.0


def test_a_chat_rows_turn_ends_at_the_templates_turn_end_for_the_reward_as_for_eval():
    """formats.chat's template ends a turn with the text <|im_end|>, not EOS: the reward reads the response up to it
    (as ``eval`` does, through the same ``response``), so "B<|im_end|>..." cut at the length limit passes ``exact``."""
    tok = char_tokenizer(CHARS + "<|im_end>\nB", split="[\\s\\S]")
    row = {"id": "f", "messages": [{"role": "user", "content": "1"}], "answer": "B"}
    src = TaskSource(JsonlTask([row], exact_match), tok)
    t = Trajectory(Request("x", [0], meta={"row_id": "f"}), finish_reason=FINISH_LENGTH)
    t.token_ids = tok("B<|im_end|>\nBB", add_special_tokens=False)["input_ids"]
    assert src.reward(t) == 1.0
    t.token_ids = tok("BB<|im_end|>", add_special_tokens=False)["input_ids"]
    assert src.reward(t) == 0.0


def test_small_recipe_data_ships_and_is_the_generators_output(tmp_path):
    from posttrain.rl.recipes import small
    from posttrain.rl.task import SMALL_DATA, arithmetic_rows, write_small_data

    cfg = small()
    assert cfg.task.jsonl == str(SMALL_DATA / "train.jsonl")
    for path in write_small_data(tmp_path):  # the shipped files are exactly what the command writes
        assert path.read_text() == (SMALL_DATA / path.name).read_text()
    rows = JsonlTask.from_jsonl(cfg.task.jsonl).rows
    assert len(rows) == 512 and len({r["id"] for r in rows}) == 512
    for r in arithmetic_rows(50, split="check"):  # answers are the expressions' values
        expr = r["messages"][0]["content"].removeprefix("What is ").removesuffix("? Reply with the integer only.")
        assert int(r["answer"]) == eval(expr)  # noqa: S307 -- digits and + - * written by the generator


def test_smol_recipe_data_ships_disjoint_and_correct(tmp_path):
    from posttrain.rl.recipes import smol
    from posttrain.rl.task import SMOL_DATA, write_smol_data

    cfg = smol()
    assert cfg.task.jsonl == str(SMOL_DATA / "train.jsonl") and cfg.task.verifier == "numeric"
    for path in write_smol_data(tmp_path):  # the shipped files are exactly what the command writes
        assert path.read_text() == (SMOL_DATA / path.name).read_text()
    sets = {p.stem: JsonlTask.from_jsonl(p).rows for p in SMOL_DATA.glob("*.jsonl")}
    questions = {k: {r["messages"][0]["content"] for r in rows} for k, rows in sets.items()}
    assert not questions["train"] & questions["test"]  # no test problem is trained on
    assert not questions["test-phrasings"] & (questions["train"] | questions["test"])
    for r in sets["train"] + sets["test"]:
        expr = r["messages"][0]["content"].removeprefix("What is ").removesuffix("? Reply with the integer only.")
        assert int(r["answer"]) == eval(expr)  # noqa: S307 -- digits and + - * written by the generator


def test_rl_and_eval_share_one_verifier_registry():
    from posttrain.eval import TASKS, TaskOptions, check_of
    from posttrain.rl.task import VERIFIERS

    row = {"answer": "12"}
    assert VERIFIERS["numeric"]("8 + 4 = 12.", row, True) == 1.0  # answers in sentences pass ...
    assert VERIFIERS["numeric"]("8 + 4 = 12", row, False) == 0.0  # ... when the model ended them
    assert VERIFIERS["exact"]("8 + 4 = 12.", row, True) == 0.0
    for name, verify in VERIFIERS.items():  # eval passes a sample exactly when RL would give it full reward
        for text in ("12", "8 + 4 = 12.", "13", "1"):
            assert check_of(name)(text, row, True) == (verify(text, row, True) >= 1.0)
    with pytest.raises(ValueError, match="unknown verifier"):
        TASKS["jsonl"](TaskOptions(data="x.jsonl", verifier="nope"))
