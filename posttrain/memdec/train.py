"""Training in plain torch (``posttrain.fit``): the synthetic experiment's base (general text, CE), the memory (Eq 2 against
streamed sparse kNN targets, checkpoint/resume), and the λ router (Eq 4, base and memory frozen).

    scifolio memdec train --config debug --work-dir out/memdec [--resume]
    scifolio memdec train-router --config debug --work-dir out/memdec
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from formats.rundir import CHECKPOINT, RunDir
from posttrain.fit import FitConfig, fit, schedule
from posttrain.memdec.config import RouterTrainConfig
from posttrain.memdec.data import Batch, Example, batches, collate, forward, gold, shifted
from posttrain.objectives.memory_decoder import Router, RouterConfig, router_loss, sparse_memory_loss

Progress = Callable[[int, float], None] | None  # (step, loss)


def new_lm(vocab_size: int, hidden: int, seed: int, pad_id: int):
    """A 2-layer Qwen2 causal LM with random weights (``posttrain.tiny.lm.causal_lm``), seeded, in train mode."""
    from posttrain.tiny.lm import causal_lm

    torch.manual_seed(seed)
    return causal_lm(vocab_size, hidden, pad_token_id=pad_id).train()


def lm_loss(model, batch: Batch) -> torch.Tensor:
    logits, _ = forward(model, batch)
    return F.cross_entropy(shifted(logits, batch).float(), gold(batch))


def train_base(
    model, examples: Sequence[Example], pad_id: int, steps: int, batch: int, lr: float, seed: int, progress: Progress
):
    """Plain next-token training on general text (every position after BOS is answer-side for ``text`` rows)."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    parts = (collate(part, pad_id) for _, part in zip(range(steps), batches(examples, batch, seed)))
    losses: list[float] = []
    tick = None if progress is None else (lambda _, loss: losses.append(loss) or progress(len(losses), loss))
    sched = schedule(opt, steps, "cosine", 0.1)
    fit(model, parts, lm_loss, FitConfig(grad_clip=1.0), [opt], schedulers=[sched], on_step=tick)
    return model


# -- memory (Eq 2) --------------------------------------------------------------------------------------------------
def target_batches(path: Path, batch: int, start_step: int) -> Iterator[list[dict]]:
    """Endless batches of target rows streamed from parquet in file order (never the whole file in memory); step s
    always gets the same rows, so a resumed run continues the exact sequence. An epoch's ragged tail is skipped."""
    import pyarrow.parquet as pq

    f = pq.ParquetFile(path)
    n = f.metadata.num_rows
    if n == 0:
        raise ValueError(f"{path} holds no targets")
    size = min(batch, n)
    per_epoch = n // size
    step = start_step
    while True:
        skip, j, buf = step % per_epoch, 0, []
        for rb in f.iter_batches(batch_size=256, columns=["ids", "answer_start", "knn_tokens", "knn_probs"]):
            for row in rb.to_pylist() if j < per_epoch else ():
                buf.append(row)
                if len(buf) == size:
                    if j >= skip:
                        yield buf
                        step += 1
                    j, buf = j + 1, []
                    if j >= per_epoch:
                        break


def targets_batch(rows: list[dict], pad_id: int) -> tuple[Batch, torch.Tensor, torch.Tensor]:
    """Collate target rows: the batch, and ``knn_tokens``/``knn_probs`` ``[n, K]`` aligned with ``gold(batch)``."""
    exs = [Example(index=-1, ids=tuple(r["ids"]), answer_start=r["answer_start"]) for r in rows]
    b = collate(exs, pad_id)
    toks = torch.tensor([t for r in rows for t in r["knn_tokens"]], dtype=torch.int64)
    probs = torch.tensor([p for r in rows for p in r["knn_probs"]], dtype=torch.float32)
    return b, toks, probs


