"""The one tiny-model writer: ``scifolio models tiny DIR``.

Nothing here is downloaded. Each area's ``tiny.py`` only *describes* its models (``tiny_models(kit)``: name →
(subdir, builder from configs)); this module seeds, builds and saves them with ``save_pretrained``, so every
model loads through the same ``from_pretrained(path)`` code a real hub checkpoint goes through. The corpus
tokenizer is a byte-level BPE trained locally on a built-in scientific sample (every byte sequence tokenises).

    scifolio models tiny tiny/
    python -c "from pipelines.tiny import write_area; print(write_area('tiny', 'retrieval'))"
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

CORPUS_SPECIALS = ("<|endoftext|>", "<|pad|>", "<|image|>")

_CORPUS = """
Abstract. We report the synthesis and characterisation of a layered perovskite oxide whose band gap
is tuned by strain. X-ray diffraction (Figure 1) shows the expected reflections; Table 2 lists the
refined lattice parameters a = 3.905 Å and c = 12.48 Å. The free energy follows
ΔG = ΔH − TΔS, and the rate constant obeys k = A exp(−E_a / RT) with E_a = 54.2 kJ mol⁻¹.
Introduction. Protein folding, gene expression and cell signalling are studied with microscopy,
sequencing and mass spectrometry. The enhancer binds the promoter; transcription factors regulate
expression of downstream genes. Results are mean ± s.d. of n = 3 biological replicates (p < 0.05).
Methods. Samples were annealed at 450 °C for 2 h under argon, then cooled at 5 K/min. Spectra were
recorded between 200 and 800 nm. The model minimises the loss L = −Σ log p(y | x) with AdamW.
Theorem 1. Let f: ℝⁿ → ℝ be convex and differentiable. Then f(y) ≥ f(x) + ∇f(x)ᵀ(y − x) for all x, y.
Proof. Follows from the definition of convexity; see Eq. (3) and the references therein [12, 13].
Discussion. The catalyst retains 92% of its activity after 10 cycles, outperforming Pt/C in acidic media.
Geology: the sandstone reservoir has porosity 18% and permeability 120 mD at 2,400 m depth.
"""


def bpe_tokenizer(
    specials: Sequence[str] = CORPUS_SPECIALS,
    vocab_size: int = 1024,
    lines: Sequence[str] | None = None,
    pad: str | None = "<|pad|>",
) -> Any:
    """A byte-level BPE tokenizer (every byte sequence encodes) trained on ``lines`` (default: the built-in
    scientific sample), ``specials`` kept whole; the first special is bos/eos."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = lines if lines is not None else [line for line in _CORPUS.splitlines() if line.strip()] * 4
    tok.train_from_iterator(corpus, trainer=trainer)
    eos = specials[0]
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=eos, bos_token=eos, pad_token=pad if pad in specials else eos
    )


def write_tiny_tokenizer(out_dir: Path, vocab_size: int = 1024) -> Path:
    """The corpus job's tiny tokenizer (byte-level BPE), saved loadable by ``AutoTokenizer``."""
    out_dir = Path(out_dir)
    bpe_tokenizer(vocab_size=vocab_size).save_pretrained(out_dir)
    return out_dir


class TinyKit:
    """What the areas' tiny-model builders are handed (they never import this module): the byte-level BPE
    trainer and the corpus tokenizer, so an LM can share the vocabulary the shards were tokenised with."""

    def __init__(self, tokenizer: str | Path | None = None) -> None:
        self._tokenizer = tokenizer

    def bpe(self, specials: Sequence[str], vocab_size: int = 512, lines: Sequence[str] | None = None) -> Any:
        return bpe_tokenizer(specials, vocab_size, lines, pad=None)

    @property
    def tokenizer(self) -> Any:
        """The corpus tokenizer (loaded from the path given, else trained now)."""
        from transformers import AutoTokenizer

        if self._tokenizer is None:
            return bpe_tokenizer()
        return AutoTokenizer.from_pretrained(str(self._tokenizer))


Builder = Callable[[], Sequence[Any]]
"""Returns the objects to save into one directory (each has ``save_pretrained``), model first."""


def write_models(out_dir: Path, models: Mapping[str, tuple[str, Builder]], seed: int = 0) -> dict[str, str]:
    """The one tiny-model writer: for each ``name → (subdir, build)``, seed torch (``seed`` + position, so each
    model's random weights are reproducible and distinct), build from configs, and ``save_pretrained`` every
    object into ``out_dir/subdir``. Returns name → directory."""
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar per tiny shard is noise
    written = {}
    for i, (name, (subdir, build)) in enumerate(models.items()):
        torch.manual_seed(seed + i)
        path = Path(out_dir) / subdir
        path.mkdir(parents=True, exist_ok=True)
        for obj in build():
            obj.save_pretrained(path)
        written[name] = str(path)
    return written


def write_area(out_dir: Path, area: str, tokenizer: str | Path | None = None) -> dict[str, str]:
    """Write one area's tiny models (``visual_gain``, ``retrieval``, ``pretrain``, ``posttrain``): each area's
    ``tiny.tiny_models(kit)`` describes them, this module writes them."""
    import importlib

    return write_models(out_dir, importlib.import_module(f"{area}.tiny").tiny_models(TinyKit(tokenizer)))


AREAS = ("visual_gain", "retrieval", "pretrain", "posttrain")


def write_all(out_dir: Path) -> dict[str, str]:
    """``scifolio models tiny DIR``: the corpus tokenizer, then every area's models (the pre-training LM and the
    RL policies share that tokenizer's vocabulary)."""
    tokenizer = write_tiny_tokenizer(Path(out_dir) / "tokenizer")
    written = {"tokenizer": str(tokenizer)}
    for area in AREAS:
        written.update(write_area(out_dir, area, tokenizer))
    return written
