"""Supervised fine-tuning on chat transcripts and trace-store exports (``scifolio posttrain sft``).

    scifolio posttrain sft --config debug --model models/base --data chats.jsonl --out runs/sft
    scifolio posttrain sft --config debug --model models/base --data chats.jsonl traces.jsonl --out runs/sft --resume
    scifolio posttrain sft --config small --model M --data a.jsonl --out runs/sft --nproc 2 --set zero_stage=3

Inputs, one JSON object a line, in any number of files:
- chat: ``{"messages": [...], "tools": [...]?}`` with roles system/user/assistant/tool and OpenAI-shaped
  ``tool_calls`` (``{"type": "function", "function": {"name", "arguments": JSON string or object}}``). Rendered with
  the model's chat template (``formats.chat.CHAT_TEMPLATE`` when it has none) one message at a time: each
  assistant message's text after the generation prompt is in the loss, everything else (system, user, tool,
  the template's headers) is context only.
- task (``posttrain rl``/``eval`` rows): ``{"messages": [...], "answer": ...}`` with no assistant message: the answer
  is the assistant reply.
- trace export (``TraceStore.session_export``): ``{"token_ids": [...], "loss_mask": [...]}``, ids exactly as the
  gateway fed them; ``skip`` steps already carry ``loss_mask`` 0: in context, out of the loss.
Content may be a list of OpenAI-style parts, images among them (``formats.chat_images``; paths from the jsonl's folder):
a vision-language model (``pretrain export --vlm``) renders them with its processor, each image's tokens context only,
the example carrying its pixel values; a text-only model refuses them. A bad row (unknown role, broken tool call, over
``max_len`` tokens, nothing to learn, not JSON, a missing, unreadable or too large image) is counted and skipped with
its reason (``DIR/skipped.jsonl``), never a crash.

Packing: examples are concatenated into rows of ``seq_len`` tokens; positions restart at 0 for every example and
the attention mask is block-diagonal-causal (``pretrain.model.block_causal_mask``), and an example's last token
predicts nothing, so no token attends to or predicts across an example boundary. A row's pixel values are its image
examples' in order: the order of their image tokens, which a Llava forward fills in that order. The loss is the mean
cross-entropy over assistant target tokens of the micro-batch.

The engine is DeepSpeed, as in pre-training (any ZeRO stage; ``--nproc`` ranks through the deepspeed launcher);
the run directory is a ``formats.rundir.RunDir``: ``config.json``, ``metrics.jsonl``, ``tb/``, DeepSpeed
checkpoints under ``ckpt/`` (``--resume`` continues the same data stream), and ``policy/``: the Hugging Face model
(with tokenizer and chat template) the next stage loads.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from formats.chat import CHAT_TEMPLATE, ROLES
from formats.overrides import with_overrides

IGNORE = -100


# --- config ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SFTConfig:
    """One SFT run."""

    model: str = ""
    """Hugging Face model directory or name to start from (``--model``; e.g. a ``pretrain export`` output)."""
    data: tuple[str, ...] = ()
    """jsonl files of chats and/or trace exports (``--data``)."""
    seq_len: int = 256
    """Tokens per packed row."""
    max_len: int = 256
    """A longer example is skipped as over-long (never truncated: a cut answer teaches a cut answer)."""
    micro_batch: int = 2
    """Packed rows per micro-batch per rank."""
    grad_accum: int = 1
    """Micro-batches per optimizer step."""
    steps: int = 100
    """Optimizer steps in total (a resumed run continues up to this)."""
    lr: float = 1e-3
    """AdamW learning rate after warmup."""
    warmup_steps: int = 0
    """Linear warmup from 0 over this many steps."""
    min_lr_ratio: float = 1.0
    """After warmup the rate falls linearly to this fraction of ``lr`` at ``steps`` (1 = constant)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    grad_clip: float = 1.0
    """Global gradient-norm clip; 0 disables."""
    zero_stage: int = 2
    """DeepSpeed ZeRO stage 0–3."""
    precision: str = "fp32"
    """"fp32" or "bf16"."""
    save_every: int = 0
    """Checkpoint every N steps (and always at the end); 0 = only at the end."""
    seed: int = 0
    """Seeds the per-epoch shuffle of examples."""
    tensorboard: bool = True
    """TensorBoard scalars beside metrics.jsonl."""


