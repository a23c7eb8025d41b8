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

    _write_side_files(out, state, cfg, ck, run, {"format": "text"})
    return ck


def export_vlm(run: str | Path, out: str | Path, backbone: str | None = None) -> Checkpoint:
    """Write ``out`` as a LLaVA-style vision-language model from ``run``'s latest complete checkpoint: loadable by
    ``AutoModelForImageTextToText`` and ``AutoProcessor`` with no project code. The backbone Φ is the language
    model; the frozen tower E_v (the run's encoder) the vision tower; W_in the projector's first layer, followed by
    an identity activation and an identity second layer (one linear map, exactly). The processor resizes an image
    to ``crop_size``² (bilinear, no centre crop) and normalises it as pre-training does, and ``<image>`` expands to
    the tower's N patch features (CLS dropped, last layer) — see the README for N vs the corpus's slot budget.
    The patch head ψ goes beside it (``vision_heads.*``, :func:`load_vision_heads`)."""
    from transformers import (
        AutoConfig,
        AutoTokenizer,
        CLIPImageProcessor,
        GenerationConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    from formats.chat import IMAGE_TOKEN, VLM_CHAT_TEMPLATE
    from pretrain.model import _pixel_stats, load_encoder

    run, out = Path(run), Path(out)
    cfg = _run_config(run, backbone)
    source, encoder_name = backbone or cfg["model"]["backbone"], cfg["model"]["encoder"]
    if not encoder_name:
        raise ValueError(f"{run}: the run's config names no encoder; export it with --text-only")
    crop = int(cfg.get("data", {}).get("crop_size") or 0)
    ck = latest_checkpoint(run)
    state = consolidated_state(ck)

    tower = load_encoder(encoder_name)
    vcfg = tower.config
    if "clip" not in vcfg.model_type:
        raise ValueError(f"the VLM export takes a CLIP vision tower; {encoder_name} is {vcfg.model_type!r}")
    crop = crop or vcfg.image_size
    tower_state = dict(tower.state_dict())  # LLaVA's vision tower is the same class: the keys carry over
    emb_prefix = "vision_model.embeddings." if hasattr(tower, "vision_model") else "embeddings."
    if crop != vcfg.image_size:  # pre-training interpolates the positions to the crop: bake that in
        emb = getattr(tower, "vision_model", tower).embeddings
        n = (crop // vcfg.patch_size) ** 2
        dummy = torch.zeros(1, n + 1, vcfg.hidden_size)
        with torch.no_grad():
            pos = emb.interpolate_pos_encoding(dummy, crop, crop)[0]
        tower_state[emb_prefix + "position_embedding.weight"] = pos
        tower_state.pop(emb_prefix + "position_ids", None)
        vcfg.image_size = crop
    n_patches = (crop // vcfg.patch_size) ** 2

    tok = AutoTokenizer.from_pretrained(source)
    if IMAGE_TOKEN not in tok.get_vocab():
        tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    image_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
    lm_cfg = AutoConfig.from_pretrained(source)
    vocab = lm_cfg.vocab_size
    lm_cfg.vocab_size = max(vocab, len(tok))
    config = LlavaConfig(
        vision_config=vcfg,
        text_config=lm_cfg,
        image_token_index=image_id,
        image_seq_length=n_patches,
        projector_hidden_act="linear",
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
        multimodal_projector_bias=True,
        tie_word_embeddings=bool(getattr(lm_cfg, "tie_word_embeddings", False)),
    )
    model = LlavaForConditionalGeneration(config).float().eval()

    lm = {k.removeprefix("backbone."): v for k, v in state.items() if k.startswith("backbone.")}
    new: dict[str, torch.Tensor] = {}
    for k, v in lm.items():
        if k.startswith("model."):
            new["model.language_model." + k.removeprefix("model.")] = v
        elif k == "lm_head.weight":
            new[k] = v
    for k in ("model.language_model.embed_tokens.weight", "lm_head.weight"):
        if k in new and new[k].shape[0] < lm_cfg.vocab_size:  # the added <image> row: zeros, never read as input
            pad = new[k].new_zeros(lm_cfg.vocab_size - new[k].shape[0], new[k].shape[1])
            new[k] = torch.cat([new[k], pad])
    new |= {f"model.vision_tower.{k}": v for k, v in tower_state.items()}
    d_model = lm_cfg.hidden_size
    new["model.multi_modal_projector.linear_1.weight"] = state["w_in.weight"]
    new["model.multi_modal_projector.linear_1.bias"] = state["w_in.bias"]
    new["model.multi_modal_projector.linear_2.weight"] = torch.eye(d_model)
    new["model.multi_modal_projector.linear_2.bias"] = torch.zeros(d_model)
    missing, unexpected = model.load_state_dict(new, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    missing = [k for k in missing if k not in tied and not k.endswith("position_ids")]
    if missing or unexpected:
        raise ValueError(
            f"checkpoint does not fit {source} + {encoder_name}: missing {missing}, unexpected {unexpected}"
        )
    if config.tie_word_embeddings:
        model.tie_weights()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)

    mean, std = _pixel_stats(encoder_name)
    images = CLIPImageProcessor(
        do_resize=True,
        size={"height": crop, "width": crop},
        resample=2,  # PIL bilinear, as pretrain.data.load_pixels
        do_center_crop=False,
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=list(mean),
        image_std=list(std),
        do_convert_rgb=True,
    )
    processor = LlavaProcessor(
        image_processor=images,
        tokenizer=tok,
        patch_size=vcfg.patch_size,
        vision_feature_select_strategy="default",
        chat_template=VLM_CHAT_TEMPLATE,
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1,
    )
    tok.chat_template = VLM_CHAT_TEMPLATE
    processor.save_pretrained(out)
    GenerationConfig(
        bos_token_id=tok.bos_token_id if tok.bos_token_id is not None else lm_cfg.bos_token_id,
        eos_token_id=tok.eos_token_id if tok.eos_token_id is not None else lm_cfg.eos_token_id,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
        max_new_tokens=256,
    ).save_pretrained(out)
    _write_side_files(out, state, cfg, ck, run, {"format": "vlm", "n_image_tokens": n_patches, "crop_size": crop})
    return ck


def _write_side_files(
    out: Path, state: dict[str, torch.Tensor], cfg: dict[str, Any], ck: Checkpoint, run: Path, extra: dict[str, Any]
) -> None:
    """``vision_heads.*`` (W_in and ψ), ``series_lane.safetensors`` when the run trained the time-series lane, and
    ``export.json`` (where the weights came from)."""
    from safetensors.torch import save

    heads = {k: v.contiguous() for k, v in state.items() if k.startswith(("w_in.", "psi."))}
    fs.write_bytes(out / f"{HEADS}.safetensors", save(heads))
    meta = {
        "d_vis": int(heads["w_in.weight"].shape[1]),
        "d_model": int(heads["w_in.weight"].shape[0]),
        "head_hidden": int(heads["psi.0.weight"].shape[0]),
        "encoder": cfg["model"]["encoder"],
        "patch": cfg.get("data", {}).get("patch"),
    }
    fs.write_text(out / f"{HEADS}.json", json.dumps(meta, indent=2))
    series = {k: v.contiguous() for k, v in state.items() if k.startswith("series.")}
    if series:
        fs.write_bytes(out / "series_lane.safetensors", save(series))
    info = {"run": str(run), "tag": ck.tag, "step": ck.step, "zero_stage": ck.zero_stage, "world_size": ck.world_size}
    fs.write_text(out / "export.json", json.dumps(info | extra, indent=2))


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


def default_format(run: str | Path, backbone: str | None = None) -> str:
    """What ``pretrain export`` writes without ``--vlm``/``--text-only``: ``vlm`` for a run that trained with a
    vision encoder, ``text`` for one that did not (there is no tower to export)."""
    return "vlm" if _run_config(Path(run), backbone)["model"].get("encoder") else "text"


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
