"""Measure a model: pass@k on verifiable tasks, held-out perplexity on a build's shards (``scifolio eval``).

    scifolio eval --model runs/sft/policy --task countdown --n 16 --k 1,4,16 --out eval.json
    scifolio eval --model M --task jsonl --data test.jsonl --verifier math-verify --n 16 --k 1,4 --repeats 3 --out e.json
    scifolio eval --model M --task agentic --n 8 --k 1,4 --out agentic.json   # coding tasks: gateway + harness + jail
    scifolio eval --model M --task countdown --engine vllm ...                 # vLLM samples (GPU; refused without it)
    scifolio eval --model M --task perplexity --shards out/ --out ppl.json

pass@k is the unbiased estimator of Chen et al. (2021): with ``n`` samples of which ``c`` pass,
pass@k = 1 − C(n−c, k)/C(n, k), averaged over problems (and over ``--repeats`` independent runs, whose spread is
reported too). Samples come from the RL stack's step-driven engines (``HFEngine``, or ``VLLMEngine`` with
``--engine vllm``; every problem's ``n`` requests batched through one engine), so what ``eval`` measures is what RL
would have sampled. ``--task agentic`` runs the agentic RL workflow's sessions instead (``evaluate_agentic``).

Tasks live in :data:`TASKS`, a registry: ``@register("name")`` on a function ``(options) -> EvalTask`` adds one
(the lemma-agent and agentic issues add theirs). A task is problems (``{"id", "prompt" | "messages", "answer",
...}``) plus a pass/fail ``check(completion, row, stopped)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from formats import fs
from posttrain.rl.task import VERIFIERS, encode_prompt, response  # chat rows as RL feeds them (template, images)
from posttrain.rollout.engine import run_all
from posttrain.rollout.types import Request, SamplingParams

Check = Callable[[str, dict[str, Any], bool], bool]


# --- the estimator (pure) ----------------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``c`` passes among ``n`` samples: 1 − C(n−c, k)/C(n, k).

    Computed as 1 − ∏_{i=n−c+1}^{n} (1 − k/i), which never forms the huge binomials."""
    if not 0 <= c <= n or k < 1:
        raise ValueError(f"need 0 ≤ c ≤ n and k ≥ 1, got n={n}, c={c}, k={k}")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


# --- tasks -------------------------------------------------------------------------------------------------------


@dataclass
class EvalTask:
    """Problems and a pass/fail check on a decoded completion (``stopped``: the model ended it itself)."""

    rows: Sequence[dict[str, Any]]
    check: Check
    max_new_tokens: int = 64
    base: str | None = None
    """Folder that relative image paths in rows are taken from (the jsonl's)."""


@dataclass(frozen=True)
class TaskOptions:
    """What a task factory may read (from the CLI)."""

    data: str | None = None
    """jsonl of problems (``jsonl`` task)."""
    verifier: str = "exact"
    """Name in :data:`VERIFIERS` (``jsonl`` task)."""
    problems: int = 64
    """How many generated problems (``countdown``)."""
    seed: int = 0
    max_new_tokens: int | None = None


TaskFactory = Callable[[TaskOptions], EvalTask]
TASKS: dict[str, TaskFactory] = {}


def register(name: str) -> Callable[[TaskFactory], TaskFactory]:
    """A decorator adding a task factory to :data:`TASKS` under ``name`` (the first one registered wins)."""
    return lambda fn: TASKS.setdefault(name, fn)


def check_of(verifier: str) -> Check:
    """A pass/fail check from the one verifier registry (``posttrain.rl.task.VERIFIERS``, RL's rewards): a sample
    passes at full reward."""
    if verifier not in VERIFIERS:
        raise ValueError(f"unknown verifier {verifier!r} (choose from {', '.join(VERIFIERS)})")
    return _passes(VERIFIERS[verifier])


def _passes(verify: Callable[[str, dict[str, Any], bool], float]) -> Check:
    return lambda completion, row, stopped: verify(completion, row, stopped) >= 1.0


@register("countdown")
def countdown_task(opts: TaskOptions) -> EvalTask:
    """The RL debug family (``posttrain/rl/task.py``): ``"n:"`` → digits n−1 … 0, exact match."""
    from posttrain.rl.task import countdown_rows

    return EvalTask(countdown_rows(opts.problems, seed=opts.seed), check_of("exact"), opts.max_new_tokens or 16)


@register("jsonl")
def jsonl_task(opts: TaskOptions) -> EvalTask:
    """Rows ``{"id", "prompt" | "messages", "answer"}`` from ``--data``, checked by ``--verifier``."""
    if not opts.data:
        raise ValueError("--task jsonl needs --data FILE.jsonl")
    check = check_of(opts.verifier)
    rows = fs.read_jsonl(opts.data)
    for i, r in enumerate(rows):
        r.setdefault("id", str(i))
    return EvalTask(rows, check, opts.max_new_tokens or 256, str(Path(opts.data).parent))


