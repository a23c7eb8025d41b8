"""Two-pass visual-gain scorer with the load/run_batch shape of Beam's ``ModelHandler``.

For each page (``Page.content()`` defines its text and visuals) two rows are built from the same text
token ids: text-only, and text with every crop's image tokens at its reading-order position. Only
text positions are scored (image tokens never enter the NLL) and the scored ids of the two rows are
checked to be identical. All rows of a batch of pages, both passes mixed, are sorted by length and run
in as few padded forward calls as the row/token budget allows. Long pages are scored in windows of
``max_text_tokens`` text tokens (each window carries the images that fall inside it); windows without
images, and pages without visuals, reuse the text pass instead of running the model twice.

    scorer = VisualGainScorer(VisualGainConfig(model="Qwen/Qwen2-VL-2B-Instruct"))
    model = scorer.load()
    pages = scorer.run_batch(pages, model)   # VisualGainScore.of(page).delta_h_nats, ...
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from formats.records import Page
from formats.scores import VisualGainScore

from .adapters import ImageInput, VLMAdapter, adapter_for
from .perplexity import VisualGain


@dataclass(frozen=True)
class VisualGainConfig:
    """How the visual-gain scorer loads and batches its model."""

    model: str
    """Hugging Face model id or local directory (Qwen2-VL / Qwen2.5-VL / LLaVA families)."""
    batch_size: int = 8
    """Maximum rows per forward call (text-only and interleaved rows of different pages share calls); the corpus
    job also hands documents to the scorer in Beam batches of up to this many pages."""
    max_batch_tokens: int = 16384
    """Maximum padded tokens (rows × longest row) per forward call; bounds activation memory."""
    max_text_tokens: int = 2048
    """Text tokens per scoring window; longer pages are scored in several windows, never truncated."""
    max_image_pixels: int | None = None
    """Pixel cap per crop for dynamic-resolution families (Qwen); None keeps the processor's default."""
    dtype: str = "auto"
    """"auto" (bf16 on a GPU that supports it, else float32), "float32", "bfloat16" or "float16"."""
    device: str = "auto"
    """"auto" (cuda when available, else cpu) or a torch device string."""
    local_files_only: bool = False
    """Never contact the hub (set for offline workers with pre-staged models)."""
    text_separator: str = "\n\n"
    """Put between consecutive text blocks of a page before tokenising."""
    lm_head_chunk: int = 4096
    """Scored positions projected to the vocabulary at a time (full logits of a batch never exist)."""


@dataclass
class LoadedVLM:
    """What ``load()`` returns and ``run_batch`` consumes: model, tokenizer and family adapter."""

    model: Any
    tokenizer: Any
    adapter: VLMAdapter
    device: Any
    start_id: int  # a fixed first token so the first text token is scored in both passes
    pad_id: int
    name: str


@dataclass(frozen=True)
class ScoringRow:
    """One model input row: a window of one page, text-only or interleaved."""

    page: int
    window: int
    interleaved: bool
    input_ids: tuple[int, ...]
    scored: tuple[int, ...]  # positions whose token is a text token of the page (predicted from pos - 1)
    images: tuple[ImageInput, ...] = field(default=(), repr=False)

    @property
    def target_ids(self) -> tuple[int, ...]:
        return tuple(self.input_ids[p] for p in self.scored)


@dataclass(frozen=True)
class PageRows:
    """The rows of one page plus what aggregation needs."""

    rows: tuple[ScoringRow, ...]
    n_text_tokens: int
    n_images: int
    n_windows: int


