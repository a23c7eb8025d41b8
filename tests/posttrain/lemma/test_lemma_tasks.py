"""The lemma-chain task family: fixed-seed split, rows in posttrain/rl/task.py's interface, decidable step lemmas.

Run: python -m pytest tests/posttrain/lemma/test_lemma_tasks.py -q
"""

from __future__ import annotations

from posttrain.lemma.statements import decide
from posttrain.lemma.tasks import KINDS, make_rows, read_chain, train_test_split, verify_answer
from posttrain.rl.task import JsonlTask


def test_split_is_fixed_and_disjoint() -> None:
    train, test = train_test_split(40, 40, seed=7, steps=5, magnitude=2)
    again_train, again_test = train_test_split(40, 40, seed=7, steps=5, magnitude=2)
    assert train == again_train and test == again_test
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    assert train_test_split(40, 0, seed=8, steps=5)[0] != train
    assert all(r["difficulty"] == {"steps": 5, "magnitude": 2} and len(r["steps"]) == 5 for r in train)


def test_distinct_kinds_uses_every_kind_sequence_once_per_round() -> None:
    one_step = make_rows(2 * len(KINDS) + 3, seed=0, split="train", steps=1, distinct_kinds=True)
    kinds = [r["steps"][0]["kind"] for r in one_step]
    # one round of the 7 one-step templates, then a second, then the start of a third
    assert sorted(kinds[: len(KINDS)]) == sorted(KINDS) == sorted(kinds[len(KINDS) : 2 * len(KINDS)])
    assert len(set(kinds[2 * len(KINDS) :])) == 3
    assert make_rows(9, 0, "train", 1, distinct_kinds=True) == make_rows(9, 0, "train", 1, distinct_kinds=True)
    two_step = make_rows(12, seed=3, split="train", steps=2, distinct_kinds=True)
    assert len({tuple(s["kind"] for s in r["steps"]) for r in two_step}) == 12
    assert [r["id"] for r in two_step] == [f"lemma-chain-train-{i}" for i in range(12)]
    free = [r["steps"][0]["kind"] for r in make_rows(4, 0, "train", 1)]
    assert free == ["sum", "sum", "poly", "gcd"]  # the default draws kinds freely (and its stream is unchanged)


def test_every_step_lemma_is_true_and_needed_by_the_next() -> None:
    train, _ = train_test_split(30, 0, seed=1, steps=6)
    for row in train:
        x0, chain = read_chain(row["prompt"])
        v = x0
        for (kind, params), step in zip(chain, row["steps"]):
            assert kind.lemma(v, params) == step["statement"]
            assert decide(step["statement"]).ok is True
            assert step["statement"].startswith(kind.lemma_prefix(v, params))  # it names the previous value
            v = kind.compute(v, params)
            assert v == step["value"]
        assert str(v) == row["answer"]


def test_wrong_results_are_false_lemmas() -> None:
    import random

    rng = random.Random(0)
    train, _ = train_test_split(20, 0, seed=2, steps=5)
    for row in train:
        x0, chain = read_chain(row["prompt"])
        v = x0
        for kind, params in chain:
            rhs, _ = kind.wrong(v, params, rng)
            assert decide(kind.lemma(v, params, rhs=rhs)).ok is False
            v = kind.compute(v, params)
    assert {s["kind"] for r in train for s in r["steps"]} == set(KINDS)


def test_rows_plug_into_the_rl_task_interface(tmp_path) -> None:
    train, _ = train_test_split(5, 0, seed=3)
    task = JsonlTask(train, verify_answer)
    task.write_jsonl(tmp_path / "t.jsonl")
    back = JsonlTask.from_jsonl(tmp_path / "t.jsonl", verify_answer)
    row = back.rows[0]
    assert {"id", "prompt", "answer"} <= set(row)
    assert back.verify(f"work...\nANSWER: {row['answer']}\n", row, True) == 1.0
    assert back.verify(f"so \\boxed{{{row['answer']}}}", row, True) == 1.0
    assert back.verify(f"ANSWER: {int(row['answer']) + 1}", row, True) == 0.0
    assert back.verify("no answer", row, True) == 0.0
