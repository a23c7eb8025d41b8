"""Pre-training run → Hugging Face model directory (``scifolio pretrain export``).

    scifolio pretrain export runs/pretrain --out models/base
    python -c "from pretrain.export import load_vision_heads; w_in, psi, meta = load_vision_heads('models/base')"

Reads ``RUN/config.json`` (written by ``pretrain.train``) for the backbone's config and tokenizer, and
``RUN/ckpt/<tag>`` for the weights: DeepSpeed's ``latest`` names the newest checkpoint whose every rank finished
writing, so exporting a run still in progress takes that one and reports its step. Any ZeRO stage and world size:
stage 0 keeps the whole module in ``mp_rank_00_model_states.pt``; stages 1–3 keep fp32 master partitions per rank
(``*_optim_states.pt``), which DeepSpeed's own ``zero_to_fp32`` merges (ZeRO-3 parameters are empty placeholders
in the module file, so the partitions are the only source of truth).

Writes into ``MODEL``:
- ``config.json``, ``model.safetensors``, ``generation_config.json``: the backbone Φ, loadable with
  ``AutoModelForCausalLM.from_pretrained(MODEL)`` and nothing of this project imported;
- the tokenizer files, with ``formats.chat.CHAT_TEMPLATE`` when the tokenizer had no chat template;
- ``vision_heads.safetensors`` + ``vision_heads.json``: W_in (``w_in.*``, E_v → Φ inputs) and the patch head ψ
  (``psi.*``), with the encoder they were trained against; :func:`load_vision_heads` rebuilds them;
- ``export.json``: the run, checkpoint tag and step it came from.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from formats import fs
from formats.chat import CHAT_TEMPLATE

HEADS = "vision_heads"


@dataclass(frozen=True)
class Checkpoint:
    """One complete DeepSpeed checkpoint of a run."""

    dir: Path
    """``RUN/ckpt``: the directory ``engine.save_checkpoint`` was given."""
    tag: str
    """Subdirectory (``step40``)."""
    step: int
    """Optimizer step the checkpoint holds."""
    zero_stage: int
    world_size: int


def latest_checkpoint(run: str | Path) -> Checkpoint:
    """The newest complete checkpoint of ``run``: the tag DeepSpeed's ``latest`` names (written after every rank
    saved), checked to hold its model file and every rank's optimizer partition."""
    ckpt = Path(run) / "ckpt"
    latest = ckpt / "latest"
    if not latest.exists():
        raise FileNotFoundError(f"{run}: no complete checkpoint yet ({latest} missing; set save_every to get some)")
    tag = latest.read_text().strip()
    # ZeRO-3 names it zero_pp_rank_0_mp_rank_00_model_states.pt (one per rank), the other stages one file.
    model_files = sorted((ckpt / tag).glob("*mp_rank_00_model_states.pt"))
    if not model_files:
        raise FileNotFoundError(f"{run}: {latest} names {tag} but it holds no model states file")
    model_file = model_files[0]
    # The module file holds client_state (our step) and the ds_config (stage); params may be ZeRO-3 placeholders.
    state = torch.load(model_file, map_location="cpu", weights_only=False, mmap=True)
    stage = int(state.get("ds_config", {}).get("zero_optimization", {}).get("stage", 0))
    world = int(state.get("dp_world_size", 1))
    step = int(state["step"]) if "step" in state else _step_of(tag)
    if stage > 0:
        parts = sorted((ckpt / tag).glob("*_optim_states.pt"))
        if len(parts) != world:
            raise FileNotFoundError(f"{run}: {tag} holds {len(parts)} of {world} ranks' ZeRO partitions")
    return Checkpoint(ckpt, tag, step, stage, world)


def consolidated_state(ck: Checkpoint) -> dict[str, torch.Tensor]:
    """The trainable module's full fp32 state dict (``backbone.*``, ``w_in.*``, ``psi.*``), merged across ranks."""
    if ck.zero_stage == 0:
        model_file = ck.dir / ck.tag / "mp_rank_00_model_states.pt"
        state = torch.load(model_file, map_location="cpu", weights_only=False)
        return {k: v.float() for k, v in state["module"].items()}
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    state = get_fp32_state_dict_from_zero_checkpoint(str(ck.dir), tag=ck.tag, exclude_frozen_parameters=True)
    return {k: v.float() for k, v in state.items()}


