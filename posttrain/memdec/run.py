"""The Memory Decoder stages as functions of a :class:`~posttrain.memdec.config.MemdecConfig` (the CLI calls
these; the store is handed in, so posttrain never imports retrieval).

    scifolio memdec prepare --config debug --work-dir out/memdec          # synthetic data + base on general text
    scifolio memdec build-datastore --config debug --work-dir out/memdec  # keys → Milvus, Eq 1 targets → parquet
    scifolio memdec train --config debug --work-dir out/memdec            # memory (Eq 2)
    scifolio memdec train-router --config debug --work-dir out/memdec     # router (Eq 4)
    scifolio memdec eval --config debug --work-dir out/memdec             # PPL / λ table and the claims
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tqdm import tqdm

from formats import fs
from posttrain.memdec.config import MemdecConfig
from posttrain.memdec.data import load_examples, load_lm, load_tokenizer, shard_examples
from posttrain.memdec.datastore import KeyValueStore, build_datastore, write_knn_targets
from posttrain.memdec.evaluate import EvalReport, evaluate
from posttrain.memdec.fused import load_router, save_router
from posttrain.memdec.synthetic import write_synthetic
from posttrain.memdec.train import checkpoint_step, new_lm, train_base, train_memory, train_router
from posttrain.objectives.memory_decoder import RouterConfig


def _threads(cfg: MemdecConfig) -> None:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)


def _bar(total: int, desc: str, quiet: bool):
    if quiet:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # "Loading weights" / "Writing model shards" bars
    return tqdm(total=total, desc=desc, disable=quiet, leave=False, dynamic_ncols=True)


def _loss_cb(bar):
    def cb(step: int, loss: float) -> None:
        bar.update(1)
        if step % 10 == 0:
            bar.set_postfix(loss=f"{loss:.3f}")

    return cb


def _need(path: str | Path, what: str, hint: str) -> None:
    if not Path(path).exists():
        raise FileNotFoundError(f"{what} not found at {path}; {hint}")


def prepare(cfg: MemdecConfig, quiet: bool = False) -> dict:
    """Generate the synthetic sets and tokenizer, then pre-train the tiny base on general text only."""
    _threads(cfg)
    torch.manual_seed(cfg.seed)
    paths = write_synthetic(cfg.work_dir, cfg.synthetic)
    tok = load_tokenizer(str(paths["tokenizer"]))
    general = load_examples(paths["general_train"], tok, cfg.datastore.max_len)
    base = new_lm(len(tok), cfg.base_train.hidden, cfg.seed, tok.pad_token_id)
    bt = cfg.base_train
    with _bar(bt.steps, "base on general text", quiet) as bar:
        train_base(base, general, tok.pad_token_id, bt.steps, bt.batch, bt.lr, cfg.seed, _loss_cb(bar))
    base.save_pretrained(cfg.path("base"))
    return {k: str(v) for k, v in paths.items()} | {"base": cfg.path("base")}


def _tok_and_base(cfg: MemdecConfig):
    _threads(cfg)
    _need(cfg.path("tokenizer"), "tokenizer", "run `scifolio memdec prepare` or set tokenizer=")
    _need(cfg.path("base"), "base model", "run `scifolio memdec prepare` or set base=")
    tok = load_tokenizer(cfg.path("tokenizer"))
    base = load_lm(cfg.path("base"))
    if base.config.vocab_size < len(tok):
        raise ValueError(f"base vocab {base.config.vocab_size} < tokenizer size {len(tok)}")
    return tok, base


def build(cfg: MemdecConfig, store: KeyValueStore, quiet: bool = False) -> dict:
    """Encode the domain corpus (and corpus shards) into the store (resumable), then write Eq 1 top-k targets."""
    tok, base = _tok_and_base(cfg)
    Path(cfg.work_dir).mkdir(parents=True, exist_ok=True)
    ds, pad = cfg.datastore, tok.pad_token_id
    _need(cfg.path("domain_train"), "domain corpus", "give domain_train= (jsonl of question/answer rows)")
    sources = [("", cfg.path("domain_train"), load_examples(cfg.path("domain_train"), tok, ds.max_len))]
    if cfg.shards:
        sources.append(("_shards", cfg.shards, shard_examples(cfg.shards, tok, ds.max_len)))
    stats = {"examples": 0, "keys": 0, "resumed_from": {}}
    for suffix, source, examples in sources:
        cursor, src = Path(cfg.work_dir) / f"datastore_cursor{suffix}.json", str(Path(source).resolve())
        with _bar(len(examples), f"datastore keys{suffix.replace('_', ' ')}", quiet) as bar:
            st = build_datastore(base, examples, store, cursor, pad, ds.batch_examples, source=src, progress=bar.update)
        stats["examples"] += st["examples"]
        stats["keys"] += st["keys"]
        stats["resumed_from"][suffix.strip("_") or "sft"] = st["resumed_from"]
    examples = [e for _, _, exs in sources for e in exs]
    with _bar(len(examples), "kNN targets (Eq 1)", quiet) as bar:
        targets = write_knn_targets(
            base,
            examples,
            store,
            cfg.targets_path,
            pad,
            base.config.vocab_size,
            ds.k,
            ds.tau,
            ds.exclude_self,
            ds.batch_examples,
            progress=bar.update,
        )
    return stats | {"stored": store.count(), "target_positions": targets["positions"], "targets": str(cfg.targets_path)}


def train(cfg: MemdecConfig, resume: bool = False, quiet: bool = False) -> dict:
    """Train the memory on the precomputed targets (Eq 2), a run directory at ``<work_dir>/memory`` (model in ``policy/``)."""
    tok, base = _tok_and_base(cfg)
    _need(cfg.targets_path, "kNN targets", "run `scifolio memdec build-datastore` first")
    m = cfg.memory
    memory = new_lm(base.config.vocab_size, m.hidden, cfg.seed + 1, tok.pad_token_id)
    with _bar(m.steps, "memory (Eq 2)", quiet) as bar:
        if resume:
            bar.update(checkpoint_step(cfg.memory_dir))
        train_memory(
            memory,
            cfg.targets_path,
            cfg.memory_dir,
            tok.pad_token_id,
            m.steps,
            m.batch,
            m.lr,
            m.beta,
            m.save_every,
            resume=resume,
            progress=_loss_cb(bar),
        )
    return {"memory": str(cfg.memory_dir / "policy"), "steps": m.steps}


def _memory(cfg: MemdecConfig):
    policy = cfg.memory_dir / "policy"
    if not (policy / "config.json").exists():
        raise FileNotFoundError(f"no trained memory at {policy}; run `scifolio memdec train` first")
    return load_lm(str(policy))


def fit_router(cfg: MemdecConfig, quiet: bool = False) -> dict:
    """Train the router on domain + general training text with base and memory frozen (Eq 4)."""
    tok, base = _tok_and_base(cfg)
    memory = _memory(cfg)
    domain = load_examples(cfg.path("domain_train"), tok, cfg.datastore.max_len)
    general = load_examples(cfg.path("general_train"), tok, cfg.datastore.max_len)
    r = cfg.router
    with _bar(r.steps, "router (Eq 4)", quiet) as bar:
        router = train_router(base, memory, domain, general, tok.pad_token_id, r, cfg.seed, _loss_cb(bar))
    rc = RouterConfig(base.config.hidden_size, memory.config.hidden_size, width=r.width)
    save_router(router, cfg.router_path, rc)
    return {"router": str(cfg.router_path)}


def load_all(cfg: MemdecConfig):
    """``(tokenizer, base, memory, router)`` of a trained run."""
    tok, base = _tok_and_base(cfg)
    _need(cfg.router_path, "router", "run `scifolio memdec train-router` first")
    return tok, base, _memory(cfg), load_router(cfg.router_path)


def run_eval(cfg: MemdecConfig) -> EvalReport:
    """Score both held-out sets and write ``<work_dir>/eval.json``."""
    tok, base, memory, router = load_all(cfg)
    domain = load_examples(cfg.path("domain_eval"), tok, cfg.datastore.max_len)
    general = load_examples(cfg.path("general_eval"), tok, cfg.datastore.max_len)
    report = evaluate(base, memory, router, domain, general, tok.pad_token_id)
    fs.write_text(Path(cfg.work_dir) / "eval.json", json.dumps(report.to_json(), indent=2))
    return report
