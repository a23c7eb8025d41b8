"""Issue 37 on tiny models, one chain: ``build`` on synthetic pages → a 3-step pre-training run on those shards →
``pretrain export`` (the VLM) → loaded in a clean interpreter with the pre-training logits → ``posttrain tasks
figures`` on the same build → ``posttrain sft`` on its train rows → ``posttrain rl`` (2 steps) → ``eval`` with pass@k
(``test_sft_then_rl_then_eval_on_the_figure_task``); and ``eval`` on the test split (image rows through the processor,
pixel values into the HF engine's prefill; broken images skipped and counted); the engine's prefill, SFT's packed
rows and the RL learner's logprobs each checked against the model's own forward with images."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import io
import json
from pathlib import Path

import pytest
import torch

from tests.pretrain.test_export import _train, check_vlm_export

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def build(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``scifolio build`` on three synthetic one-page papers: the shards both pre-training and the figure task read."""
    from parsing.synthetic import synthetic_pdf
    from pipelines.cli import main

    tmp = tmp_path_factory.mktemp("build")
    pdfs, out = tmp / "pdfs", tmp / "out"
    pdfs.mkdir()
    for seed in range(3):
        (pdfs / f"paper{seed}.pdf").write_bytes(synthetic_pdf(1, seed=seed)[0])
    args = ["build", str(pdfs), "--out", str(out), "--tokenizer", str(tiny_models / "tokenizer"), "--backend",
            "pymupdf", "--max-tokens", "256", "--overlap", "16", "--page-renders", "--no-progress", "--runner",
            "DirectRunner"]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(args) == 0
    return out