def export(run: str | Path, out: str | Path, backbone: str | None = None) -> Checkpoint:
    """Write the Hugging Face model directory ``out`` from ``run``'s latest complete checkpoint."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    run, out = Path(run), Path(out)
    cfg = _run_config(run, backbone)
    source = backbone or cfg["model"]["backbone"]
    ck = latest_checkpoint(run)
    state = consolidated_state(ck)

    lm_cfg = AutoConfig.from_pretrained(source)
    lm_cfg.dtype = "float32"
    model = AutoModelForCausalLM.from_config(lm_cfg, dtype=torch.float32)
    lm_state = {k.removeprefix("backbone."): v for k, v in state.items() if k.startswith("backbone.")}
    missing, unexpected = model.load_state_dict(lm_state, strict=False)
    tied = {"lm_head.weight"} if getattr(lm_cfg, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise ValueError(f"checkpoint does not fit {source}: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)

    tok = AutoTokenizer.from_pretrained(source)
    if not tok.chat_template:
        tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)
    gen = GenerationConfig(
        bos_token_id=tok.bos_token_id if tok.bos_token_id is not None else lm_cfg.bos_token_id,
        eos_token_id=tok.eos_token_id if tok.eos_token_id is not None else lm_cfg.eos_token_id,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
        max_new_tokens=256,
    )
    gen.save_pretrained(out)

    heads = {k: v.contiguous() for k, v in state.items() if k.startswith(("w_in.", "psi."))}
    from safetensors.torch import save

    fs.write_bytes(out / f"{HEADS}.safetensors", save(heads))
    meta = {
        "d_vis": int(heads["w_in.weight"].shape[1]),
        "d_model": int(heads["w_in.weight"].shape[0]),
        "head_hidden": int(heads["psi.0.weight"].shape[0]),
        "encoder": cfg["model"]["encoder"],
        "patch": cfg.get("data", {}).get("patch"),
    }
    fs.write_text(out / f"{HEADS}.json", json.dumps(meta, indent=2))
    fs.write_text(
        out / "export.json",
        json.dumps(
            {"run": str(run), "tag": ck.tag, "step": ck.step, "zero_stage": ck.zero_stage, "world_size": ck.world_size},
            indent=2,
        ),
    )
    return ck


def load_vision_heads(model_dir: str | Path) -> tuple[nn.Linear, nn.Sequential, dict[str, Any]]:
    """W_in (``nn.Linear(d_vis, d_model)``), ψ (``Linear → GELU → Linear`` back to E_v space) and their metadata
    (``encoder``: the frozen tower they were trained against; ``patch``), as exported beside the backbone."""
    from safetensors.torch import load_file

    model_dir = Path(model_dir)
    meta = json.loads((model_dir / f"{HEADS}.json").read_text())
    state = load_file(str(model_dir / f"{HEADS}.safetensors"))
    w_in = nn.Linear(meta["d_vis"], meta["d_model"])
    psi = nn.Sequential(
        nn.Linear(meta["d_model"], meta["head_hidden"]), nn.GELU(), nn.Linear(meta["head_hidden"], meta["d_vis"])
    )
    w_in.load_state_dict({k.removeprefix("w_in."): v for k, v in state.items() if k.startswith("w_in.")})
    psi.load_state_dict({k.removeprefix("psi."): v for k, v in state.items() if k.startswith("psi.")})
    return w_in, psi, meta


def _run_config(run: Path, backbone: str | None) -> dict[str, Any]:
    path = run / "config.json"
    if path.exists():
        return json.loads(path.read_text())
    if backbone is None:
        raise FileNotFoundError(f"{path} missing (a run older than `pretrain export`): pass --backbone PATH")
    return {"model": {"backbone": backbone, "encoder": None}}


def _step_of(tag: str) -> int:
    m = re.search(r"(\d+)$", tag)
    return int(m.group(1)) if m else -1
