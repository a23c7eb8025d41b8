"""The synthetic experiment's data: general English-like text and a tiny "biology" domain, made by a generator.

The domain is a fixed table of facts (gene → binding factor, tissue, product). Question/answer pairs state those
facts through several templates; the held-out domain set asks about the same genes through (gene, template) pairs
never seen in training, so knowing the facts (what the datastore / memory holds) helps and a general-text base
cannot. General text comes from a small grammar; its held-out set is fresh sentences of the same grammar.

    python -c "from posttrain.memdec.synthetic import *; write_synthetic('out/memdec', SyntheticConfig())"
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from formats import fs

SPECIALS = ("[PAD]", "[UNK]", "[BOS]", "[EOS]")

NOUNS = "cat dog bird horse child farmer teacher river house garden road tree boat city market window door \
table letter song book storm hill field friend king".split()
ADJS = "old small quiet green bright cold happy tall dark little red busy gentle".split()
VERBS = "sees finds follows carries watches likes paints visits builds opens crosses remembers".split()
PREPS = "near behind under beside across beyond".split()
DETS = "the a every one".split()
ADVS = "slowly today again quietly later often".split()

FACTORS = [f"tf{i}" for i in range(1, 13)]
TISSUES = "liver brain kidney heart lung muscle skin retina".split()
PRODUCTS = "kinase protease channel receptor transporter ligase".split()
DOMAIN_WORDS = "gene factor binds promoter is expressed bound by encodes acts what where does do ? that".split()

TEMPLATES = (
    ("what binds the promoter of {g} ?", "factor {f} binds the promoter of {g} in the {t} ."),
    ("where is {g} expressed ?", "{g} is expressed in the {t} and is bound by {f} ."),
    ("what does {g} encode ?", "{g} encodes a {p} that acts in the {t} ."),
    ("what is bound by {f} ?", "{f} binds {g} , a {p} gene of the {t} ."),
)


@dataclass(frozen=True)
class SyntheticConfig:
    """Sizes of the generated sets (the debug recipe keeps them tiny)."""

    n_genes: int = 40
    """Distinct genes in the fact table; each is a token of its own."""
    heldout_fraction: float = 0.25
    """Share of (gene, template) pairs kept out of domain training for the domain held-out set."""
    n_general_train: int = 3000
    """General-text training examples (2–3 sentences each) for the base model."""
    n_general_eval: int = 150
    """General-text held-out examples."""
    general_domain_mix: float = 0.1
    """Share of general-text sentences that use the domain's answer templates with random (wrong) facts: the base
    then knows the domain's words and grammar but not its facts, so the comparison is about knowledge."""
    seed: int = 0
    """Seeds the fact table and every sampled sentence."""


def gene_names(n: int) -> list[str]:
    return [f"g{i:03d}" for i in range(n)]


def vocabulary(cfg: SyntheticConfig) -> list[str]:
    """Every word either generator can produce (plus punctuation), specials first."""
    words = NOUNS + ADJS + VERBS + PREPS + DETS + ADVS + FACTORS + TISSUES + PRODUCTS + DOMAIN_WORDS
    words += gene_names(cfg.n_genes) + ["the", "of", "in", "and", "a", ".", ",", "an"]
    return list(SPECIALS) + sorted(set(words) - set(SPECIALS))


def general_sentence(rng: random.Random) -> str:
    s = f"{rng.choice(DETS)} {rng.choice(ADJS)} {rng.choice(NOUNS)} {rng.choice(VERBS)} the {rng.choice(NOUNS)}"
    if rng.random() < 0.5:
        s += f" {rng.choice(PREPS)} the {rng.choice(NOUNS)}"
    if rng.random() < 0.3:
        s += f" {rng.choice(ADVS)}"
    return s + " ."


def random_fact_sentence(rng: random.Random, n_genes: int) -> str:
    """A domain answer template filled with a random gene, factor, tissue and product (no consistent facts)."""
    _, a = rng.choice(TEMPLATES)
    g = rng.choice(gene_names(n_genes))
    return a.format(g=g, f=rng.choice(FACTORS), t=rng.choice(TISSUES), p=rng.choice(PRODUCTS))


def general_examples(n: int, rng: random.Random, n_genes: int = 0, mix: float = 0.0) -> list[dict[str, str]]:
    def sentence() -> str:
        return random_fact_sentence(rng, n_genes) if n_genes and rng.random() < mix else general_sentence(rng)

    return [{"text": " ".join(sentence() for _ in range(rng.randint(2, 3)))} for _ in range(n)]


def domain_examples(cfg: SyntheticConfig, rng: random.Random) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(train, held-out) question/answer pairs over one fact table; every gene has ≥ 1 training template."""
    genes = gene_names(cfg.n_genes)
    facts = {g: (rng.choice(FACTORS), rng.choice(TISSUES), rng.choice(PRODUCTS)) for g in genes}
    train, held = [], []
    for g in genes:
        f, t, p = facts[g]
        order = list(range(len(TEMPLATES)))
        rng.shuffle(order)
        n_held = round(cfg.heldout_fraction * len(TEMPLATES))
        for rank, ti in enumerate(order):
            q, a = TEMPLATES[ti]
            row = {"question": q.format(g=g, f=f, t=t, p=p), "answer": a.format(g=g, f=f, t=t, p=p)}
            (held if rank < n_held else train).append(row)
    rng.shuffle(train)
    rng.shuffle(held)
    return train, held


def write_jsonl(path: Path, rows: list[dict[str, str]]) -> Path:
    fs.write_jsonl(path, rows)
    return path


def write_tokenizer(out_dir: Path, words: list[str]):
    """A word-level Hugging Face fast tokenizer over ``words`` (saved with ``save_pretrained``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]", bos_token="[BOS]", eos_token="[EOS]"
    )
    tok.save_pretrained(str(out_dir))
    return tok


def write_synthetic(out_dir: str | Path, cfg: SyntheticConfig) -> dict[str, Path]:
    """Write the four jsonl sets and the tokenizer under ``out_dir``; returns name → path."""
    out = Path(out_dir)
    rng = random.Random(cfg.seed)
    d_train, d_eval = domain_examples(cfg, rng)
    mix = (rng, cfg.n_genes, cfg.general_domain_mix)
    sets = {
        "domain_train": d_train,
        "domain_eval": d_eval,
        "general_train": general_examples(cfg.n_general_train, *mix),
        "general_eval": general_examples(cfg.n_general_eval, *mix),
    }
    paths = {name: write_jsonl(out / "data" / f"{name}.jsonl", rows) for name, rows in sets.items()}
    write_tokenizer(out / "tokenizer", vocabulary(cfg))
    return paths | {"tokenizer": out / "tokenizer"}