def train_memory(
    model,
    targets: Path,
    out_dir: Path,
    pad_id: int,
    steps: int,
    batch: int,
    lr: float,
    beta: float,
    save_every: int,
    resume: bool = False,
    progress: Progress = None,
):
    """Eq 2 on streamed sparse kNN targets: ``β·KL(p_kNN ‖ p_mem) + (1−β)·CE(gold)`` over answer-side positions.

    ``out_dir`` is a :class:`~formats.rundir.RunDir`: ``config.json``, ``metrics.jsonl`` (step, loss, lr), ``tb/``,
    ``checkpoint/state.pt`` (model + optimizer + scheduler + step, every ``save_every`` steps) and ``policy/`` (the
    memory as a Hugging Face model, written at the end). ``resume`` continues from the checkpoint to ``steps`` with
    the same data order, so an interrupted run ends where an uninterrupted one does, with no duplicated row."""
    run = RunDir(out_dir, resume=resume)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = schedule(opt, steps, "cosine", 0.1)

    def save(step: int) -> None:
        state = {"step": step, "model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}
        run.save_checkpoint(lambda f: torch.save(state, f))

    start = 0
    try:
        if resume:
            state = run.load_checkpoint(lambda p: torch.load(p, weights_only=False))
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            sched.load_state_dict(state["sched"])
            start = int(state["step"])
            run.trim(start)
        run.write_config({"stage": "memdec-memory", "targets": str(targets), "steps": steps, "batch": batch,
                          "lr": lr, "beta": beta, "save_every": save_every})  # fmt: skip

        def loss_fn(model, item: tuple[int, list[dict]]) -> torch.Tensor:  # Eq 2 on one batch of target rows
            b, toks, probs = targets_batch(item[1], pad_id)
            return sparse_memory_loss(toks, probs, shifted(forward(model, b)[0], b), gold(b), beta=beta)

        def logged(item: tuple[int, list[dict]], loss: float) -> None:
            step = item[0]
            run.log({"step": step, "loss": loss, "lr": sched.get_last_lr()[0]})
            if progress is not None:
                progress(step, loss)
            if save_every and step % save_every == 0 and step < steps:
                save(step)

        items = zip(range(start + 1, steps + 1), target_batches(targets, batch, start))
        losses = fit(model, items, loss_fn, FitConfig(grad_clip=1.0), [opt], schedulers=[sched], on_step=logged)
        save(start + len(losses))
    finally:
        run.close()
    model.eval()
    model.save_pretrained(run.policy)
    return model


def checkpoint_step(out_dir: Path) -> int:
    """The step of ``out_dir``'s last complete memory checkpoint (0 when there is none)."""
    path = Path(out_dir) / CHECKPOINT
    return int(torch.load(path, weights_only=False)["step"]) if path.exists() else 0


# -- router (Eq 4) --------------------------------------------------------------------------------------------------
@torch.no_grad()
def frozen_outputs(base, memory, batch: Batch):
    """Answer-side ``(h_base, h_mem, p_base, p_mem)``, each ``[n, …]`` in ``gold(batch)`` order."""
    lb, hb = forward(base, batch)
    lm, hm = forward(memory, batch)
    p_base = torch.softmax(shifted(lb, batch).float(), -1)
    p_mem = torch.softmax(shifted(lm, batch).float(), -1)
    return shifted(hb, batch).float(), shifted(hm, batch).float(), p_base, p_mem


def domain_mask(examples: Sequence[Example], is_domain: Sequence[bool]) -> torch.Tensor:
    """One flag per answer-side position, in ``gold(collate(examples))`` order."""
    return torch.tensor([d for e, d in zip(examples, is_domain) for _ in e.positions()], dtype=torch.bool)


def train_router(
    base,
    memory,
    domain: Sequence[Example],
    general: Sequence[Example],
    pad_id: int,
    r: RouterTrainConfig,
    seed: int,
    progress: Progress = None,
) -> Router:
    """Eq 4 on a half-domain, half-general mixture (``r``: width, steps, batch, lr, α_s); base and memory stay frozen
    (no_grad, eval mode)."""
    torch.manual_seed(seed)
    router = Router(RouterConfig(base.config.hidden_size, memory.config.hidden_size, width=r.width))
    opt = torch.optim.Adam(router.parameters(), lr=r.lr)
    sched = schedule(opt, r.steps, "cosine", 0.1)
    half = max(1, r.batch // 2)
    dom, gen = batches(domain, half, seed), batches(general, half, seed + 1)
    mixes = (next(dom) + next(gen) for _ in range(r.steps))
    flags = [True] * half + [False] * half

    def loss_fn(router: Router, exs: list[Example]) -> torch.Tensor:  # Eq 4; base and memory frozen
        b = collate(exs, pad_id)
        hb, hm, pb, pm = frozen_outputs(base, memory, b)
        return router_loss(pb, pm, router(hb, hm, pb, pm), gold(b), domain_mask(exs, flags), alpha_s=r.alpha_s)

    losses: list[float] = []
    tick = None if progress is None else (lambda _, loss: losses.append(loss) or progress(len(losses), loss))
    fit(router, mixes, loss_fn, optimizers=[opt], schedulers=[sched], on_step=tick)
    return router
