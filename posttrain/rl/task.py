"""Verifiable tasks: a jsonl of prompts plus a verifier function, and the toy ``countdown`` family.

A task is rows ``{"id": ..., "prompt": ..., "answer": ...}`` or ``{"id": ..., "messages": [...], "answer": ...}``
(a chat rendered with the policy's chat template, generation prompt added; any extra keys are passed through) and
``verify(completion, row, stopped) -> float`` in [0, 1]; ``completion`` is the decoded response without
the end-of-sequence token, ``stopped`` whether the model ended it itself. Real datasets plug in with
``JsonlTask(path, verify=my_verifier)``.

The toy family ``countdown`` is arithmetic written out step by step: the prompt ``"7:"`` asks for
``"6543210"`` (subtract one until zero), then end. Start digits are drawn long-tailed
(P(n) ∝ n^-1.2), so most answers are 1–3 tokens and a few are many times longer; the verifier gives
partial credit for a correct prefix, so a tiny random policy gets a learning signal from step one.

    python -c "from posttrain.rl.task import countdown_rows; print(countdown_rows(5))"

The ``small`` recipes' data ship with the project (``SMALL_DATA``: ``posttrain/data/rl/{train,test}.jsonl``): two-
and three-operand integer arithmetic as single-turn chats with exact integer answers (``arithmetic_rows``), written
by ``python -m posttrain.rl.task --write posttrain/data/rl`` (deterministic: the shipped files are its output).
"""

from __future__ import annotations

import math
import random
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from formats import fs
from formats.chat import TURN_END
from formats.chat_images import BadImage, encode_chat, has_images
from posttrain.rollout.scheduler import Prompt
from posttrain.rollout.types import FINISH_STOP, Trajectory

Verifier = Callable[[str, dict[str, Any], bool], float]

CHARS = "0123456789:"
SMALL_DATA = Path(__file__).resolve().parents[1] / "data" / "rl"
"""The ``small`` recipes' generated task files (package data): ``train.jsonl`` (RL) and ``test.jsonl`` (eval)."""
SPECIAL = ("<pad>", "<eos>", "<bos>")