@register("lemma-chain")
def lemma_chain_task(opts: TaskOptions) -> EvalTask:
    """The lemma agent's generated multi-step problems (``posttrain/lemma/tasks.py``), the fixed-seed test split;
    an answer passes when its last ``ANSWER:`` (or ``\\boxed{}``) equals the reference by math-verify."""
    from posttrain.lemma.tasks import train_test_split, verify_answer

    _, test = train_test_split(0, opts.problems, seed=opts.seed)
    return EvalTask(test, _passes(verify_answer), opts.max_new_tokens or 512)


# --- sampling ----------------------------------------------------------------------------------------------------


@dataclass
class Sample:
    text: str
    stopped: bool
    passed: bool


@dataclass
class ProblemResult:
    id: str
    samples: list[Sample] = field(default_factory=list)

    @property
    def correct(self) -> int:
        return sum(s.passed for s in self.samples)


def sample(
    engine: Any,
    tokenizer: Any,
    task: EvalTask,
    n: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
    prompts: dict[str, tuple[list[int], Any, tuple]] | None = None,
) -> list[ProblemResult]:
    """``n`` samples per problem through ``engine`` (any ``RolloutEngine``), decoded and checked; ``prompts``
    (:func:`encode_prompts`): each row's prompt ids, pixel values and decoded images, rows without one skipped."""
    stop = tuple(t for t in (tokenizer.eos_token_id,) if t is not None)
    prompts = prompts if prompts is not None else encode_prompts(task, tokenizer)[0]
    results = {str(r["id"]): ProblemResult(str(r["id"])) for r in task.rows if str(r["id"]) in prompts}
    by_id = {str(r["id"]): r for r in task.rows}
    requests = []
    for p, row in enumerate(task.rows):
        ids, pixels, images = prompts.get(str(row["id"]), (None, None, ()))
        for j in range(n if ids is not None else 0):
            seed_j = seed * 1_000_003 + p * 10_007 + j
            params = SamplingParams(task.max_new_tokens, temperature, top_p, seed=seed_j, stop_token_ids=stop)
            requests.append(
                Request(f"{row['id']}/{j}", ids, params, str(row["id"]), pixel_values=pixels, images=images)
            )
    for traj in run_all(engine, requests, progress=progress):
        row = by_id[traj.request.group_id]
        text, stopped = response(traj, row, tokenizer)  # as RL's reward reads it
        results[traj.request.group_id].samples.append(Sample(text, stopped, bool(task.check(text, row, stopped))))
    return list(results.values())


def encode_prompts(
    task: EvalTask, tokenizer: Any, processor: Any = None
) -> tuple[dict[str, tuple[list[int], Any, tuple]], list[dict[str, str]]]:
    """Each row's ``posttrain.rl.task.encode_prompt`` (as RL feeds them: image rows through ``processor``); a row
    whose image fails is skipped, with its reason."""
    from formats.chat_images import BadImage

    prompts, skipped = {}, []
    for row in task.rows:
        try:
            prompts[str(row["id"])] = encode_prompt(row, tokenizer, processor, task.base)
        except BadImage as e:
            skipped.append({"id": str(row["id"]), "reason": e.reason, "detail": str(e)})
    return prompts, skipped


def summarise(results: Sequence[ProblemResult], ks: Iterable[int]) -> dict[str, float]:
    """Mean over problems of each pass@k."""
    return {f"pass@{k}": sum(pass_at_k(len(r.samples), r.correct, k) for r in results) / len(results) for k in ks}


def evaluate(
    make_engine: Callable[[], Any],
    tokenizer: Any,
    task: EvalTask,
    n: int,
    ks: Sequence[int],
    repeats: int = 1,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    progress: bool = True,
    processor: Any = None,
) -> dict[str, Any]:
    """``repeats`` independent runs of :func:`sample`; summary = mean over runs (``_std``: their spread); rows whose
    images fail are skipped (``skipped``: id and reason each)."""
    from posttrain.fit import progress_bar

    _check_ks(ks, n)
    prompts, skipped = encode_prompts(task, tokenizer, processor)
    if not prompts:
        raise ValueError(f"no problem left to sample: {len(skipped)} skipped ({skipped[:3]})")
    bar = progress_bar(repeats * n * len(prompts), progress, unit="sample")
    runs = [
        sample(make_engine(), tokenizer, task, n, temperature, top_p, seed + r, bar.update, prompts)
        for r in range(repeats)
    ]
    bar.close()
    return _over_runs(runs, n, ks, len(prompts)) | {"skipped": skipped}


def _check_ks(ks: Sequence[int], n: int) -> None:
    """Refuse a pass@k that ``n`` samples per problem cannot give, before any sampling."""
    for k in ks:
        if k > n:
            raise ValueError(f"pass@{k} needs --n ≥ {k}")


def _over_runs(results: list[list[ProblemResult]], n: int, ks: Sequence[int], problems: int) -> dict[str, Any]:
    """Each run's summary and problems, and over the runs each pass@k's mean and (``_std``) its spread."""
    runs = [{"summary": summarise(rs, ks), "problems": [_problem_json(p, ks) for p in rs]} for rs in results]
    out: dict[str, Any] = {"n": n, "k": list(ks), "repeats": len(runs), "problems_count": problems}
    for k in ks:
        vals = [run["summary"][f"pass@{k}"] for run in runs]
        mean = sum(vals) / len(vals)
        out[f"pass@{k}"] = mean
        out[f"pass@{k}_std"] = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
    out["runs"] = runs
    return out