def resolve_dtype(name: str, device: Any) -> Any:
    import torch

    if name == "auto":
        if getattr(device, "type", str(device)) == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32  # CPU bf16 is slow on most CPUs and costs precision for nothing
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def build_page_rows(
    page_pos: int,
    page: Page,
    tokenize: Callable[[str], list[int]],
    encode_image: Callable[[bytes], ImageInput],
    start_id: int,
    max_text_tokens: int,
    separator: str = "\n\n",
    reserved_ids: frozenset[int] = frozenset(),
) -> PageRows:
    """Rows for one page: per window a text-only row and, when the window holds images, an interleaved row."""
    if max_text_tokens < 1:
        raise ValueError("max_text_tokens must be ≥ 1")
    text_ids: list[int] = []
    image_at: list[tuple[int, bytes]] = []  # (number of text tokens before the image, png)
    for kind, block in page.content():
        if kind == "image":
            assert block.crop is not None  # content() only yields image items that have a crop
            image_at.append((len(text_ids), block.crop.png))
        else:
            ids = tokenize((separator if text_ids else "") + block.text)
            if reserved_ids.intersection(ids):
                # page text that spells an image marker would be scored as text in one pass only
                raise ValueError(f"page {page.page_id}: text tokenises to image-marker ids")
            text_ids.extend(ids)
    n = len(text_ids)
    if n == 0:
        return PageRows((), 0, len(image_at), 0)
    n_windows = math.ceil(n / max_text_tokens)
    encoded: dict[bytes, ImageInput] = {}
    rows: list[ScoringRow] = []
    for w in range(n_windows):
        lo, hi = w * max_text_tokens, min((w + 1) * max_text_tokens, n)
        text_row = ScoringRow(page_pos, w, False, (start_id, *text_ids[lo:hi]), tuple(range(1, hi - lo + 1)))
        rows.append(text_row)
        # an image belongs to the window of the text token it precedes; trailing images to the last window
        mine = [(k, png) for k, png in image_at if min(k // max_text_tokens, n_windows - 1) == w]
        if not mine:
            continue
        ids: list[int] = [start_id]
        scored: list[int] = []
        images: list[ImageInput] = []
        pending = list(mine)
        for j in range(lo, hi + 1):
            while pending and (pending[0][0] <= j if j < hi else True):
                png = pending.pop(0)[1]
                if png not in encoded:
                    encoded[png] = encode_image(png)
                images.append(encoded[png])
                ids.extend(encoded[png].placeholder_ids)
            if j < hi:
                scored.append(len(ids))
                ids.append(text_ids[j])
        inter = ScoringRow(page_pos, w, True, tuple(ids), tuple(scored), tuple(images))
        if inter.target_ids != text_row.target_ids:
            raise RuntimeError(f"page {page.page_id} window {w}: the two passes would score different tokens")
        rows.append(inter)
    return PageRows(tuple(rows), n, len(image_at), n_windows)


def plan_batches(rows: Sequence[ScoringRow], batch_size: int, max_batch_tokens: int) -> list[list[int]]:
    """Row indices grouped into forward calls: sorted by length so a call pads little."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i].input_ids))
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        longest = len(rows[i].input_ids)  # sorted ascending: the newcomer is the longest
        if cur and (len(cur) >= batch_size or longest * (len(cur) + 1) > max_batch_tokens):
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


class VisualGainScorer:
    """``load() -> LoadedVLM``; ``run_batch(pages, model) -> pages`` carrying a ``VisualGainScore``."""

    def __init__(self, config: VisualGainConfig) -> None:
        self.config = config

    def load(self) -> LoadedVLM:
        import torch
        from transformers import AutoConfig, AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

        cfg = self.config
        device = torch.device(cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = resolve_dtype(cfg.dtype, device)
        lfo = cfg.local_files_only
        hf_config = AutoConfig.from_pretrained(cfg.model, local_files_only=lfo)
        image_processor = AutoImageProcessor.from_pretrained(cfg.model, local_files_only=lfo)
        adapter = adapter_for(hf_config, image_processor, cfg.max_image_pixels)
        tokenizer = AutoTokenizer.from_pretrained(cfg.model, local_files_only=lfo)
        model = AutoModelForImageTextToText.from_pretrained(cfg.model, dtype=dtype, local_files_only=lfo)
        model.to(device).eval()
        start_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        if start_id is None:
            raise ValueError(f"{cfg.model}: tokenizer has neither a BOS nor an EOS token to start rows with")
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else start_id
        return LoadedVLM(model, tokenizer, adapter, device, int(start_id), int(pad_id), cfg.model)

    # -- rows ------------------------------------------------------------------------------------
    def page_rows(self, pages: Sequence[Page], model: LoadedVLM) -> list[PageRows]:
        tok = model.tokenizer

        def tokenize(text: str) -> list[int]:
            # a PDF that literally contains "<|image_pad|>" must stay text, not become an image marker
            return list(tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])

        return [
            build_page_rows(
                i,
                p,
                tokenize,
                model.adapter.encode_image,
                model.start_id,
                self.config.max_text_tokens,
                self.config.text_separator,
                model.adapter.image_token_ids,
            )
            for i, p in enumerate(pages)
        ]

    def forward_rows(self, rows: Sequence[ScoringRow], model: LoadedVLM) -> list[list[float]]:
        """Per-row NLLs (nats) of the scored positions, in the rows' order."""
        import torch

        out: list[list[float]] = [[] for _ in rows]
        lm_head = model.model.get_output_embeddings()
        with torch.inference_mode():
            for batch in plan_batches(rows, self.config.batch_size, self.config.max_batch_tokens):
                brows = [rows[i] for i in batch]
                width = max(len(r.input_ids) for r in brows)
                # right padding: causal attention means real tokens never see the pads, and every row's
                # positions start at 0, so a row scores the same alone or in any batch
                ids = torch.full((len(brows), width), model.pad_id, dtype=torch.long)
                mask = torch.zeros((len(brows), width), dtype=torch.long)
                for b, r in enumerate(brows):
                    ids[b, : len(r.input_ids)] = torch.tensor(r.input_ids)
                    mask[b, : len(r.input_ids)] = 1
                ids, mask = ids.to(model.device), mask.to(model.device)
                images = [im for r in brows for im in r.images]
                hidden = model.adapter.hidden_states(model.model, ids, mask, images)
                rb = torch.tensor([b for b, r in enumerate(brows) for _ in r.scored], device=model.device)
                rp = torch.tensor([p for r in brows for p in r.scored], device=model.device)
                targets = ids[rb, rp]
                h = hidden[rb, rp - 1]
                nll = torch.empty(len(rp), dtype=torch.float32, device=model.device)
                step = self.config.lm_head_chunk
                for s in range(0, len(rp), step):
                    logits = lm_head(h[s : s + step]).float()
                    nll[s : s + step] = torch.nn.functional.cross_entropy(
                        logits, targets[s : s + step], reduction="none"
                    )
                values = nll.cpu().tolist()
                k = 0
                for b, i in enumerate(batch):
                    n = len(brows[b].scored)
                    out[i] = values[k : k + n]
                    k += n
        return out

    # -- the stage -------------------------------------------------------------------------------
    def run_batch(self, pages: Sequence[Page], model: LoadedVLM) -> list[Page]:
        page_rows = self.page_rows(pages, model)
        rows = [r for pr in page_rows for r in pr.rows]
        nlls = self.forward_rows(rows, model)
        sums: list[dict[tuple[int, bool], float]] = [{} for _ in pages]
        for r, v in zip(rows, nlls):
            sums[r.page][(r.window, r.interleaved)] = math.fsum(v)
        return [
            self._page_score(pr, sums[i], model.name).on(page) for i, (page, pr) in enumerate(zip(pages, page_rows))
        ]

    @staticmethod
    def _page_score(pr: PageRows, sums: dict[tuple[int, bool], float], model: str) -> VisualGainScore:
        if pr.n_text_tokens == 0:
            # nothing to measure the visuals against: the gain is undefined, recorded as 0 with no PPL
            return VisualGainScore(0.0, 0.0, 0.0, 0, pr.n_images, model=model)
        text = math.fsum(sums[(w, False)] for w in range(pr.n_windows))
        # a window without images has the same input in both passes: its text NLL is its interleaved NLL
        inter = math.fsum(sums.get((w, True), sums[(w, False)]) for w in range(pr.n_windows))
        gain = VisualGain.from_sums(text, inter, pr.n_text_tokens, pr.n_images)
        return VisualGainScore.from_dict({**gain.to_dict(), "n_windows": pr.n_windows, "model": model})
