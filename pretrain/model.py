"""The visual pre-training model (SPEC §B, Eq 5–6), top-down: frozen E_v → mask → raster → W_in → Φ → ψ; plus,
when the shards hold series, the time-series lane (SPEC C10): series encoder → tokens in Φ's embedding space at the
series' slots, and a forecaster conditioned on Φ's hidden states there, scored on each series' held-out tail.

    model = VisualPretrainModel.load(ModelConfig(backbone="tiny/pretrain-lm", encoder="tiny/pretrain-vision"))
    out = model(**batch_tensors)      # {"loss", "l_text", "l_vp", "vp_acc", ...}

Φ is any Hugging Face causal LM (trainable); E_v any Hugging Face vision tower returning patch features
(frozen: eval mode, ``requires_grad=False``, outside the optimizer and checkpoint deltas). Text rows and page rows
run through Φ as two forwards; attention never crosses a packed sample (4-D block-causal masks).

``lockstep=True`` (what ZeRO-3 needs at any world size, and ZeRO-1/2 on several ranks) makes every micro-batch call the same modules in the same
order on every rank, whatever its data: ZeRO-3 all-gathers a module's parameters when it is called, and ranks that
call different modules hang or die in a collective mismatch. E_v then runs on every call (no feature cache: a hit
would skip it), W_in projects all image slots in one call, and a rank without images or pages pushes a blank
dummy through the same modules whose output is multiplied out: its loss terms and gradients are exact zeros.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from formats import fs
from pretrain.config import ModelConfig, ObjectiveConfig, SeriesLaneConfig
from pretrain.objective import info_nce, text_loss, total_loss

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


# --- Eq 5: foreground mask and raster order (pure) ---------------------------------------------------------------


def foreground_mask(pixels: torch.Tensor, patch: int, blank_std: float) -> torch.Tensor:
    """Which patches of a page carry ink: ``[3|1, H, W]`` pixels in [0, 1] → ``[(H/p)·(W/p)]`` bool, raster order.

    A blank patch has near-uniform intensity: its grey-level standard deviation is ≤ ``blank_std``. Judged on the
    pixels E_v sees (after resizing), so the mask lines up with E_v's patch grid one to one.
    """
    grey = pixels.float().mean(dim=0) if pixels.dim() == 3 else pixels.float()
    h, w = grey.shape
    if h % patch or w % patch:
        raise ValueError(f"page {h}x{w} is not a multiple of patch {patch}")
    # [h/p, p, w/p, p] → [h/p, w/p, p*p]: row-major over the grid = left→right, top→bottom.
    tiles = grey.reshape(h // patch, patch, w // patch, patch).permute(0, 2, 1, 3).reshape(-1, patch * patch)
    return tiles.std(dim=1, unbiased=False) > blank_std


def raster(features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """u = raster(z[m]): keep masked patches in their row-major order. ``[N, D]``, ``[N]`` → ``[n_kept, D]``."""
    return features[mask]


def attention_cost(n_kept: int, n_total: int) -> float:
    """Relative self-attention cost after masking: (kept / total)²."""
    return (n_kept / n_total) ** 2


# --- the model ---------------------------------------------------------------------------------------------------


class VisualPretrainModel(nn.Module):
    """Backbone Φ + frozen encoder E_v + W_in (E_v → Φ inputs) + ψ (Φ hidden → E_v space)."""

    def __init__(
        self,
        backbone: nn.Module,
        encoder: nn.Module,
        cfg: ModelConfig,
        objective: ObjectiveConfig,
        pixel_mean: tuple[float, ...] = CLIP_MEAN,
        pixel_std: tuple[float, ...] = CLIP_STD,
        lockstep: bool = False,
        series: SeriesLaneConfig | None = None,
    ) -> None:
        super().__init__()
        self.cfg, self.objective = cfg, objective
        self.lockstep = lockstep
        self.backbone = backbone
        self.encoder = encoder.eval()
        self.encoder.requires_grad_(False)
        d_model = backbone.config.hidden_size
        d_vis = encoder.config.hidden_size
        hidden = cfg.head_hidden or d_model
        self.w_in = nn.Linear(d_vis, d_model)
        self.psi = nn.Sequential(nn.Linear(d_model, hidden), nn.GELU(), nn.Linear(hidden, d_vis))
        self.register_buffer("pixel_mean", torch.tensor(pixel_mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(pixel_std).view(1, 3, 1, 1), persistent=False)
        self.vocab_size = backbone.get_input_embeddings().num_embeddings
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self.series = SeriesLane(series, d_model) if series is not None else None

    @classmethod
    def load(
        cls,
        cfg: ModelConfig,
        objective: ObjectiveConfig | None = None,
        patch: int | None = None,
        seed: int = 0,
        lockstep: bool = False,
        series: SeriesLaneConfig | None = None,
    ) -> VisualPretrainModel:
        """Load Φ and E_v with ``from_pretrained`` (names or paths); W_in, ψ and the time-series lane (``series``:
        None = not built) are fresh, seeded by ``seed``.

        ``lockstep``: the same module calls on every rank every micro-batch (ZeRO-3; see the module docstring)."""
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        backbone = AutoModelForCausalLM.from_pretrained(cfg.backbone, dtype=torch.float32)
        encoder = load_encoder(cfg.encoder)
        enc_patch = getattr(encoder.config, "patch_size", None)
        if patch is not None and enc_patch is not None and enc_patch != patch:
            raise ValueError(f"data.patch={patch} but encoder {cfg.encoder} uses patch_size={enc_patch}")
        mean, std = _pixel_stats(cfg.encoder)
        torch.manual_seed(seed)
        return cls(backbone, encoder, cfg, objective or ObjectiveConfig(), mean, std, lockstep=lockstep, series=series)

    def train(self, mode: bool = True) -> VisualPretrainModel:
        super().train(mode)
        self.encoder.eval()  # frozen E_v never switches to train mode (dropout, norms stay fixed)
        return self

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    # --- E_v with its exact cache ---

    @torch.no_grad()
    def encode(self, pixels: torch.Tensor, keys: list[str] | None = None) -> torch.Tensor:
        """Patch features ``[n, N, D_v]`` of images in [0, 1] (``[n, 3, H, W]``), no grad; cached by key if given.

        In lockstep the cache is bypassed: E_v must run on every call anyway, so a hit would save nothing."""
        if pixels.shape[0] == 0:
            return pixels.new_zeros(0, 0, self.encoder.config.hidden_size)
        if keys is None or self.lockstep:
            return self._encode(pixels)
        shape = "x".join(map(str, pixels.shape[-2:]))
        full = [f"{k}@{shape}" for k in keys]
        missing = [i for i, k in enumerate(full) if self._cache_get(k) is None]
        if missing:
            feats = self._encode(pixels[missing])
            for i, f in zip(missing, feats):
                self._cache_put(full[i], f)
        return torch.stack([self._cache_get(k) for k in full]).to(pixels.device)

    def _encode(self, pixels: torch.Tensor) -> torch.Tensor:
        x = (pixels.float() - self.pixel_mean) / self.pixel_std
        x = x.to(next(self.encoder.parameters()).dtype)  # bf16 engines cast the tower too
        kwargs = {"interpolate_pos_encoding": True} if _accepts(self.encoder, "interpolate_pos_encoding") else {}
        hidden = self.encoder(pixel_values=x, **kwargs).last_hidden_state
        patch = self.encoder.config.patch_size
        n = (pixels.shape[-2] // patch) * (pixels.shape[-1] // patch)
        if hidden.shape[1] == n + 1:  # CLIP prepends a class token; the patch grid is the rest
            hidden = hidden[:, 1:]
        if hidden.shape[1] != n:
            raise ValueError(f"encoder returned {hidden.shape[1]} tokens for a {n}-patch grid")
        return hidden

    def _cache_get(self, key: str) -> torch.Tensor | None:
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        if self.cfg.feature_cache:
            path = Path(self.cfg.feature_cache) / f"{key.replace('@', '_')}.pt"
            if path.exists():
                feat = torch.load(path, map_location="cpu")
                self._cache_put(key, feat, write=False)
                return feat
        return None

    def _cache_put(self, key: str, feat: torch.Tensor, write: bool = True) -> None:
        self._cache[key] = feat.detach().cpu()
        while len(self._cache) > self.cfg.memory_cache_items:
            self._cache.popitem(last=False)
        if write and self.cfg.feature_cache:
            path = Path(self.cfg.feature_cache) / f"{key.replace('@', '_')}.pt"
            with fs.open_output(path) as f:
                torch.save(feat.detach().cpu().clone(), f)

    # --- forward ---

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor,
        position_ids: torch.Tensor,
        seq_ids: torch.Tensor,
        image_pixels: torch.Tensor,
        image_slots: torch.Tensor,
        page_pixels: torch.Tensor,
        page_mask: torch.Tensor,
        image_keys: list[str] | None = None,
        page_keys: list[str] | None = None,
        series_slots: torch.Tensor | None = None,
        series_context: torch.Tensor | None = None,
        series_target: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """Eq 9 on one micro-batch: text rows with images (and series) at their slots, then page rows for
        next-patch; with the time-series lane, L = λ_text·L_text + λ_vis·L_VP + λ_ts·L_TS."""
        series = (series_slots, series_context, series_target) if self.series is not None else None
        l_text, ts = self._text_and_series(
            input_ids, labels, position_ids, seq_ids, image_pixels, image_slots, image_keys, series
        )
        l_vp, acc, m = self.visual_forward(page_pixels, page_mask, page_keys)
        loss = total_loss(l_text, l_vp, self.objective.lambda_text, self.objective.lambda_vis)
        out = {"loss": loss, "l_text": l_text.detach(), "l_vp": l_vp.detach(), "vp_acc": acc, "vp_positions": m}
        if ts is not None:
            out["loss"] = loss + self.objective.lambda_ts * ts["loss"]
            out["ts_loss"], out["ts_values"] = ts["loss"].detach(), ts["n"]
        return out

    def text_forward(self, input_ids, labels, position_ids, seq_ids, image_pixels, image_slots, image_keys=None):
        """L_text over packed rows; image slots take W_in(E_v(crop)) resampled to the slot count."""
        return self._text_and_series(input_ids, labels, position_ids, seq_ids, image_pixels, image_slots, image_keys)[0]

    def _text_and_series(
        self, input_ids, labels, position_ids, seq_ids, image_pixels, image_slots, image_keys=None, series=None
    ):
        """(L_text, the forecasting loss dict or None). ``series``: (slots ``[K, 3]``, contexts ``[K, C, T]``,
        tails ``[K, C, H]``) — each series' encoder tokens fill its slots (resampled to the slot count like an
        image's features), and the forecaster reads Φ's hidden states at those slots."""
        embeds = self._embeds(input_ids, image_pixels, image_slots, image_keys)
        enc = None
        if series is not None and series[0].shape[0]:
            slots, context, _ = series
            enc = self.series.encoder(context.to(embeds.device))
            for k, (row, start, length) in enumerate(slots.tolist()):
                f = F.adaptive_avg_pool1d(enc.tokens[k].T.unsqueeze(0), length)[0].T
                embeds[row, start : start + length] = f.to(embeds.dtype)
        hidden = self._backbone_hidden(embeds, block_causal_mask(seq_ids), position_ids)
        logits = self.backbone.get_output_embeddings()(hidden)
        l_text = text_loss(logits, labels)
        if series is None:
            return l_text, None
        if enc is None:  # the lane is on but this batch holds no series: a zero that keeps its parameters in the graph
            zero = sum(p.sum() for p in self.series.parameters()) * 0.0
            return l_text, {"loss": zero, "n": torch.zeros(())}
        return l_text, self.series.loss(enc, hidden, series[0], series[2].to(hidden.device))

    def _embeds(self, input_ids, image_pixels, image_slots, image_keys=None):
        """Φ's input embeddings with each image's W_in(E_v) features at its slots ``[K, 3]`` (row, start, length)."""
        if int(input_ids.max()) >= self.vocab_size:
            raise ValueError(
                f"token id {int(input_ids.max())} ≥ backbone vocab {self.vocab_size}: "
                "the shards were tokenised with a different tokenizer than the backbone's"
            )
        embeds = self.backbone.get_input_embeddings()(input_ids)
        if self.lockstep:
            return self._place_images_lockstep(embeds, image_pixels, image_slots)
        if image_slots.shape[0]:
            feats = self.encode(image_pixels, image_keys)  # [K, N, D_v]
            for k, (row, start, length) in enumerate(image_slots.tolist()):
                # The corpus budgets n_tokens per image; E_v gives N patches: resample the sequence to the budget.
                f = F.adaptive_avg_pool1d(feats[k].T.unsqueeze(0), length)[0].T
                embeds[row, start : start + length] = self.w_in(f.to(embeds.dtype))
        return embeds

    @torch.no_grad()
    def logits(self, input_ids, position_ids, seq_ids, image_pixels, image_slots):
        """Φ's next-token logits on packed rows with images at their slots (what ``text_forward`` scores)."""
        embeds = self._embeds(input_ids, image_pixels, image_slots)
        hidden = self._backbone_hidden(embeds, block_causal_mask(seq_ids), position_ids)
        return self.backbone.get_output_embeddings()(hidden)

    def _place_images_lockstep(
        self, embeds: torch.Tensor, image_pixels: torch.Tensor, image_slots: torch.Tensor
    ) -> torch.Tensor:
        """The image slots of ``text_forward`` with exactly one E_v call and one W_in call, images or not.

        Without images a blank crop goes through both; its projection joins ``embeds`` times zero, so it adds
        nothing to the loss or any gradient yet sits where real slots sit in the graph (the backward, which ZeRO-3
        also gathers parameters for, then visits the same modules in the same order on every rank)."""
        slots = image_slots.tolist()
        pixels = image_pixels if slots else image_pixels.new_zeros(1, *image_pixels.shape[1:])
        feats = self.encode(pixels)  # [K, N, D_v]
        parts = [F.adaptive_avg_pool1d(feats[k].T.unsqueeze(0), n)[0].T for k, (_, _, n) in enumerate(slots)]
        proj = self.w_in(torch.cat(parts or [feats[0]]).to(embeds.dtype))
        if not slots:
            return embeds + proj.sum() * 0.0
        offset = 0
        for row, start, length in slots:
            embeds[row, start : start + length] = proj[offset : offset + length]
            offset += length
        return embeds

    def visual_forward(self, page_pixels: torch.Tensor, page_mask: torch.Tensor, page_keys: list[str] | None = None):
        """L_VP: û_{t+1} = ψ(Φ(W_in u_{≤t})_t) against u_{t+1}, over all M positions of the batch (Eq 6–8)."""
        real = page_pixels.shape[0] > 0
        if not real and self.lockstep:
            # A blank dummy page whose first two patches count as kept: one position runs through W_in, Φ and ψ,
            # none is scored (has_next is all False below), so info_nce sees M = 0 and returns a graph-bound zero.
            page_pixels = page_pixels.new_zeros(1, *page_pixels.shape[1:])
            page_mask = torch.zeros(1, page_mask.shape[1], dtype=torch.bool)
            page_mask[0, :2] = True
        elif not real:
            device = self.w_in.weight.device
            zero = self.w_in.weight.sum() * 0.0 + self.psi[0].weight.sum() * 0.0
            loss, acc = info_nce(
                torch.zeros(0, 1, device=device),
                torch.zeros(0, 1, device=device),
                self.objective.tau,
                self.objective.gather,
            )
            return zero + loss, acc, torch.tensor(0)
        z = self.encode(page_pixels, page_keys)  # [P, N, D_v]
        seqs = [raster(z[p], page_mask[p]) for p in range(z.shape[0])]
        lengths = torch.tensor([s.shape[0] for s in seqs])
        longest = int(lengths.max())
        u = z.new_zeros(len(seqs), longest, z.shape[-1])
        for p, s in enumerate(seqs):
            u[p, : s.shape[0]] = s
        valid = torch.arange(longest)[None, :] < lengths[:, None]  # [P, L]
        seq_ids = valid.long()  # one sample per row; 0 marks padding
        pos = torch.arange(longest).expand(len(seqs), -1)
        hidden = self._backbone_hidden(self.w_in(u.to(self.w_in.weight.dtype)), block_causal_mask(seq_ids), pos)
        # Position t predicts patch t+1: both must be real patches of the page.
        has_next = valid[:, 1:] & real
        pred = self.psi(hidden[:, :-1][has_next])
        target = u[:, 1:][has_next]
        loss, acc = info_nce(pred, target, self.objective.tau, self.objective.gather)
        return loss, acc, torch.tensor(int(has_next.sum()))

    def _backbone_hidden(self, embeds: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        decoder = self.backbone.get_decoder()
        out = decoder(inputs_embeds=embeds, attention_mask=mask, position_ids=position_ids, use_cache=False)
        return out.last_hidden_state


class SeriesLane(nn.Module):
    """The time-series encoder (tokens projected into Φ's embedding space, width ``d_model``) and the forecaster
    (``pretrain/timeseries``) as one trainable part of the pre-training model."""

    def __init__(self, cfg: SeriesLaneConfig, d_model: int) -> None:
        import dataclasses

        from pretrain.timeseries.config import TimeseriesConfig
        from pretrain.timeseries.encoder import SeriesEncoder
        from pretrain.timeseries.forecaster import Forecaster

        super().__init__()
        ts = TimeseriesConfig(encoder=dataclasses.replace(cfg.encoder, llm_dim=d_model), forecaster=cfg.forecaster)
        self.encoder = SeriesEncoder(ts.encoder)
        self.forecaster = Forecaster(ts)

    def loss(self, enc, hidden: torch.Tensor, slots: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        """Forecasting loss on the held-out tails; the text Q-Former reads Φ's hidden states at each series' slots
        (causal: they have seen the series' context text and its tokens, never the tail)."""
        from pretrain.timeseries.forecaster import forecast_loss

        longest = int(slots[:, 2].max())
        states = hidden.new_zeros(slots.shape[0], longest, hidden.shape[-1])
        mask = torch.zeros(slots.shape[0], longest, dtype=torch.bool, device=hidden.device)
        for k, (row, start, length) in enumerate(slots.tolist()):
            states[k, :length] = hidden[row, start : start + length]
            mask[k, :length] = True
        return forecast_loss(self.forecaster, enc, target, states.float(), mask)


def block_causal_mask(seq_ids: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` sample ids (0 = padding) → ``[B, 1, T, T]`` bool, True = may attend.

    Causal within a sample, nothing across samples. Padding attends to itself only so no softmax row is empty.
    """
    t = seq_ids.shape[1]
    causal = torch.tril(torch.ones(t, t, dtype=torch.bool, device=seq_ids.device))
    same = seq_ids[:, :, None] == seq_ids[:, None, :]
    real = (seq_ids > 0)[:, :, None]
    eye = torch.eye(t, dtype=torch.bool, device=seq_ids.device)
    return ((causal & same & real) | eye)[:, None]


def _accepts(module: nn.Module, name: str) -> bool:
    import inspect

    return name in inspect.signature(module.forward).parameters


def load_encoder(name: str) -> nn.Module:
    """The frozen vision tower E_v by name or path, fp32: a multimodal checkpoint (CLIP, SigLIP) holds it under
    ``vision_config``, and only that tower is loaded."""
    from transformers import AutoConfig, AutoModel

    enc_cfg = AutoConfig.from_pretrained(name)
    if hasattr(enc_cfg, "vision_config") and not hasattr(enc_cfg, "patch_size"):
        from transformers import CLIPVisionModel, SiglipVisionModel

        tower = SiglipVisionModel if "siglip" in enc_cfg.model_type else CLIPVisionModel
        return tower.from_pretrained(name, dtype=torch.float32)
    return AutoModel.from_pretrained(name, dtype=torch.float32)


def _pixel_stats(path: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """image_mean/std from a local ``preprocessor_config.json`` when present, else CLIP's."""
    cfg_path = Path(path) / "preprocessor_config.json"
    if cfg_path.exists():
        pre = json.loads(cfg_path.read_text())
        return tuple(pre.get("image_mean", CLIP_MEAN)), tuple(pre.get("image_std", CLIP_STD))
    return CLIP_MEAN, CLIP_STD


def n_patches(page_size: tuple[int, int], patch: int) -> int:
    return math.prod(s // patch for s in page_size)