def debug(**overrides: Any) -> SFTConfig:
    """Tiny models in tests and smoke runs: short rows, a high learning rate, a few dozen steps."""
    cfg = SFTConfig(seq_len=512, max_len=512, micro_batch=2, steps=60, lr=1e-2, min_lr_ratio=0.1)
    return with_overrides(cfg, overrides)


def small(**overrides: Any) -> SFTConfig:
    """A laptop-sized real run: 2k-token rows, accumulation 8, bf16, warmup, checkpoints every 200 steps."""
    cfg = SFTConfig(seq_len=2048, max_len=2048, micro_batch=2, grad_accum=8, steps=2000, lr=2e-5, warmup_steps=50)
    return with_overrides(dataclasses.replace(cfg, precision="bf16", save_every=200), overrides)


RECIPES: dict[str, Callable[..., SFTConfig]] = {"debug": debug, "small": small}


# --- data --------------------------------------------------------------------------------------------------------


class BadRow(ValueError):
    """A row SFT skips; the message is the reason."""


@dataclass
class Example:
    """One conversation: token ids and per-token labels (the id where it is trained on, else IGNORE)."""

    ids: list[int]
    labels: list[int]
    pixel_values: list[Any] = field(default_factory=list)
    """The pixel values of its image tokens, in order (a vision-language chat)."""