@pytest.fixture(scope="module")
def vlm(build: Path, tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(run, exported VLM): one 3-step ZeRO-2 run on the build's shards, exported as ``pretrain export`` does by
    default for a run with a vision tower."""
    from pipelines.cli import main

    run, model = tmp_path_factory.mktemp("vlm-run"), tmp_path_factory.mktemp("vlm") / "model"
    _train(build, tiny_models, run, 2, 1)
    with contextlib.redirect_stdout(io.StringIO()) as said:
        assert main(["pretrain", "export", str(run), "--out", str(model)]) == 0
    assert "as a vision-language model" in said.getvalue()
    return run, model


@pytest.fixture(scope="module")
def figures(build: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(task dir, what ``tasks figures`` printed): the caption task from the build."""
    from pipelines.cli import main

    task = tmp_path_factory.mktemp("figures") / "figures"
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        assert main(["posttrain", "tasks", "figures", "--shards", str(build), "--out", str(task)]) == 0
    return task, said.getvalue()


@pytest.fixture(scope="module")
def text_only(vlm, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same run exported as a text-only causal LM."""
    from pipelines.cli import main

    out = tmp_path_factory.mktemp("text-only") / "model"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["pretrain", "export", str(vlm[0]), "--out", str(out), "--text-only"]) == 0
    return out


def _rows(task: Path, split: str) -> list[dict]:
    return [json.loads(x) for x in (task / f"{split}.jsonl").read_text().splitlines()]


def _broken(row: dict) -> list[dict]:
    """Two copies of ``row`` whose image is a missing file and a corrupt data URL."""
    out = [json.loads(json.dumps(row)) for _ in range(2)]
    out[0]["id"], out[0]["messages"][0]["content"][0]["image_url"]["url"] = "missing", "nowhere/figure.png"
    out[1]["id"], out[1]["messages"][0]["content"][0]["image_url"]["url"] = "corrupt", "data:image/png;base64,AAAA"
    return out


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_figure_task_from_a_build_evaluates_on_the_exported_vlm(vlm, figures, text_only, tmp_path, capsys) -> None:
    from pipelines.cli import main

    _, model = vlm
    task, said = figures
    summary = json.loads(said.strip().splitlines()[-1])
    assert summary == json.loads((task / "summary.json").read_text())
    rows = {s: _rows(task, s) for s in ("train", "test")}
    assert summary["rows"] == {s: len(r) for s, r in rows.items()} and rows["train"] and rows["test"]
    assert summary["documents"]["train"] + summary["documents"]["test"] == 3
    assert not {r["doc_id"] for r in rows["train"]} & {r["doc_id"] for r in rows["test"]}
    for r in rows["train"] + rows["test"]:  # the answer's option is a caption labelled as the crop's kind
        text = r["messages"][0]["content"][1]["text"]
        picked = next(x for x in text.splitlines() if x.startswith(r["answer"] + ") "))[3:]
        if r["kind"] == "equation":  # ... or the equation's text as the build kept it
            assert r["text_from"] in ("latex", "backend", "text-layer-math", "ocr") and picked, r
        else:
            assert picked.startswith("Figure" if r["kind"] == "figure" else "Table"), (r["kind"], picked)
    # synthetic pages carry display equations: asked about where their text was kept, else skipped with a reason
    equations = summary["kinds"].get("equation", 0) + summary["skipped"].get("too_few_options", 0)
    assert equations + sum(v for k, v in summary["skipped"].items() if k.startswith("equation_")) >= 1

    # eval on the test split, plus two rows whose images are broken: skipped with their reasons, never a crash
    test = _write(tmp_path / "test_plus_broken.jsonl", [*rows["test"], *_broken(rows["test"][0])])
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
    from posttrain.rollout.sampling import without_placeholder
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
        prompts.append(encode_chat(chat, processor)[:2])
    assert len(prompts[0][0]) != len(prompts[1][0])
    requests = [
        Request(f"r{i}", ids, SamplingParams(3, seed=i), pixel_values=px) for i, (ids, px) in enumerate(prompts)
    ]
    assert "pixel_values" not in requests[0].to_dict()
    trajs = run_all(HFEngine(model.eval(), capacity=4), requests)
    drop = functools.partial(without_placeholder, config=model.config)  # the image placeholder is never sampled
    for (ids, px), t in zip(prompts, trajs):
        with torch.no_grad():
            ref = torch.log_softmax(drop(model(input_ids=torch.tensor([ids]), pixel_values=px).logits[0, -1]), -1)
            blind = torch.log_softmax(drop(model(input_ids=torch.tensor([ids])).logits[0, -1]), -1)
        assert abs(t.logprobs[0] - ref[t.token_ids[0]].item()) <= 1e-5
        assert (ref - blind).nan_to_num(0.0).abs().max().item() > 1e-3  # -inf - -inf at the placeholder


def test_sft_packs_image_examples_with_their_pixels_in_token_order_and_skips_bad_images(
    vlm, figures, tmp_path, one_torch_thread
) -> None:
    """Two figure rows (answers as assistant replies) packed into one row: each example's logits equal its own
    forward with its image (≤ 1e-5), and swapping the row's two images changes them; broken images are skipped with
    their reasons; without a processor (a text-only model) image rows are refused."""
    from transformers import AutoProcessor, AutoTokenizer

    from posttrain.rl.engines import PolicyConfig, build_policy
    from posttrain.sft import IGNORE, collate, load_examples, pack, sft_loss

    _, model_dir = vlm
    rows = _rows(figures[0], "train")
    two = [rows[0], next(r for r in rows if r["image_sha256"] != rows[0]["image_sha256"])]
    data = _write(tmp_path / "sft.jsonl", [*two, *_broken(rows[0])])
    tok, processor = AutoTokenizer.from_pretrained(model_dir), AutoProcessor.from_pretrained(model_dir)
    examples, skipped = load_examples([str(data)], tok, 1024, processor)
    assert [s["reason"].split(":")[0] for s in skipped] == ["missing_file", "unreadable"] and len(examples) == 2
    config = json.loads((model_dir / "config.json").read_text())
    for ex, r in zip(examples, two):  # one image, expanded to its tokens, context only; the answer letter is trained
        assert len(ex.pixel_values) == 1 and ex.ids.count(config["image_token_index"]) == config["image_seq_length"]
        assert all(lab == IGNORE for t, lab in zip(ex.ids, ex.labels) if t == config["image_token_index"])
        assert tok.decode([t for t in ex.labels if t != IGNORE]).startswith(r["answer"])

    model = build_policy(PolicyConfig(path=str(model_dir)))[0].eval()
    (row,) = pack(examples, 1024)
    batch = collate([row])
    with torch.no_grad():
        _, packed = sft_loss(model, batch)
        swapped = model(**{**batch, "pixel_values": batch["pixel_values"].flip(0)}).logits
    start = 0
    for ex in examples:
        with torch.no_grad():
            alone = model(input_ids=torch.tensor([ex.ids]), pixel_values=ex.pixel_values[0]).logits[0]
        end = start + len(ex.ids)
        assert (packed[0, start:end] - alone).abs().max() <= 1e-5
        assert (swapped[0, start:end] - alone).abs().max() > 1e-3
        start = end
    with pytest.raises(ValueError, match="sft.jsonl:1: the row holds images and this is a text-only model"):
        load_examples([str(data)], tok, 1024, None)


def test_rl_learner_scores_image_trajectories_as_the_engine_did_across_pause_and_checkpoint(
    vlm, figures, tmp_path, one_torch_thread
) -> None:
    """The partial-rollout scheduler over the figure task: the learner's logprobs of image trajectories equal the
    engine's (≤ 1e-4, fp32) and differ without the images; a trajectory paused across the batch, checkpointed and
    restored gets its images back from its task row and continues exactly as the uncheckpointed one does."""
    from posttrain.rl.engines import PolicyConfig, build_policy, load_processor
    from posttrain.rl.learner import Learner
    from posttrain.rl.task import JsonlTask, TaskSource, exact_match
    from posttrain.rollout.engines.hf import HFEngine
    from posttrain.rollout.scheduler import PartialRolloutScheduler, SchedulerConfig
    from posttrain.rollout.types import SamplingParams

    policy = PolicyConfig(path=str(vlm[1]))
    model, tok = build_policy(policy)
    data = _write(tmp_path / "task.jsonl", [*_rows(figures[0], "train"), *_broken(_rows(figures[0], "train")[0])])

    def scheduler() -> PartialRolloutScheduler:
        source = TaskSource(JsonlTask.from_jsonl(data, exact_match), tok, seed=0, processor=load_processor(policy))
        assert {k: v.split(":")[0] for k, v in source.skipped.items()} == {"missing": "missing_file",
                                                                           "corrupt": "unreadable"}  # fmt: skip
        lengths = lambda prompt, j, p: dataclasses.replace(p, forced_length=(2, 5)[j])  # noqa: E731
        cfg = SchedulerConfig(batch_target=2, group_size=2, dapo=False)
        engine = HFEngine(copy.deepcopy(model), capacity=4)
        return PartialRolloutScheduler(engine, source, lambda t: 0.0, SamplingParams(8), cfg, params_fn=lengths)

    learner = Learner(model)

    def check(trajs) -> None:
        assert all(t.request.pixel_values is not None for t in trajs)
        got = learner.logprobs(trajs)
        for i, t in enumerate(trajs):
            assert (got[i, : t.n_tokens] - torch.tensor(t.logprobs)).abs().max() <= 1e-4
        for t in trajs:
            t.request.pixel_values = None
        blind = learner.logprobs(trajs)
        assert max((blind[i, : t.n_tokens] - got[i, : t.n_tokens]).abs().max() for i, t in enumerate(trajs)) > 1e-3

    a = scheduler()
    batch = a.collect()
    paused = a.paused
    assert paused and all(0 < t.n_tokens < 5 for t in paused)  # a group submitted late, cut mid-response
    state = torch.load(_save(a.state_dict(), tmp_path / "state.pt"), weights_only=False)
    check([t for g in batch.groups for t in g])

    b = scheduler()
    b.load_state_dict(state)
    for before, after in zip(paused, b.paused, strict=True):  # rebuilt from the row: the very same pixels
        assert torch.equal(before.request.pixel_values, after.request.pixel_values)
        assert [im.tobytes() for im in before.request.images] == [im.tobytes() for im in after.request.images]
        assert len(after.request.images) == 1  # the decoded image too (vLLM runs its own processor)
    next_a, next_b = a.collect(), b.collect()
    resumed = {t.request_id for t in paused}
    trajs_a = [t for g in next_a.groups for t in g]
    trajs_b = [t for g in next_b.groups for t in g]
    assert resumed & {t.request_id for t in trajs_b}
    assert [t.token_ids for t in trajs_a] == [t.token_ids for t in trajs_b]
    assert max(abs(x - y) for a_, b_ in zip(trajs_a, trajs_b) for x, y in zip(a_.logprobs, b_.logprobs)) <= 1e-6
    check(trajs_b)


def test_the_image_placeholder_is_never_sampled_so_learner_forwards_never_see_a_stray_one(vlm, one_torch_thread):
    """With the placeholder's logit pushed to +100 the engine still never samples it (engine and learner both mask
    it), and the learner scores the image trajectories as the engine did; sampled, it would make the learner's
    forward see more image tokens than images."""
    from PIL import Image

    from formats.chat_images import data_url, encode_chat
    from posttrain.rl.engines import PolicyConfig, build_policy, load_processor
    from posttrain.rl.learner import Learner
    from posttrain.rollout.engine import run_all
    from posttrain.rollout.engines.hf import HFEngine
    from posttrain.rollout.types import Request, SamplingParams

    policy = PolicyConfig(path=str(vlm[1]))
    model, processor = build_policy(policy)[0], load_processor(policy)
    tid = model.config.image_token_id
    model.lm_head.register_forward_hook(
        lambda m, i, out: out.index_add(-1, torch.tensor([tid]), torch.full_like(out[..., :1], 100.0))
    )
    buf = io.BytesIO()
    Image.new("RGB", (30, 40), (200, 10, 90)).save(buf, format="PNG")
    chat = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(buf.getvalue())}}]}]
    ids, px, _ = encode_chat(chat, processor)
    trajs = run_all(
        HFEngine(copy.deepcopy(model), capacity=2),
        [Request(f"r{i}", ids, SamplingParams(4, seed=i), pixel_values=px) for i in range(2)],
    )
    assert all(t.n_tokens == 4 and tid not in t.token_ids for t in trajs)
    got = Learner(model).logprobs(trajs)
    assert (got - torch.tensor([t.logprobs for t in trajs])).abs().max() <= 1e-4


def _save(state: dict, path: Path) -> Path:
    torch.save(state, path)
    return path


def test_sft_then_rl_then_eval_on_the_figure_task(vlm, figures, text_only, tmp_path, capsys, monkeypatch) -> None:
    """Issue 37's acceptance chain: the build → pre-training → export of the fixtures, the export loaded in a clean
    interpreter (transformers and torch only) with the pre-training model's logits on a budget-equals-N image
    (``check_vlm_export``), then through the CLI ``posttrain sft`` on the figure task's train rows (answers as
    replies) → ``posttrain rl`` (2 steps) from that policy on the same rows → ``eval`` on the test split with pass@k;
    a row whose image is broken is skipped with its reason by both; a text-only model refuses image rows in both."""
    from pipelines.cli import main

    check_vlm_export(vlm[0], vlm[1], tmp_path)
    for k, v in OFFLINE.items():
        monkeypatch.setenv(k, v)
    task, model = figures[0], vlm[1]
    data = _write(tmp_path / "train.jsonl", [*_rows(task, "train"), _broken(_rows(task, "train")[0])[0]])
    sft, rl = tmp_path / "sft", tmp_path / "rl"
    args = ["posttrain", "sft", "--config", "debug", "--model", str(model), "--data", str(data), "--out", str(sft),
            "--set", "steps=2", "--set", "micro_batch=1", "--set", "tensorboard=false", "--no-progress"]  # fmt: skip
    assert main(args) == 0
    assert "1 skipped (1 missing_file)" in capsys.readouterr().out
    assert [json.loads(x)["reason"].split(":")[0] for x in (sft / "skipped.jsonl").read_text().splitlines()] == [
        "missing_file"
    ]
    steps = [json.loads(x) for x in (sft / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps] == [1, 2] and all(r["target_tokens"] > 0 for r in steps)
    assert (sft / "policy" / "processor_config.json").exists()

    args = ["posttrain", "rl", "--config", "debug", "--out", str(rl), "--set", f"policy.path={sft / 'policy'}",
            "--set", "task.name=jsonl", "--set", f"task.jsonl={data}", "--set", "task.verifier=prefix",
            "--set", "steps=2", "--set", "scheduler.batch_target=2", "--set", "scheduler.group_size=2",
            "--set", "scheduler.dapo=false", "--set", "sampling.max_new_tokens=3", "--set", "engine_capacity=6",
            "--set", "learner.n_minibatches=2", "--no-progress"]  # fmt: skip
    assert main(args) == 0
    assert "skipped {'missing_file': 1}" in capsys.readouterr().out
    assert [json.loads(x)["reason"].split(":")[0] for x in (rl / "skipped.jsonl").read_text().splitlines()] == [
        "missing_file"
    ]
    steps = [json.loads(x) for x in (rl / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps] == [1, 2] and all(r["trained_tokens"] > 0 for r in steps)
    # trainer and engine agree on every token seen at the same weights, the resumed partial ones included
    assert all(r["matched_mismatch_abs_max"] <= 1e-4 and r["bkl_masked_fraction"] == 0 for r in steps)
    assert steps[1]["old_version_tokens"] > 0  # step 2 trained tokens sampled before the sync (paused, resumed)

    result = tmp_path / "eval.json"
    args = ["eval", "--model", str(rl / "policy"), "--task", "jsonl", "--data", str(task / "test.jsonl"), "--n", "2",
            "--k", "1,2", "--max-new-tokens", "2", "--out", str(result), "--no-progress"]  # fmt: skip
    assert main(args) == 0
    got = json.loads(result.read_text())
    assert {"pass@1", "pass@2"} <= set(got) and 0.0 <= got["pass@1"] <= got["pass@2"] <= 1.0
    assert got["problems_count"] == len(_rows(task, "test")) and not got["skipped"]

    capsys.readouterr()
    sft_args = ["posttrain", "sft", "--config", "debug", "--model", str(text_only), "--data", str(data), "--out",
                str(tmp_path / "refused-sft"), "--no-progress"]  # fmt: skip
    assert main(sft_args) == 2
    assert "holds images and this is a text-only model" in capsys.readouterr().err
    rl_args = ["posttrain", "rl", "--config", "debug", "--out", str(tmp_path / "refused-rl"), "--set",
               f"policy.path={text_only}", "--set", "task.name=jsonl", "--set", f"task.jsonl={data}", "--no-progress"]  # fmt: skip
    assert main(rl_args) == 2
    assert "task rows hold images and the policy is a text-only model" in capsys.readouterr().err
    # an engine that takes no images (neither pixel values nor decoded images) refuses them, naming those that do
    assert main([*rl_args[:7], f"policy.path={sft / 'policy'}", *rl_args[8:], "--set", "engine.kind=speculative"]) == 2
    assert "run on engine.kind=hf or vllm, not speculative" in capsys.readouterr().err
