"""Small offline stand-ins for smoke runs: ``scifolio models tiny DIR``.

Nothing here is downloaded. The tokenizer is a byte-level BPE trained locally on a built-in scientific
text sample (so every byte sequence tokenises), saved in the Hugging Face format so the same
``AutoTokenizer.from_pretrained(path)`` code that loads a real hub tokenizer loads it.
"""

from __future__ import annotations

from pathlib import Path

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


def write_tiny_tokenizer(out_dir: Path, vocab_size: int = 1024) -> Path:
    """Train a byte-level BPE on the built-in sample and save it loadable by ``AutoTokenizer``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|pad|>", "<|image|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([line for line in _CORPUS.splitlines() if line.strip()] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|pad|>", bos_token="<|endoftext|>"
    )
    fast.save_pretrained(out_dir)
    return out_dir