def ensure_chat_template(tokenizer: Any) -> Any:
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def check_messages(messages: Any) -> None:
    """Raise BadRow unless ``messages`` is a well-formed chat with something to learn."""
    if not isinstance(messages, list) or not messages:
        raise BadRow("messages: not a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BadRow(f"message {i}: not an object")
        role = m.get("role")
        if role not in ROLES:
            raise BadRow(f"unknown role {role!r}")
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise BadRow(f"message {i}: content is neither a string nor a list of parts")
        calls = m.get("tool_calls")
        if calls is not None:
            if role != "assistant" or not isinstance(calls, list):
                raise BadRow(f"broken tool call: message {i} ({role}) has tool_calls {type(calls).__name__}")
            for c in calls:
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
                    raise BadRow(f"broken tool call: message {i} has a call without function.name")
                args = fn.get("arguments", "{}")
                if isinstance(args, str):
                    try:
                        args = json.loads(args)
                    except json.JSONDecodeError:
                        raise BadRow(f"broken tool call: {fn['name']} arguments are not JSON") from None
                if not isinstance(args, dict):
                    raise BadRow(f"broken tool call: {fn['name']} arguments are not an object")
        if role != "assistant" and not isinstance(content, (str, list)):
            raise BadRow(f"message {i}: {role} message without content")
    if not any(m["role"] == "assistant" and (m.get("content") or m.get("tool_calls")) for m in messages):
        raise BadRow("no assistant message to learn")


def _normalise(m: dict[str, Any]) -> dict[str, Any]:
    """Tool-call arguments as JSON text (the OpenAI wire shape), whichever form the row used."""
    if not m.get("tool_calls"):
        return m
    calls = []
    for c in m["tool_calls"]:
        args = c["function"].get("arguments", "{}")
        args = args if isinstance(args, str) else json.dumps(args)
        calls.append({**c, "type": c.get("type", "function"), "function": {**c["function"], "arguments": args}})
    return {**m, "tool_calls": calls}


def encode_chat(
    messages: list[dict[str, Any]], tokenizer: Any, tools: list | None = None, processor: Any = None, base: str = ""
) -> Example:
    """Render message by message; assistant text after its generation prompt is labelled, the rest is context. Image
    parts need a vision-language ``processor``: a piece holding image placeholders is tokenised by it with its
    images, which expands each placeholder to the image's tokens (``BadImage`` when an image fails)."""
    from formats.chat import IMAGE_TOKEN
    from formats.chat_images import has_images, resolve

    check_messages(messages)
    msgs, images = [_normalise(m) for m in messages], []
    if has_images({"messages": msgs}):
        if processor is None:
            raise ValueError("the row holds images and this is a text-only model (export it with --vlm)")
        msgs, images = resolve(msgs, base)
    kw = {"tools": tools} if tools else {}

    def render(upto: int, gen: bool = False) -> str:
        if upto == 0 and not gen:
            return ""
        return tokenizer.apply_chat_template(msgs[:upto], tokenize=False, add_generation_prompt=gen, **kw)

    ids: list[int] = []
    labels: list[int] = []
    done, pixels = "", []

    def add(text: str, train: bool) -> None:
        nonlocal done
        if not text:
            return
        if n := text.count(IMAGE_TOKEN) if images else 0:
            k = sum(len(p) for p in pixels)
            enc = processor(text=text, images=images[k : k + n], return_tensors="pt", add_special_tokens=False)
            toks = enc["input_ids"][0].tolist()
            pixels.append(enc["pixel_values"])
        else:
            toks = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids.extend(toks)
        labels.extend(toks if train else [IGNORE] * len(toks))
        done += text

    for i, m in enumerate(msgs):
        if m["role"] == "assistant":
            head = render(i, gen=True)
            if not head.startswith(done):
                raise BadRow("chat template is not prefix-consistent at an assistant turn")
            add(head[len(done) :], train=False)
        full = render(i + 1)
        if not full.startswith(done):
            raise BadRow(f"chat template is not prefix-consistent at message {i}")
        add(full[len(done) :], train=m["role"] == "assistant")
    return Example(ids, labels, pixels)


def encode_row(row: Any, tokenizer: Any, max_len: int, processor: Any = None, base: str = "") -> Example:
    """A chat, task or trace-export row → Example; BadRow (or ``BadImage``) says why not."""
    if not isinstance(row, dict):
        raise BadRow("row is not a JSON object")
    if "messages" in row:
        msgs = row["messages"]
        if "answer" in row and isinstance(msgs, list) and not any(m.get("role") == "assistant" for m in msgs):
            msgs = [*msgs, {"role": "assistant", "content": str(row["answer"])}]  # a task row: its answer is the reply
        ex = encode_chat(msgs, tokenizer, row.get("tools"), processor, base)
    elif "token_ids" in row:
        ids, mask = row["token_ids"], row.get("loss_mask")
        if mask is None or len(mask) != len(ids):
            raise BadRow("trace export: loss_mask missing or not one per token")
        ex = Example(list(ids), [t if m else IGNORE for t, m in zip(ids, mask)])
    else:
        raise BadRow("neither messages nor token_ids")
    if len(ex.ids) > max_len:
        raise BadRow(f"over-long: {len(ex.ids)} tokens > max_len {max_len}")
    if all(label == IGNORE for label in ex.labels[1:]):
        raise BadRow("no trained token")
    vocab = len(tokenizer)
    if max(ex.ids) >= vocab:
        raise BadRow(f"token id {max(ex.ids)} outside the tokenizer's {vocab}")
    return ex


def load_examples(
    paths: Sequence[str], tokenizer: Any, max_len: int, processor: Any = None
) -> tuple[list[Example], list[dict[str, Any]]]:
    """Every good row of ``paths`` in order, and one record per skipped row (file, line, reason); image rows through
    ``processor`` (relative image paths from the file's folder); a text-only model (no processor) refuses them."""
    from formats.chat_images import BadImage

    good: list[Example] = []
    skipped: list[dict[str, Any]] = []
    for path in paths:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    good.append(encode_row(json.loads(line), tokenizer, max_len, processor, str(Path(path).parent)))
                except json.JSONDecodeError:
                    skipped.append({"file": str(path), "line": n, "reason": "not JSON"})
                except (BadRow, BadImage) as e:
                    skipped.append({"file": str(path), "line": n, "reason": str(e)})
                except ValueError as e:  # a refusal (image rows, text-only model): the whole run, not one row
                    raise ValueError(f"{path}:{n}: {e}") from None
    return good, skipped


def shifted(ex: Example) -> list[int]:
    """Per position the label of the *next* token (what that position is trained to predict); the last predicts
    nothing, so a packed example never learns its successor's first token."""
    return [*ex.labels[1:], IGNORE]


_ROW_KEYS = ("input_ids", "targets", "position_ids", "seq_ids", "pixel_values")


def pack(examples: Sequence[Example], seq_len: int) -> list[dict[str, list[Any]]]:
    """Greedy first-fit in order: rows of ``input_ids``, ``targets``, ``position_ids`` (restart per example),
    ``seq_ids`` (1, 2, … per example in the row; 0 = padding) and ``pixel_values`` (see the module docstring)."""
    rows: list[dict[str, list[Any]]] = []
    cur: dict[str, list[Any]] = {k: [] for k in _ROW_KEYS}
    for ex in examples:
        if len(ex.ids) > seq_len:
            raise ValueError(f"example of {len(ex.ids)} tokens > seq_len {seq_len} (max_len must be ≤ seq_len)")
        if len(cur["input_ids"]) + len(ex.ids) > seq_len:
            rows.append(cur)
            cur = {k: [] for k in _ROW_KEYS}
        k = (cur["seq_ids"][-1] if cur["seq_ids"] else 0) + 1
        cur["input_ids"] += ex.ids
        cur["targets"] += shifted(ex)
        cur["position_ids"] += list(range(len(ex.ids)))
        cur["seq_ids"] += [k] * len(ex.ids)
        cur["pixel_values"] += ex.pixel_values
    if cur["input_ids"]:
        rows.append(cur)
    for r in rows:  # pad to seq_len: padding is its own (masked) sample with no targets
        pad = seq_len - len(r["input_ids"])
        for key, fill in (("input_ids", 0), ("targets", IGNORE), ("position_ids", 0), ("seq_ids", 0)):
            r[key] += [fill] * pad
    return rows


def collate(rows: Sequence[dict[str, list[Any]]]) -> dict[str, Any]:
    """Rows → tensors, the block-causal mask, and (image rows) their pixel values concatenated in row order."""
    import torch

    from pretrain.model import block_causal_mask

    batch = {k: torch.tensor([r[k] for r in rows]) for k in ("input_ids", "targets", "position_ids")}
    batch["attention_mask"] = block_causal_mask(torch.tensor([r["seq_ids"] for r in rows]))
    if px := [p for r in rows for p in r.get("pixel_values", ())]:
        batch["pixel_values"] = torch.cat(px)
    return batch


def sft_loss(model: Any, batch: dict[str, Any]) -> tuple[Any, Any]:
    """Mean cross-entropy over the batch's target tokens, and the logits (tests probe their gradient)."""
    import torch.nn.functional as F

    logits = model(**{k: v for k, v in batch.items() if k != "targets"}, use_cache=False).logits
    targets = batch["targets"]
    n = (targets != IGNORE).sum().clamp(min=1)
    loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction="sum")
    return loss / n, logits


