"""SFT: assistant-only labels, bad rows skipped with reasons, packing that never crosses an example, trace-export
skip steps in context and out of the loss, memorisation with a gradient probe, resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from posttrain.sft import (
    IGNORE,
    Example,
    collate,
    encode_row,
    ensure_chat_template,
    load_examples,
    pack,
    sft_loss,
)
from tests.posttrain.sft_data import chat_rows, tiny_chat_model, write_jsonl


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_chat_model(tmp_path_factory.mktemp("sft-lm"))


@pytest.fixture(scope="module")
def tok(lm: Path):
    from transformers import AutoTokenizer

    return ensure_chat_template(AutoTokenizer.from_pretrained(lm))


def _trained_text(ex: Example, tok) -> str:
    return tok.decode([i for i, label in zip(ex.ids, ex.labels) if label != IGNORE])


def test_only_assistant_text_is_labelled(tok) -> None:
    row = chat_rows(4)[0]  # system, user, assistant tool call, tool reply, assistant answer
    ex = encode_row(row, tok, 512)
    assert tok.decode(ex.ids) == tok.apply_chat_template(row["messages"], tokenize=False)
    trained = _trained_text(ex, tok)
    assert trained == (
        '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 1}"}</tool_call><|im_end|>\n2 alpha<|im_end|>\n'
    )
    for context in ("terse lab assistant", "Sample 0", "<|im_start|>tool", "<|im_start|>assistant"):
        assert context not in trained and context in tok.decode(ex.ids)


def test_bad_rows_are_counted_and_skipped_with_a_reason(tok, tmp_path: Path) -> None:
    good = chat_rows(3)
    broken_args = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{x"}}]},
        ]
    }
    no_name = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [{"x": 1}]}]}
    long = {"messages": [{"role": "user", "content": "word " * 400}, {"role": "assistant", "content": "ok"}]}
    rows = [
        good[0],
        {"messages": [{"role": "wizard", "content": "x"}, {"role": "assistant", "content": "y"}]},
        broken_args,
        "{not json",
        no_name,
        long,
        {"messages": [{"role": "user", "content": "only a question"}]},
        good[1],
        {"neither": 1},
        good[2],
    ]
    kept, skipped = load_examples([str(write_jsonl(tmp_path / "mixed.jsonl", rows))], tok, max_len=256)
    assert len(kept) == 3
    assert [(s["line"], s["reason"].split(":")[0]) for s in skipped] == [
        (2, "unknown role 'wizard'"),
        (3, "broken tool call"),
        (4, "not JSON"),
        (5, "broken tool call"),
        (6, "over-long"),
        (7, "no assistant message to learn"),
        (9, "neither messages nor token_ids"),
    ]


def test_packing_never_attends_or_predicts_across_examples(lm: Path, tok, one_torch_thread) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(lm).eval()
    examples = [encode_row(r, tok, 512) for r in chat_rows(6)[1:4]]
    rows = pack(examples, seq_len=512)
    assert len(rows) == 1 and rows[0]["seq_ids"].count(0) == 512 - sum(len(e.ids) for e in examples)
    batch = collate(rows)
    with torch.no_grad():
        packed = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).logits[0]
    start = 0
    for ex in examples:
        with torch.no_grad():
            alone = model(input_ids=torch.tensor([ex.ids])).logits[0]
        assert (packed[start : start + len(ex.ids)] - alone).abs().max() <= 1e-5
        assert batch["targets"][0, start + len(ex.ids) - 1] == IGNORE  # an example's last token predicts nothing
        start += len(ex.ids)


def _gradient_probe(model, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """d loss / d logits per position: zero rows mean the position's next token contributes nothing to the loss."""
    loss, logits = sft_loss(model, batch)
    logits.retain_grad()
    loss.backward()
    return loss.detach(), logits.grad[0].abs().sum(-1)


