"""``scifolio pretrain export``: a DeepSpeed run (ZeRO-2/3, 1/2 ranks) → a Hugging Face model directory that plain
``transformers`` loads, with the training engine's own logits (≤ 1e-5, fp32)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from pipelines.cli.pretrain import _free_port
from tests.conftest import needs_loopback_namespace

ROOT = Path(__file__).resolve().parents[2]

# Runs in a fresh interpreter: imports transformers and torch only, and proves nothing of this project came along.
CLEAN_LOAD = textwrap.dedent(
    """
    import json, sys
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir, probe_file, engine_file = sys.argv[1:4]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = torch.load(probe_file)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    ours = sorted(m for m in sys.modules if m.split(".")[0] in ("formats", "pretrain", "posttrain", "pipelines"))
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    print(json.dumps({
        "max_abs": (logits - torch.load(engine_file)).abs().max().item(),
        "ours": ours, "chat": chat, "vocab": len(tok), "dtype": str(next(model.parameters()).dtype),
    }))
    """
)


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))
    return env


def _train(corpus: Path, models: Path, out: Path, stage: int, ranks: int) -> None:
    module = ["-m", "tests.pretrain.export_run", str(corpus), str(models), str(out), str(stage)]
    if ranks == 1:
        cmd = [sys.executable, *module]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_addr"]
        cmd += ["127.0.0.1", "--master_port", str(_free_port()), *module]  # pytest-xdist: another worker may rendezvous
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]


def _export(run: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> str:
    from pipelines.cli import main

    assert main(["pretrain", "export", str(run), "--out", str(out), "--text-only"]) == 0
    return capsys.readouterr().out


def _clean_load(model: Path, run: Path, tmp: Path) -> dict:
    from tests.pretrain.export_run import probe_ids

    torch.save(probe_ids(), tmp / "probe.pt")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", CLEAN_LOAD, str(model), str(tmp / "probe.pt"), str(run / "engine_logits.pt")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs(corpus: Path, tiny_models: Path, tmp_path_factory: pytest.TempPathFactory):
    """One 3-step run per (stage, ranks), trained on first use and shared by the tests of this module."""
    made: dict[tuple[int, int], Path] = {}

    def get(stage: int, ranks: int) -> Path:
        if (stage, ranks) not in made:
            made[stage, ranks] = tmp_path_factory.mktemp(f"run-z{stage}-r{ranks}")
            _train(corpus, tiny_models, made[stage, ranks], stage, ranks)
        return made[stage, ranks]

    return get


def _check(runs, tmp_path, capsys, stage: int, ranks: int) -> None:
    run, model = runs(stage, ranks), tmp_path / "model"
    said = _export(run, model, capsys)
    assert f"step 3 (step3, ZeRO-{stage}, {ranks} rank(s))" in said
    got = _clean_load(model, run, tmp_path)
    assert got["ours"] == [] and got["dtype"] == "torch.float32"
    assert got["max_abs"] <= 1e-5, got
    assert got["chat"].endswith("<|im_start|>assistant\n")
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"} <= {
        p.name for p in model.iterdir()
    }
    assert json.loads((model / "export.json").read_text())["step"] == 3

    # The vision projection and patch head come back through the documented loader with the trained weights.
    from pretrain.export import consolidated_state, latest_checkpoint, load_vision_heads

    w_in, psi, meta = load_vision_heads(model)
    state = consolidated_state(latest_checkpoint(run))
    assert torch.equal(w_in.weight, state["w_in.weight"]) and torch.equal(psi[2].bias, state["psi.2.bias"])
    assert meta["encoder"].endswith("pretrain-vision") and meta["d_vis"] == w_in.in_features


@pytest.mark.parametrize("stage", [2, 3])
def test_export_matches_engine_logits_one_rank(stage, runs, tmp_path, capsys) -> None:
    _check(runs, tmp_path, capsys, stage, ranks=1)


@pytest.mark.slow
@pytest.mark.integration
@needs_loopback_namespace()
@pytest.mark.parametrize("stage", [2, 3])
def test_export_matches_engine_logits_two_ranks(stage, runs, tmp_path, capsys) -> None:
    _check(runs, tmp_path, capsys, stage, ranks=2)
    assert len(list((runs(stage, 2) / "ckpt" / "step3").glob("*_optim_states.pt"))) == 2


@pytest.mark.slow
@pytest.mark.integration
@needs_loopback_namespace()
def test_zero2_and_zero3_two_ranks_train_alike(runs) -> None:
    """At step 2 rank 1 has no image crops: without the lockstep model its backward would reach W_in at another point
    and ZeRO-2's bucketed reduction would differ (step 3 loss 13.891 against 13.871 measured before the fix)."""

    def losses(stage: int) -> list[float]:
        rows = (runs(stage, 2) / "metrics.jsonl").read_text().splitlines()
        return [json.loads(row)["loss"] for row in rows]

    assert losses(2) == pytest.approx(losses(3), rel=0, abs=1e-4)