@dataclass
class Batches:
    """The data cursor: each epoch shuffles the examples (seeded), packs them, deals rows to ranks round-robin."""

    examples: Sequence[Example]
    cfg: SFTConfig
    rank: int = 0
    world: int = 1
    epoch: int = 0
    pos: int = 0
    _rows: list[dict[str, list[int]]] = field(default_factory=list, repr=False)
    _rows_epoch: int = -1

    def _epoch_rows(self) -> list[dict[str, list[int]]]:
        if self._rows_epoch != self.epoch:
            order = list(range(len(self.examples)))
            random.Random(f"{self.cfg.seed}/{self.epoch}").shuffle(order)
            rows = pack([self.examples[i] for i in order], self.cfg.seq_len)
            # every rank the same number of rows (wrap around) so no rank waits on a missing micro-batch
            per = math.ceil(len(rows) / self.world)
            rows = [rows[i % len(rows)] for i in range(per * self.world)]
            self._rows, self._rows_epoch = rows[self.rank :: self.world], self.epoch
        return self._rows

    def __next__(self) -> dict[str, Any]:
        out = []
        while len(out) < self.cfg.micro_batch:
            rows = self._epoch_rows()
            if self.pos >= len(rows):
                self.epoch, self.pos = self.epoch + 1, 0
                continue
            out.append(rows[self.pos])
            self.pos += 1
        return collate(out)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])


# --- training ----------------------------------------------------------------------------------------------------