def char_tokenizer(chars: str = CHARS, split: str = ".") -> Any:
    """A character-level Hugging Face fast tokenizer built locally (no download): ``<pad> <eos> <bos>`` + chars.
    ``split``: the regex of one token (``.`` leaves a run of newlines one piece; ``[\\s\\S]`` splits it too)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([*SPECIAL, *chars])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(split), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>")


def countdown_answer(n: int) -> str:
    return "".join(str(k) for k in range(n - 1, -1, -1))


def countdown_rows(n_rows: int, seed: int = 0, max_start: int = 9, alpha: float = 1.2) -> list[dict[str, Any]]:
    """``n_rows`` prompts ``"n:"`` with n ∈ [1, max_start] drawn with P(n) ∝ n^-alpha (long-tailed lengths)."""
    rng = random.Random(seed)
    starts = list(range(1, max_start + 1))
    weights = [k**-alpha for k in starts]
    picks = rng.choices(starts, weights, k=n_rows)  # the same draws as one choices() call per row
    return [{"id": f"countdown-{i}", "prompt": f"{n}:", "answer": countdown_answer(n)} for i, n in enumerate(picks)]


def arithmetic_rows(n_rows: int, seed: int = 0, split: str = "train") -> list[dict[str, Any]]:
    """``n_rows`` chat problems ``a op b (op c)`` with small integers and an exact integer answer (the ``small``
    recipes' data: easy enough that a 0.5B instruct model gets some right, so RL has a signal from step one)."""
    rng = random.Random(f"arithmetic/{split}/{seed}")
    rows = []
    for i in range(n_rows):
        terms = [rng.randint(2, 99) for _ in range(rng.choice((2, 2, 3)))]
        ops = [rng.choice("+-*") for _ in terms[1:]]
        expr = str(terms[0]) + "".join(f" {o} {t}" for o, t in zip(ops, terms[1:]))
        summands = [terms[0]]  # the usual precedence: products first, then the sum
        for o, t in zip(ops, terms[1:]):
            if o == "*":
                summands[-1] *= t
            else:
                summands.append(t if o == "+" else -t)
        question = {"role": "user", "content": f"What is {expr}? Reply with the integer only."}
        rows.append({"id": f"arith-{split}-{i}", "messages": [question], "answer": str(sum(summands))})
    return rows


def write_small_data(out: str | Path, n_train: int = 512, n_test: int = 128) -> list[Path]:
    """``out/train.jsonl`` and ``out/test.jsonl``: the ``small`` recipes' arithmetic sets (``arithmetic_rows``)."""
    return _write_sets(
        out, {split: arithmetic_rows(n, split=split) for split, n in (("train", n_train), ("test", n_test))}
    )


def _write_sets(out: str | Path, sets: dict[str, list[dict[str, Any]]]) -> list[Path]:
    """``out/NAME.jsonl`` for each named set, in order; their paths."""
    for name, rows in sets.items():
        fs.write_jsonl(Path(out) / f"{name}.jsonl", rows)
    return [Path(out) / f"{name}.jsonl" for name in sets]


SMOL_DATA = SMALL_DATA.parent / "smol"
"""The ``smol`` recipe's task files (package data): ``train.jsonl`` (RL), ``test.jsonl`` (the same phrasing, problems
never in train) and ``test-phrasings.jsonl`` (other wordings, larger operands)."""
_SMOL_ASK = "What is {a} {o} {b}? Reply with the integer only."
_SMOL_PHRASINGS = (
    "Compute {a} {o} {b}.",
    "Calculate {a} {o} {b}. Give just the number.",
    "Find the value of {a} {o} {b}.",
    "{a} {o} {b} equals what number? Answer with a single integer.",
    "Work out {a} {o} {b}.",
    "What do you get from {a} {o} {b}? Only the result, please.",
)


def smol_rows(n_rows: int, split: str, seen: set[tuple[int, str, int]] | None = None) -> list[dict[str, Any]]:
    """``n_rows`` one-operation integer problems a 135M instruct model partly solves (the ``smol`` recipe).

    ``train`` and ``test``: "What is a op b? Reply with the integer only." with operands 1–20; ``phrasings``: six
    other wordings, operands 1–40. Answers are exact integers, checked by ``numeric``. ``seen``: problems
    ``(a, op, b)`` not to draw; this call's are added to it (pass train's set to ``test`` to keep them apart)."""
    rng = random.Random(f"smol/{split}")
    top, rows = (40 if split == "phrasings" else 20), []
    seen = set() if seen is None else seen
    while len(rows) < n_rows:
        a, b, o = rng.randint(1, top), rng.randint(1, top), rng.choice("+-+-*")
        if o == "*" and a * b > 200 or (a, o, b) in seen:
            continue
        seen.add((a, o, b))
        answer = a + b if o == "+" else a - b if o == "-" else a * b
        sym = "×" if o == "*" and split == "phrasings" else o
        q = rng.choice(_SMOL_PHRASINGS) if split == "phrasings" else _SMOL_ASK
        message = {"role": "user", "content": q.format(a=a, o=sym, b=b)}
        rows.append({"id": f"smol-{split}-{len(rows)}", "messages": [message], "answer": str(answer)})
    return rows


def write_smol_data(out: str | Path, n_train: int = 256, n_test: int = 64) -> list[Path]:
    """``out/{train,test,test-phrasings}.jsonl``: the ``smol`` recipe's sets (``smol_rows``; test disjoint from
    train)."""
    drawn: set[tuple[int, str, int]] = set()
    train = smol_rows(n_train, "train", drawn)
    sets = {"train": train, "test": smol_rows(n_test, "test", drawn), "test-phrasings": smol_rows(n_test, "phrasings")}
    return _write_sets(out, sets)


def encode_prompt(
    row: dict, tokenizer: Any, processor: Any = None, base: str | None = None
) -> tuple[list[int], Any, tuple[Any, ...]]:
    """(prompt ids, pixel values or None, decoded images): a row with image parts through a vision-language model's
    ``processor`` (``formats.chat_images``; relative image paths from ``base``), raising ``BadImage`` with its reason
    when an image fails and ``ValueError`` when there is no processor; any other row through :func:`prompt_ids`.
    Requests carry both forms: the HF engine feeds the pixel values, vLLM runs its own processor on the images."""
    if not has_images(row):
        return prompt_ids(row, tokenizer), None, ()
    if processor is None:
        raise ValueError(f"row {row.get('id')} holds images and this is a text-only model (export it with --vlm)")
    return encode_chat(row["messages"], processor, base)


def prompt_ids(row: dict[str, Any], tokenizer: Any) -> list[int]:
    """A chat row goes through the tokenizer's chat template (generation prompt added, rendered as text then tokenised
    without specials: the ids SFT trained the context on); a plain prompt is ``bos + prompt``."""
    if "messages" in row:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("a {'messages': [...]} row needs a tokenizer with a chat template (this one has none)")
        text = tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    ids = tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
    return [tokenizer.bos_token_id, *ids] if tokenizer.bos_token_id is not None else ids


def response(traj: Trajectory, row: dict[str, Any], tokenizer: Any) -> tuple[str, bool]:
    """(the decoded response without its stop token, whether it ended): RL's reward and ``eval``'s check read the
    same text. A chat row's turn also ends at ``formats.chat.TURN_END`` (that template ends turns with text)."""
    stopped = traj.finish_reason == FINISH_STOP
    text = tokenizer.decode(traj.token_ids[:-1] if stopped else traj.token_ids, skip_special_tokens=True)
    if "messages" in row and TURN_END in text:
        text, stopped = text.split(TURN_END, 1)[0], True
    return text, stopped


def prefix_credit(completion: str, row: dict[str, Any], stopped: bool) -> float:
    """Fraction of ``answer + <end>`` matched from the start: exact answer then stop = 1."""
    target = list(row["answer"]) + ["<end>"]
    got = list(completion) + (["<end>"] if stopped else [])
    k = 0
    while k < min(len(target), len(got)) and target[k] == got[k]:
        k += 1
    return k / len(target)


def exact_match(completion: str, row: dict[str, Any], stopped: bool) -> float:
    """1 iff the response is exactly the answer and ended there."""
    return float(stopped and completion.strip() == str(row["answer"]).strip())


_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def numeric(completion: str, row: dict[str, Any], stopped: bool) -> float:
    """1 iff the response ended and its last number equals the answer (relative tolerance 1e-6): answers in sentences
    ("The answer is 42.") pass."""
    found = _NUMBER.findall(completion.replace(",", ""))
    if not stopped or not found:
        return 0.0
    return float(math.isclose(float(found[-1]), float(row["answer"]), rel_tol=1e-6, abs_tol=1e-9))


def math_verify(completion: str, row: dict[str, Any], stopped: bool) -> float:
    """``math-verify``: 1 iff the response ended and its LaTeX/expression answer is mathematically the reference."""
    answer = str(row["answer"])
    return float(stopped and math_equal(completion, answer if "$" in answer or "\\boxed" in answer else f"${answer}$"))


def math_equal(pred: str, gold: str) -> bool:
    """Whether ``pred`` states ``gold`` mathematically, by ``math-verify`` (the RL verifier and the lemma agent's
    answers). Its timeouts are SIGALRM, which only the main thread may set: elsewhere they are switched off."""
    from math_verify import parse, verify

    main = threading.current_thread() is threading.main_thread()
    kw: dict[str, Any] = {} if main else {"parsing_timeout": None}
    g, p = parse(gold, **kw), parse(pred, **kw)
    return bool(g and p and verify(g, p, **({} if main else {"timeout_seconds": None})))


VERIFIERS: dict[str, Verifier] = {
    "prefix": prefix_credit,
    "exact": exact_match,
    "numeric": numeric,
    "math-verify": math_verify,
}
"""The one verifier registry: RL rewards (``task.verifier``) and ``scifolio eval --verifier`` (a sample passes at
reward 1) read it, so a run trains with the check it is measured with."""


@dataclass
class JsonlTask:
    """Rows from a jsonl file (or given in memory) plus a verifier."""

    rows: Sequence[dict[str, Any]]
    verify: Verifier
    base: str | None = None
    """Folder that relative image paths in rows are taken from (the jsonl's)."""

    @classmethod
    def from_jsonl(cls, path: str | Path, verify: Verifier = exact_match) -> JsonlTask:
        return cls(fs.read_jsonl(path), verify, str(Path(path).parent))

    def write_jsonl(self, path: str | Path) -> None:
        fs.write_jsonl(path, self.rows)


class TaskSource:
    """The data cursor: cycles through a task's rows in a seeded order per epoch (``PromptSource``). Rows with image
    parts need a vision-language ``processor``: their prompts carry pixel values; a row whose image fails is
    decoded once here, up front, and left out (``skipped``: row id → ``BadImage`` reason), never a crash."""

    def __init__(self, task: JsonlTask, tokenizer: Any, seed: int = 0, processor: Any = None) -> None:
        self.task, self.tokenizer, self.processor = task, tokenizer, processor
        self.seed, self.cursor = seed, 0
        self._by_id = {str(r["id"]): r for r in task.rows}
        self.skipped: dict[str, str] = {}
        for r in filter(has_images, task.rows):
            try:
                self.images({"row_id": str(r["id"])})
            except BadImage as e:
                self.skipped[str(r["id"])] = str(e)
        self.rows = [r for r in task.rows if str(r["id"]) not in self.skipped]
        if not self.rows:
            raise ValueError(f"every task row was skipped ({len(self.skipped)}: bad images)")

    def next_prompt(self) -> Prompt:
        epoch, i = divmod(self.cursor, len(self.rows))
        order = list(range(len(self.rows)))
        random.Random(f"{self.seed}/{epoch}").shuffle(order)
        row = self.rows[order[i]]
        self.cursor += 1
        ids, pixels, images = encode_prompt(row, self.tokenizer, self.processor, self.task.base)
        return Prompt(str(row["id"]), ids, {"row_id": str(row["id"])}, pixel_values=pixels, images=images)

    def images(self, meta: dict[str, Any]) -> tuple[Any, tuple[Any, ...]]:
        """(pixel values or None, decoded images) of the prompt a trajectory's ``meta`` names: the scheduler rebuilds
        a checkpoint-restored trajectory's images with this (a ``Request``'s images are never serialised)."""
        return encode_prompt(self._by_id[meta["row_id"]], self.tokenizer, self.processor, self.task.base)[1:]

    def reward(self, traj: Trajectory) -> float:
        """Decode the response (:func:`response`, as ``eval`` reads it) and run the verifier on it."""
        row = self._by_id[traj.request.meta["row_id"]]
        text, stopped = response(traj, row, self.tokenizer)
        return float(self.task.verify(text, row, stopped))

    def state_dict(self) -> dict[str, Any]:
        return {"cursor": self.cursor, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cursor, self.seed = int(state["cursor"]), int(state["seed"])


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m posttrain.rl.task", description=write_small_data.__doc__)
    p.add_argument("--write", required=True, metavar="DIR", help=f"output folder (shipped: {SMALL_DATA}, {SMOL_DATA})")
    p.add_argument("--recipe", choices=("small", "smol"), default="small", help="whose task files to write")
    p.add_argument("--n-train", type=int, help="rows in train.jsonl (small 512, smol 256)")
    p.add_argument("--n-test", type=int, help="rows in each test file (small 128, smol 64)")
    args = p.parse_args(argv)
    write = write_small_data if args.recipe == "small" else write_smol_data
    sizes = {k: v for k, v in (("n_train", args.n_train), ("n_test", args.n_test)) if v is not None}
    for path in write(args.write, **sizes):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