def evaluate_agentic(
    make_engine: Callable[[], Any],
    tokenizer: Any,
    n: int,
    ks: Sequence[int],
    repeats: int = 1,
    tasks: int | None = None,
    max_turns: int = 6,
    max_tokens: int = 192,
    seed: int = 0,
    on_session: Callable[[str, Any], None] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """pass@k on the agentic coding tasks (``posttrain.agentic.tasks.coding_tasks``): per task, ``n`` sessions of the
    harness (``SimpleHarness``, its own tools and stop rule) against the model behind the gateway on 127.0.0.1, each
    in a fresh copy of the task's repository, graded by the task's hidden tests in the jail. A session passes when
    every fail-to-pass and pass-to-pass test passes. A verdict of INFRA (the grader could not grade) counts as a
    failure and is counted under ``infra``. Sessions are named ``TASK-rREPEAT:J``; ``on_session(name, task)``
    runs before each one (scripted policies use it)."""
    import tempfile

    from posttrain.agentic.gateway import Gateway, GatewayConfig, ServerThread, build_app
    from posttrain.agentic.tasks import INFRA, PASS, SimpleHarness, coding_tasks, verify
    from posttrain.fit import progress_bar

    _check_ks(ks, n)
    family = coding_tasks()[:tasks]
    bar = progress_bar(repeats * n * len(family), progress, unit="session")
    runs, infra = [], 0
    for r in range(repeats):
        gw = Gateway(make_engine(), tokenizer, GatewayConfig(default_max_tokens=max_tokens, seed=seed + r))
        with ServerThread(build_app(gw)) as url:
            results = []
            for task in family:
                res = ProblemResult(task.task_id)
                for j in range(n):
                    session = f"{task.task_id}-r{r}:{j}"
                    if on_session is not None:
                        on_session(session, task)
                    with tempfile.TemporaryDirectory() as tmp:
                        work = task.setup(Path(tmp))
                        run = SimpleHarness(url + "/v1", session, max_turns=max_turns).run(task.objective, work)
                        verdict = verify(task, work)
                    infra += verdict.status == INFRA
                    res.samples.append(Sample(run.final_text, run.stopped_by == "answer", verdict.status == PASS))
                    bar.update(1)
                results.append(res)
        runs.append(results)
    bar.close()
    return _over_runs(runs, n, ks, len(family)) | {"infra": infra}


def _problem_json(p: ProblemResult, ks: Sequence[int]) -> dict[str, Any]:
    return {
        "id": p.id,
        "n": len(p.samples),
        "correct": p.correct,
        **{f"pass@{k}": pass_at_k(len(p.samples), p.correct, k) for k in ks},
        "samples": [{"text": s.text, "stopped": s.stopped, "passed": s.passed} for s in p.samples],
    }


# --- perplexity --------------------------------------------------------------------------------------------------


def perplexity(
    model: Any, shards: str, seq_len: int = 512, max_chunks: int | None = None, progress: bool = True
) -> dict[str, Any]:
    """Token-level perplexity of ``model`` on the text tokens of a build's shards (``scifolio build --out``).

    Each chunk's text segments, in order, are one token stream (image segments are skipped: a text-only LM never
    saw their slots); the stream is cut into windows of ``seq_len`` scored independently, each window's first
    token unscored. ppl = exp(Σ NLL / Σ scored tokens)."""
    import torch
    import torch.nn.functional as F

    from formats.shards import iter_chunks, list_shards
    from posttrain.fit import progress_bar

    nll, count, chunks = 0.0, 0, 0
    vocab = model.get_input_embeddings().num_embeddings
    files = list_shards(shards)
    if not files:
        raise FileNotFoundError(f"no shards under {shards}")
    bar = progress_bar(None, progress, unit="chunk")
    model.eval()
    for chunk in (c for path in files for c in iter_chunks(path, parts=("segments",))):
        ids = [t for s in chunk.segments if s.kind == "text" for t in s.token_ids]
        if max(ids, default=0) >= vocab:
            raise ValueError(f"token id {max(ids)} ≥ model vocab {vocab}: shards use another tokenizer")
        for start in range(0, len(ids) - 1, seq_len):
            window = torch.tensor([ids[start : start + seq_len]])
            if window.shape[1] < 2:
                continue
            with torch.no_grad():
                logits = model(input_ids=window).logits.float()
            nll += F.cross_entropy(logits[0, :-1], window[0, 1:], reduction="sum").item()
            count += window.shape[1] - 1
        chunks += 1
        bar.update(1)
        if max_chunks is not None and chunks >= max_chunks:
            break
    bar.close()
    if count == 0:
        raise ValueError(f"no text tokens in {shards}")
    return {"perplexity": math.exp(nll / count), "nll_per_token": nll / count, "tokens": count, "chunks": chunks}