def test_trace_export_skip_step_is_in_context_and_out_of_the_loss(lm: Path, tok, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from posttrain.agentic.traces import TraceStore

    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    from posttrain.rollout.types import Request, Trajectory

    def traj(rid: str, prompt: list[int], out: list[int]) -> Trajectory:  # the engine's capture of one call
        n = len(out)
        return Trajectory(Request(rid, prompt), out, [0.0] * n, [0] * n, [1] * n, None, "stop")

    store = TraceStore()
    ask, r0, said, final = ids("ask the tool"), ids("first try"), ids(" tool says"), ids(" final")
    c0 = store.record_call("c0", "s", None, ("ask", ask), "a0", traj("c0", ask, r0), "stop")
    store.record_call("c1", "s", c0["response_node"], ("tool", said), "a1", traj("c1", ask + r0 + said, final), "stop")
    store.mark_skip("c0")
    export = store.session_export("s")
    path = write_jsonl(tmp_path / "traces.jsonl", [export])
    [ex], skipped = load_examples([str(path)], tok, max_len=64)
    assert skipped == []
    skip_at = ids("ask the tool")
    start, end = len(skip_at), len(skip_at) + len(r0)
    assert ex.ids[start:end] == r0  # the skipped response is in the context ...
    assert all(label == IGNORE for label in ex.labels[start:end])  # ... and out of the labels
    assert ex.labels[-len(ids(" final")) :] == ids(" final")

    model = AutoModelForCausalLM.from_pretrained(lm)
    _, grad = _gradient_probe(model, collate(pack([ex], 64)))
    # positions start-1 … end-2 predict the skipped tokens: no gradient; the final response's do get one
    assert grad[start - 1 : end - 1].sum() == 0
    assert (grad[len(ex.ids) - len(ids(" final")) - 1 : len(ex.ids) - 1] > 0).all()
    # in context: other skipped tokens change the loss on the trained response after them
    other = Example(ex.ids[:start] + ids("second go")[: end - start] + ex.ids[end:], ex.labels)
    model.zero_grad()
    loss_a, _ = sft_loss(model, collate(pack([ex], 64)))
    loss_b, _ = sft_loss(model, collate(pack([other], 64)))
    assert abs(loss_a.item() - loss_b.item()) > 1e-4


def _train(lm: Path, data: Path, out: Path, resume: bool = False, **sets) -> list[dict]:
    from posttrain.sft import debug, train
    from pretrain.train import init_distributed, prepare_env

    prepare_env()
    cfg = debug(model=str(lm), data=(str(data),), tensorboard=False, **sets)
    return train(cfg, out, setup=init_distributed, resume=resume, progress=False)


def _assistant_loss(policy: Path, data: Path, tok) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(policy).eval()
    examples, _ = load_examples([str(data)], tok, 512)
    with torch.no_grad():
        loss, _ = sft_loss(model, collate(pack(examples, 512)))
    return loss.item()


@pytest.mark.slow
def test_sft_memorises_32_rows_and_only_assistant_tokens_get_gradient(lm, tok, tmp_path, capsys) -> None:
    from transformers import AutoModelForCausalLM

    from pipelines.cli import main

    data = write_jsonl(tmp_path / "chat.jsonl", chat_rows(32))
    out = tmp_path / "run"
    argv = ["posttrain", "sft", "--config", "debug", "--model", str(lm), "--data", str(data), "--out", str(out)]
    assert main([*argv, "--set", "steps=200", "--set", "tensorboard=false", "--no-progress"]) == 0
    assert "policy at" in capsys.readouterr().out
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 201))
    # measured afresh on the saved policy, over every row: assistant-token loss
    before, after = _assistant_loss(lm, data, tok), _assistant_loss(out / "policy", data, tok)
    assert after < 0.05 < before

    # probe: on a packed batch, only positions whose next token is assistant text receive gradient
    model = AutoModelForCausalLM.from_pretrained(out / "policy")
    examples, _ = load_examples([str(data)], tok, 512)
    batch = collate(pack(examples[:4], 1024))
    _, grad = _gradient_probe(model, batch)
    trained = batch["targets"][0] != IGNORE
    assert grad[~trained].sum() == 0 and (grad[trained] > 0).all()
    # and those untrained positions are exactly the system/user/tool/template tokens (plus padding)
    nxt = torch.cat([batch["input_ids"][0, 1:], torch.tensor([0])])
    text_untrained = tok.decode(nxt[~trained].tolist())
    assert "terse lab assistant" in text_untrained and "add 2 and 1" in text_untrained


@pytest.mark.slow
def test_sft_resume_continues_the_same_run(lm, tmp_path) -> None:
    data = write_jsonl(tmp_path / "chat.jsonl", chat_rows(8))
    # a constant rate: the decay's length is `steps`, which the stopped run (2) and the straight one (4) differ in
    straight = _train(lm, data, tmp_path / "a", steps=4, min_lr_ratio=1.0)
    _train(lm, data, tmp_path / "b", steps=2, min_lr_ratio=1.0)
    resumed = _train(lm, data, tmp_path / "b", resume=True, steps=4, min_lr_ratio=1.0)
    assert [r["step"] for r in resumed] == [3, 4]
    for want, got in zip(straight[2:], resumed):
        assert got["loss"] == pytest.approx(want["loss"], abs=1e-5)
    logged = [json.loads(line)["step"] for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert logged == [1, 2, 3, 4]