def test_export_of_run_in_progress_takes_latest_complete_checkpoint(runs, tmp_path, capsys) -> None:
    from pretrain.export import consolidated_state, latest_checkpoint

    run = tmp_path / "run"
    shutil.copytree(runs(2, 1), run)  # checkpoints at steps 2 and 3
    # step 3 caught mid-write: DeepSpeed rewrites `latest` only after every rank saved, so it still names step 2.
    (run / "ckpt" / "latest").write_text("step2")
    for part in (run / "ckpt" / "step3").glob("*_optim_states.pt"):
        part.unlink()
    said = _export(run, tmp_path / "model", capsys)
    assert "step 2 (step2" in said
    from safetensors.torch import load_file

    exported = load_file(str(tmp_path / "model" / "model.safetensors"))
    step2 = consolidated_state(latest_checkpoint(run))
    assert torch.equal(exported["model.norm.weight"], step2["backbone.model.norm.weight"])
    # A checkpoint whose partitions are not all there is refused, not half-exported.
    (run / "ckpt" / "latest").write_text("step3")
    with pytest.raises(FileNotFoundError, match="0 of 1"):
        latest_checkpoint(run)
    shutil.rmtree(run / "ckpt" / "step3")
    with pytest.raises(FileNotFoundError):
        latest_checkpoint(run)


# Runs in a fresh interpreter: the VLM export through transformers' auto classes only, an image + text chat.
CLEAN_VLM = textwrap.dedent(
    """
    import json, sys
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model_dir, image_file, out_file = sys.argv[1:4]
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(model_dir)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What does it show?"}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = processor(images=Image.open(image_file), text=prompt, return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits
        made = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    torch.save({"input_ids": inputs["input_ids"], "logits": logits}, out_file)
    ours = sorted(m for m in sys.modules if m.split(".")[0] in ("formats", "pretrain", "posttrain", "pipelines"))
    image_id = model.config.image_token_index
    print(json.dumps({
        "ours": ours, "prompt": prompt, "new_tokens": made.shape[1] - inputs["input_ids"].shape[1],
        "image_tokens": int((inputs["input_ids"] == image_id).sum()), "arch": type(model).__name__,
    }))
    """
)


def test_vlm_export_loads_as_an_image_text_model_with_the_pretraining_logits(runs, tmp_path) -> None:
    """``pretrain export`` of a run with a vision tower (the default format): see :func:`check_vlm_export`."""
    from pipelines.cli import main

    run, model_dir = runs(2, 1), tmp_path / "vlm"
    assert main(["pretrain", "export", str(run), "--out", str(model_dir)]) == 0  # a run with a tower: VLM by default
    check_vlm_export(run, model_dir, tmp_path)


def check_vlm_export(run: Path, model_dir: Path, tmp_path: Path) -> None:
    """A VLM export of ``run`` is a LLaVA-style directory that transformers' auto classes load with no project code;
    an image + text chat generates, and on an image whose corpus slot budget equals the tower's N patches the
    logits equal the pre-training model's own (≤ 1e-5, fp32)."""
    from PIL import Image

    from pipelines.assembly.interleave import ImageTokenRule
    from pretrain.config import ModelConfig
    from pretrain.data import load_pixels
    from pretrain.export import consolidated_state, latest_checkpoint
    from pretrain.model import VisualPretrainModel

    cfg = json.loads((run / "config.json").read_text())
    crop = cfg["data"]["crop_size"]

    # 224 × 224: ⌈224/28⌉² = 64 corpus slots, and the tiny tower's (64/8)² = 64 patches
    img = Image.new("RGB", (224, 224), "white")
    for x in range(0, 224, 16):
        img.paste((30 + x, 120, 250 - x), (x, 40 + x // 4, x + 12, 200))
    img.save(tmp_path / "figure.png")
    n = (crop // 8) ** 2
    assert ImageTokenRule()(224, 224) == n == 64

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    args = [str(model_dir), str(tmp_path / "figure.png"), str(tmp_path / "vlm_out.pt")]
    done = subprocess.run(
        [sys.executable, "-c", CLEAN_VLM, *args], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["ours"] == [] and got["arch"] == "LlavaForConditionalGeneration"
    assert got["image_tokens"] == n and got["new_tokens"] >= 1 and "<image>What does it show?" in got["prompt"]

    saved = torch.load(tmp_path / "vlm_out.pt")
    ids, exported = saved["input_ids"], saved["logits"]
    model = VisualPretrainModel.load(ModelConfig(backbone=cfg["model"]["backbone"], encoder=cfg["model"]["encoder"]))
    missing, _ = model.load_state_dict(consolidated_state(latest_checkpoint(run)), strict=False)
    assert not [k for k in missing if k.startswith(("backbone.", "w_in.", "psi."))]
    model.eval()
    image_id = json.loads((model_dir / "config.json").read_text())["image_token_index"]
    where = (ids[0] == image_id).nonzero()[:, 0]
    start = int(where[0])
    assert where.tolist() == list(range(start, start + n))  # one contiguous slot run
    vocab = model.vocab_size
    pixels = load_pixels((tmp_path / "figure.png").read_bytes(), (crop, crop))[None]
    ours = model.logits(
        ids.clamp(max=vocab - 1),  # the <image> id is past Φ's vocabulary; its slots are overwritten
        torch.arange(ids.shape[1])[None],
        torch.ones_like(ids),
        pixels,
        torch.tensor([[0, start, n]]),
    )
    assert (exported[..., :vocab] - ours).abs().max().item() <= 1e-5


def test_default_format_follows_the_runs_encoder(tmp_path) -> None:
    """``pretrain export`` without a flag writes a VLM for a run that trained with a tower, a text LM otherwise."""
    from pretrain.export import default_format

    for encoder, want in (("tiny/encoder", "vlm"), (None, "text")):
        (tmp_path / "config.json").write_text(json.dumps({"model": {"backbone": "b", "encoder": encoder}}))
        assert default_format(tmp_path) == want
