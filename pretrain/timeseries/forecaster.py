"""The forecaster (SPEC C10): condition = concat(Q-Former over the LLM's hidden states, Q-Former over the series
tokens), fixed size whatever the prompt length; a causal Transformer emits ``out_patch`` values per step with a
value head (point + quantiles), de-normalised with (σ, μ). Exactly H values for any H.

    model = SeriesForecastModel(debug())
    fc = model.forecast([np.array([...])], horizon=6)          # fc.point [1, 1, 6], fc.quantiles [1, 1, 6, 9]
    fc = model.forecast([x], instruction="predict the next two seconds", sampling_rate_hz=50)

The model works in each channel's normalised space: the encoder z-scores every channel and the head's output is
mapped back with y = μ + σ·ŷ, so forecast(a·x + b) = a·forecast(x) + b for a > 0 by construction (tested).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pretrain.timeseries.config import TimeseriesConfig
from pretrain.timeseries.encoder import Z_CLAMP, EncoderOutput, QFormer, SeriesEncoder, patch_length, sinusoid
from pretrain.timeseries.horizon import predict_horizon

# Steps the decoder attends back over while generating: bounds the cost of very long horizons (linear in H).
DECODE_WINDOW = 64


def pinball(pred: torch.Tensor, target: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """Quantile (pinball) loss, elementwise: ``pred [..., K]``, ``target [...]``, ``levels [K]`` → ``[..., K]``."""
    diff = target[..., None] - pred
    return torch.maximum(levels * diff, (levels - 1) * diff)


@dataclass
class Forecast:
    """De-normalised forecasts: ``point [B, C, H]``, ``quantiles [B, C, H, K]`` (float64 numpy)."""

    point: np.ndarray
    quantiles: np.ndarray
    levels: tuple[float, ...]


class TextStandIn(nn.Module):
    """Byte embeddings of the instruction: the lane-alone stand-in for an LLM's hidden states (``scifolio
    pretrain`` hands the real hidden states to the text Q-Former instead)."""

    def __init__(self, dim: int, max_bytes: int) -> None:
        super().__init__()
        self.max_bytes = max_bytes
        self.emb = nn.Embedding(257, dim)  # 256 = padding

    def forward(self, texts: Sequence[str], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.full((len(texts), self.max_bytes), 256, dtype=torch.long)
        for i, t in enumerate(texts):
            b = t.encode("utf-8")[: self.max_bytes]
            ids[i, : len(b)] = torch.tensor(list(b), dtype=torch.long)
        ids = ids.to(device)
        return self.emb(ids), ids != 256


class Forecaster(nn.Module):
    def __init__(self, cfg: TimeseriesConfig) -> None:
        super().__init__()
        fc, ec = cfg.forecaster, cfg.encoder
        d = fc.d_model
        self.cfg = fc
        self.text_q = QFormer(fc.text_queries, ec.llm_dim, d, fc.heads)
        # The series Q-Former reads the pooled tokens and the forecast channel's own tokens (projected to llm_dim).
        self.channel_proj = nn.Linear(ec.d_model, ec.llm_dim)
        self.series_q = QFormer(fc.series_queries, ec.llm_dim, d, fc.heads)
        self.step_in = nn.Linear(2 * fc.out_patch, d)
        layer = nn.TransformerEncoderLayer(
            d, fc.heads, 4 * d, 0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.decoder = nn.TransformerEncoder(layer, fc.layers, enable_nested_tensor=False)
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, fc.out_patch * (1 + len(fc.quantiles)))
        self.register_buffer("levels", torch.tensor(fc.quantiles), persistent=False)

    def condition(
        self, enc: EncoderOutput, text_states: torch.Tensor | None, text_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Fixed-size condition per (series, channel): ``[B·C, text_queries + series_queries, d]``."""
        b, c, n, _ = enc.channel_tokens.shape
        tokens = enc.tokens[:, None].expand(b, c, n, -1)
        states = torch.cat([tokens, self.channel_proj(enc.channel_tokens)], dim=2).reshape(b * c, 2 * n, -1)
        mask = enc.token_mask[:, None].expand(b, c, n)
        mask = torch.cat([mask, mask], dim=2).reshape(b * c, 2 * n)
        if text_states is None:  # no instruction: the text Q-Former sees only its null state
            text_states = enc.tokens.new_zeros(b, 1, enc.tokens.shape[-1])
            text_mask = torch.zeros(b, 1, dtype=torch.bool, device=enc.tokens.device)
        t = self.text_q(text_states, text_mask)  # [B, Kt, d]
        t = t[:, None].expand(b, c, *t.shape[1:]).reshape(b * c, *t.shape[1:])
        return torch.cat([t, self.series_q(states, mask)], dim=1)

    def decode(self, cond: torch.Tensor, steps_in: torch.Tensor, first_pos: int = 0) -> torch.Tensor:
        """Causal pass: ``cond [N, K, d]``, ``steps_in [N, S, 2·out_patch]`` (values, observed flags) →
        ``[N, S, out_patch, 1 + n_quantiles]`` in normalised units. Condition tokens see each other; step s sees
        the condition and steps ≤ s."""
        k, s = cond.shape[1], steps_in.shape[1]
        pos = sinusoid(torch.arange(first_pos, first_pos + s, device=cond.device), cond.shape[-1])
        h = torch.cat([cond, self.step_in(steps_in) + pos], dim=1)
        mask = torch.zeros(k + s, k + s, dtype=torch.bool, device=cond.device)
        mask[:k, k:] = True  # the condition never reads the steps
        mask[k:, k:] = torch.triu(torch.ones(s, s, dtype=torch.bool, device=cond.device), diagonal=1)
        out = self.head(self.ln(self.decoder(h, mask=mask)[:, k:]))
        return out.reshape(out.shape[0], s, self.cfg.out_patch, -1)