def train(
    cfg: SFTConfig, out: str | Path, setup: Callable[[], tuple[int, int]], resume: bool = False, progress: bool = True
) -> list[dict[str, Any]]:
    """Run to ``cfg.steps``; ``setup()`` joins the process group and returns (rank, world) (the CLI passes
    pre-training's ``init_distributed``, so both stages start DeepSpeed the same way). Returns the metrics rows."""
    import deepspeed
    import torch
    import torch.distributed as dist
    from transformers import AutoTokenizer

    from formats.rundir import RunDir, deepspeed_json
    from posttrain.fit import fit, progress_bar
    from posttrain.fit import schedule as lr_schedule
    from posttrain.rl.engines import PolicyConfig, build_policy, load_processor

    rank, world = setup()
    run = RunDir(out, resume=resume, tensorboard=cfg.tensorboard, rank=rank, checkpoint="ckpt/latest")
    run.write_config(dataclasses.asdict(cfg))
    tokenizer = ensure_chat_template(AutoTokenizer.from_pretrained(cfg.model))
    processor = load_processor(PolicyConfig(path=cfg.model))  # a vision-language model's, else None
    examples, skipped = load_examples(cfg.data, tokenizer, min(cfg.max_len, cfg.seq_len), processor)
    if rank == 0:
        _report_skipped(run.path, skipped, len(examples))
    if not examples:
        raise ValueError(f"no usable rows in {', '.join(cfg.data)} ({len(skipped)} skipped: see skipped.jsonl)")

    torch.manual_seed(cfg.seed)
    model = build_policy(PolicyConfig(path=cfg.model), tokenizer=tokenizer)[0]  # the one loader: LM or VLM, fp32
    model.config.use_cache = False
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    schedule = lr_schedule(optimizer, cfg.steps, "linear", cfg.min_lr_ratio, cfg.warmup_steps)
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=params, optimizer=optimizer, lr_scheduler=schedule,
        config=deepspeed_json(cfg.micro_batch, cfg.grad_accum, world, cfg.grad_clip, cfg.precision, cfg.zero_stage),
    )  # fmt: skip
    data = Batches(examples, cfg, rank, world)
    step = 0
    if resume:
        _, client = engine.load_checkpoint(str(run.path / "ckpt"))
        step = int(client["step"])
        data.load_state_dict(client["data"][rank])
        run.trim(step)
    bar = progress_bar(cfg.steps, progress and rank == 0, initial=step, unit="step")
    rows: list[dict[str, Any]] = []
    total, micro = torch.zeros(2), 0

    def micro_batches() -> Iterator[dict[str, Any]]:
        while step < cfg.steps:
            yield next(data)

    def on_step(batch: dict[str, Any], loss: float) -> None:  # a micro-batch; an optimizer step every grad_accum
        nonlocal step, total, micro
        total += torch.tensor([loss, float((batch["targets"] != IGNORE).sum())])
        micro += 1
        if micro % cfg.grad_accum:
            return
        step += 1
        dist.all_reduce(total)
        mean, n_target = total[0].item() / (world * cfg.grad_accum), int(total[1].item())
        row = {"step": step, "loss": mean, "target_tokens": n_target, "lr": engine.get_lr()[0], "epoch": data.epoch}
        total = torch.zeros(2)
        rows.append(row)
        run.log(row)
        bar.update(1)
        bar.set_postfix(loss=f"{row['loss']:.4f}")
        if (cfg.save_every and step % cfg.save_every == 0) or step == cfg.steps:
            gathered: list[Any] = [None] * world
            dist.all_gather_object(gathered, data.state_dict())
            engine.save_checkpoint(
                str(run.path / "ckpt"), tag=f"step{step}", client_state={"step": step, "data": gathered}
            )

    fit(engine, micro_batches(), lambda m, b: sft_loss(m, b)[0], on_step=on_step)
    bar.close()
    _save_policy(engine, processor or tokenizer, run.policy, cfg.zero_stage, rank)
    run.close()
    return rows


def _save_policy(engine: Any, tokenizer: Any, path: Path, stage: int, rank: int) -> None:
    """The trained model as a Hugging Face directory with its tokenizer, or a VLM's processor (ZeRO-3: every rank's
    shard gathered first)."""
    import deepspeed

    module = engine.module
    with deepspeed.zero.GatheredParameters(list(module.parameters()), enabled=stage == 3):
        if rank == 0:
            module.config.use_cache = True
            module.save_pretrained(path)
            tokenizer.save_pretrained(path)  # save_pretrained writes the generation config too


def _report_skipped(run: Path, skipped: list[dict[str, Any]], kept: int) -> None:
    from formats import fs

    fs.write_jsonl(run / "skipped.jsonl", skipped)
    if skipped:
        reasons = Counter(s["reason"].split(":")[0] for s in skipped)
        detail = ", ".join(f"{n} {r}" for r, n in reasons.most_common())
        print(f"sft: {kept} rows kept, {len(skipped)} skipped ({detail}); see {run / 'skipped.jsonl'}", flush=True)