class SeriesForecastModel(nn.Module):
    """Encoder + forecaster + the instruction stand-in; ``loss`` for training, ``forecast`` for inference."""

    def __init__(self, cfg: TimeseriesConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = SeriesEncoder(cfg.encoder)
        self.forecaster = Forecaster(cfg)
        self.text = TextStandIn(cfg.encoder.llm_dim, cfg.forecaster.text_bytes)

    # -- shared pieces ----------------------------------------------------------------------------------------------

    def _first_step(self, enc: EncoderOutput) -> torch.Tensor:
        return first_step(enc, self.cfg.forecaster.out_patch)

    def _text(self, texts: Sequence[str] | None, device: torch.device):
        if texts is None:
            return None, None
        return self.text(list(texts), device)

    # -- training ---------------------------------------------------------------------------------------------------

    def loss(
        self, context: torch.Tensor, target: torch.Tensor, texts: Sequence[str] | None = None
    ) -> dict[str, torch.Tensor]:
        """Teacher-forced loss on normalised targets. ``context [B, C, T]`` and ``target [B, C, H]`` with NaN where
        missing (a window near a series' end has fewer targets). Point: L1; quantiles: pinball."""
        enc = self.encoder(context)
        ts, tm = self._text(texts, context.device)
        return forecast_loss(self.forecaster, enc, target, ts, tm)

    # -- inference --------------------------------------------------------------------------------------------------

    @torch.no_grad()
    def forecast(
        self,
        series: Sequence[np.ndarray],
        horizon: int | None = None,
        instruction: str | None = None,
        sampling_rate_hz: float | None = None,
        sampling_period_s: float | None = None,
        freq_unit: str | None = None,
    ) -> Forecast:
        """Forecast every channel of every series: each item is ``[T]`` or ``[C, T]`` (NaN = missing; lengths and
        channel counts may differ). ``horizon`` or an ``instruction`` the horizon predictor reads."""
        if horizon is None:
            if instruction is None:
                raise ValueError("give a horizon or an instruction")
            horizon = predict_horizon(instruction, sampling_rate_hz, sampling_period_s, freq_unit)
            if horizon is None:
                raise ValueError(f"no horizon found in {instruction!r}")
        if horizon < 1:
            raise ValueError(f"horizon must be ≥ 1, got {horizon}")
        self.eval()
        x = pad_batch(series)
        enc = self.encoder(x)
        fc = self.forecaster
        p = self.cfg.forecaster.out_patch
        b, c = x.shape[:2]
        texts = [instruction] * b if instruction else None
        ts, tm = self._text(texts, x.device)
        cond = fc.condition(enc, ts, tm)
        steps_in = self._first_step(enc)
        outs = []
        for _ in range(-(-horizon // p)):
            start = max(0, steps_in.shape[1] - DECODE_WINDOW)
            o = fc.decode(cond, steps_in[:, start:], first_pos=start)[:, -1]  # [B·C, p, 1+K]
            outs.append(o)
            nxt = torch.cat([o[..., 0], torch.ones_like(o[..., 0])], dim=-1)
            steps_in = torch.cat([steps_in, nxt[:, None]], dim=1)
        out = torch.cat(outs, dim=1)[:, :horizon].double().reshape(b, c, horizon, -1)
        mu, sigma = enc.mu[..., None, None], enc.sigma[..., None, None]
        y = (mu + sigma * out).numpy()
        quant = np.sort(y[..., 1:], axis=-1)  # independent heads may cross; sorting keeps them monotone
        return Forecast(point=y[..., 0], quantiles=quant, levels=self.cfg.forecaster.quantiles)


def first_step(enc: EncoderOutput, p: int) -> torch.Tensor:
    """The decoder's first input: each channel's last ``p`` (= ``out_patch``) normalised values and their flags."""
    z = F.pad(enc.z_last, (p, 0))[..., -p:]
    v = F.pad(enc.valid.float(), (p, 0))[..., -p:]
    b, c = z.shape[:2]
    return torch.cat([z, v], dim=-1).reshape(b * c, 1, 2 * p)


def forecast_loss(
    fc: Forecaster,
    enc: EncoderOutput,
    target: torch.Tensor,
    text_states: torch.Tensor | None = None,
    text_mask: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Teacher-forced forecasting loss of encoded series against ``target [B, C, H]`` (NaN where missing), in each
    channel's normalised units: point L1 + mean pinball over the quantile levels, averaged over the observed target
    values (``n``: how many; 0 gives a zero loss that still belongs to the graph). ``text_states [B, S, llm_dim]``:
    what the text Q-Former reads (the lane alone: instruction bytes; ``scifolio pretrain``: the LLM's hidden
    states over the series' positions)."""
    p = fc.cfg.out_patch
    b, c, h = target.shape
    s = -(-h // p)
    tgt = F.pad(target, (0, s * p - h), value=float("nan"))
    tvalid = torch.isfinite(tgt)
    zt = ((tgt.double() - enc.mu[..., None]) / enc.sigma[..., None]).float()
    zt = torch.where(tvalid, zt.clamp(-Z_CLAMP, Z_CLAMP), torch.zeros_like(zt))
    zt, tvalid = zt.reshape(b * c, s, p), tvalid.reshape(b * c, s, p)
    steps_in = torch.cat([first_step(enc, p), torch.cat([zt, tvalid.float()], dim=-1)[:, :-1]], dim=1)
    out = fc.decode(fc.condition(enc, text_states, text_mask), steps_in)
    w = (tvalid & enc.channel_mask.reshape(b * c, 1, 1)).float()
    n = w.sum().clamp(min=1)
    point = ((out[..., 0] - zt).abs() * w).sum() / n
    quant = (pinball(out[..., 1:], zt, fc.levels).mean(-1) * w).sum() / n
    return {"loss": point + quant, "point": point.detach(), "quantile": quant.detach(), "n": w.sum().detach()}


def forecast_many(
    model: SeriesForecastModel, series: Sequence[np.ndarray], horizon: int, max_points: int = 1 << 22, **kwargs
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``model.forecast`` over many series in batches of one patch length whose padded size stays under
    ``max_points`` (a 10⁷-point series is never padded together with short ones); returns (point ``[C, H]``,
    quantiles ``[C, H, K]``) per series, in input order, each equal to forecasting that series alone."""
    arrs = [np.atleast_2d(np.asarray(s, dtype=np.float64)) for s in series]
    ec = model.cfg.encoder

    def patch(i: int) -> int:
        return patch_length(max(1, arrs[i].shape[1]), ec.budget, ec.queries)

    # Same patch length L in a batch (L follows the batch's longest series): then padding only adds masked tokens
    # and a series' forecast does not depend on what it was batched with.
    order = sorted(range(len(arrs)), key=lambda i: (patch(i), arrs[i].shape[1]))
    c_max = max((a.shape[0] for a in arrs), default=1)
    out: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(arrs)
    i = 0
    while i < len(order):
        j = i + 1
        while (
            j < len(order)
            and patch(order[j]) == patch(order[i])
            and (j + 1 - i) * max(1, arrs[order[j]].shape[1]) * c_max <= max_points
        ):
            j += 1
        idx = order[i:j]
        fc = model.forecast([arrs[k] for k in idx], horizon=horizon, **kwargs)
        for n, k in enumerate(idx):
            c = arrs[k].shape[0]
            out[k] = (fc.point[n, :c], fc.quantiles[n, :c])
        i = j
    return out  # type: ignore[return-value]


def pad_batch(series: Sequence[np.ndarray]) -> torch.Tensor:
    """Ragged series → ``[B, C_max, T_max]`` float64, left-padded with NaN (aligned at the end), missing channels
    NaN (the encoder masks them)."""
    arrs = [np.atleast_2d(np.asarray(s, dtype=np.float64)) for s in series]
    c = max(a.shape[0] for a in arrs)
    t = max(max(a.shape[1] for a in arrs), 1)
    x = np.full((len(arrs), c, t), np.nan)
    for i, a in enumerate(arrs):
        if a.shape[1]:
            x[i, : a.shape[0], t - a.shape[1] :] = a
    return torch.from_numpy(x)
