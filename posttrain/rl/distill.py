"""Two-teacher on-policy distillation stage (SPEC §C8, Eq 31–36), run on the RL loop's engine and learner pieces.

Each query carries one domain (``reasoning`` / ``agentic``) and is routed to that domain's teacher only
(``DomainRouter``). The student samples on-policy through a rollout engine (``HFEngine``); the teacher of
each query returns only the sampled tokens' logprobs (``TeacherScorer.run_batch``, O(H) numbers per
response); the per-token advantage is ``Â_t = sg[log π_T(y_t) − log π_prox(y_t)]`` against the student
frozen at the start of the batch, weighted by λ_d per domain, inside the Eq 29 objective
(``distill.distill_loss``). An optional SFT warm-up first fits the student to teacher trajectories.

    scifolio posttrain distill --config debug --out runs/opd        # builds tiny teachers + student
    scifolio posttrain distill --config experts --out runs/opd \
        --teacher reasoning=runs/expert-r/policy --teacher agentic=runs/expert-a/policy --student runs/sft/policy \
        --prompts reasoning=reasoning.jsonl --prompts agentic=agentic.jsonl
    python -c "from posttrain.rl.distill import run, debug; run(debug(), 'runs/opd')"

Two recipes, two sources of models and prompts (``DistillConfig.toy``):
- ``debug`` builds its own models: two tiny teachers trained briefly on two different toy languages (the
  reasoning teacher counts up by one after a domain marker, the agentic one counts down by two, both with a little
  noise) and a random tiny student; prompts come from the toy generator (``prompts``). No path may be set.
- ``experts`` loads real ones: ``teacher_paths`` (domain → Hugging Face directory, e.g. two ``posttrain sft`` runs'
  ``DIR/policy`` started from one SFT checkpoint), ``student_path`` and ``prompts`` (domain → jsonl, one row
  ``{"prompt": ...}`` or ``{"messages": [...]}`` a line; a chat is rendered with the student's chat template and
  its generation prompt, a plain prompt is ``bos + prompt``: ``posttrain.rl.task.prompt_ids``). Every teacher's
  tokenizer must equal the student's (same tokens, same ids, same special tokens): OPD compares logprobs of the
  same token ids, so a mismatch is refused before any model is loaded (``TokenizerMismatch``).

Files under ``out``: ``config.json``, ``metrics.jsonl`` (one row per step: loss, per-domain sampled teacher-logprob
gap and, with ``eval_queries`` > 0, the reverse KL on fixed evaluation prompts), ``checkpoint/`` and ``policy/``
(the student as a Hugging Face checkpoint, with the student's tokenizer when it has one).

Run the tests: ``python -m pytest tests/posttrain/rl/test_distill_stage.py -q``
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from formats.overrides import with_overrides
from posttrain.fit import FitConfig, fit
from posttrain.objectives.distill import DomainRoute, DomainRouter, opd_advantage
from posttrain.objectives.policy_loss import ClipConfig
from posttrain.rl import engines
from posttrain.rl.engines import EngineConfig, PolicyConfig
from posttrain.rl.learner import pack, padded, token_logprobs
from posttrain.rl.loop import Stage, Warmup, run_stage
from posttrain.rl.task import prompt_ids
from posttrain.rl.teachers import TeacherConfig, TeacherScorer
from posttrain.rollout.engine import run_all
from posttrain.rollout.engines.hf import HFEngine
from posttrain.rollout.sampling import sampling_logprobs
from posttrain.rollout.scheduler import Batch
from posttrain.rollout.types import Request, SamplingParams, Trajectory

DOMAINS = ("reasoning", "agentic")
MARKER = {"reasoning": 1, "agentic": 2}
"""Debug toy language: the first prompt token names the domain."""
STEP = {"reasoning": 1, "agentic": -2}
"""Debug toy language: each next content token is the previous one plus this (mod the content size)."""
FIRST_CONTENT = 3


@dataclass(frozen=True)
class DistillConfig:
    """One OPD run."""

    vocab_size: int = 16
    """Debug models: vocabulary (0 unused, 1–2 domain markers, the rest content tokens)."""
    teacher_hidden: int = 64
    """Debug teacher width (2 layers)."""
    teacher_steps: int = 200
    """Debug teachers: Adam steps on their toy language."""
    teacher_noise: float = 0.1
    """Debug teachers: fraction of random tokens in their training text (keeps them stochastic)."""
    toy: bool = True
    """True (``debug``): toy teachers, student and prompts built on the spot, and no path may be set. False
    (``experts``): ``teacher_paths``, ``student_path`` and ``prompts`` must all be given."""
    teacher_paths: dict[str, str] = field(default_factory=dict)
    """domain → local HF directory of its teacher, with its tokenizer (``--teacher DOMAIN=DIR``; ``experts`` only)."""
    student_path: str | None = None
    """Local HF directory of the student, with its tokenizer (``--student DIR``; ``experts`` only). With ``toy`` the
    student is ``policy`` (``policy.arch=qwen2_moe``: an MoE student, its routes replayed by R3)."""
    policy: PolicyConfig = field(default_factory=lambda: PolicyConfig(hidden_size=32))
    """The toy student (width, depth, arch, dtype, seed), as in every stage; its path is ``student_path``."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """The student's rollout engine: ``hf``, in process or on Ray (``engine.ray``)."""
    prompts: dict[str, str] = field(default_factory=dict)
    """domain → jsonl of prompts, rows ``{"prompt": ...}`` or ``{"messages": [...]}`` (``--prompts DOMAIN=FILE``;
    ``experts`` only: one file per teacher domain)."""
    weights: dict[str, float] = field(default_factory=lambda: {"reasoning": 1.0, "agentic": 1.0})
    """λ_d per domain (Eq 36)."""
    steps: int = 30
    """OPD steps (one batch sampled, scored and trained on per step)."""
    queries_per_domain: int = 16
    """Queries of each domain per batch."""
    samples_per_query: int = 4
    """Student samples per query."""
    prompt_len: int = 3
    """Debug prompts: domain marker + this many tokens (random noise, then a start token)."""
    max_new_tokens: int = 8
    """Response length."""
    temperature: float = 1.0
    """Student sampling temperature (the learner uses the same transform)."""
    lr: float = 3e-3
    """Student Adam learning rate."""
    updates_per_batch: int = 2
    """Optimizer steps per batch (after the first, π_θ ≠ π_prox: the proximal anchor matters)."""
    clip_low: float = 0.2
    """Eq 11 weight floor 1 − clip_low."""
    clip_high: float = 0.2
    """Eq 11 weight ceiling 1 + clip_high."""
    sft_steps: int = 40
    """Optional warm-up: student CE steps on teacher-sampled trajectories before OPD (0: none). From a random
    student, plain OPD on the debug languages only learned the content-token marginal within 40 steps (the
    counting rule is found by sampling it, 1 in 13); a short warm-up gives it a foothold."""
    eval_queries: int = 16
    """Queries per domain for the reverse-KL metric (0: none). Toy: held-out prompts; files: a fixed seeded
    sample of each domain's file (held out only from the order, not from training)."""
    seed: int = 0
    """Seeds models, data and sampling."""
    torch_threads: int = 1
    """torch intra-op threads (0: leave torch's default)."""


def debug(**overrides: Any) -> DistillConfig:
    """Tiny teachers and student built on the spot, toy prompts (~10–20 s on 2 busy cores); takes no paths."""
    return DistillConfig(**overrides)


def experts(**overrides: Any) -> DistillConfig:
    """Real teachers and student from paths, real prompts from one jsonl file per domain (what a run needs: the
    module docstring; the student may be the experts' common SFT checkpoint's ``DIR/policy``). Memory: the student
    in fp32 with Adam state plus every teacher in fp32 on the CPU (a 0.5B student and two 0.5B teachers need
    ~12 GB; ``max_new_tokens``, ``queries_per_domain`` and ``samples_per_query`` size the run). Responses stop at
    the tokenizer's EOS."""
    cfg = DistillConfig(
        toy=False,
        steps=200,
        queries_per_domain=8,
        samples_per_query=4,
        max_new_tokens=256,
        lr=1e-6,
        sft_steps=0,
        eval_queries=8,
        torch_threads=0,
    )
    return with_overrides(cfg, overrides)


RECIPES: dict[str, Callable[..., DistillConfig]] = {"debug": debug, "experts": experts}


class DistillRefused(ValueError):
    """A distillation the stage will not start (paths with the toy recipe, a missing file or domain); the message
    says what to change."""


class TokenizerMismatch(DistillRefused):
    """A teacher's tokenizer is not the student's: their logprobs would be of different tokens."""


def check_config(cfg: DistillConfig) -> None:
    """Refuse a config whose models and prompts do not fit its recipe (raises ``DistillRefused``)."""
    given = [k for k in ("teacher_paths", "student_path", "prompts") if getattr(cfg, k)]
    if cfg.toy:
        if given:
            raise DistillRefused(
                f"{', '.join(given)} given to the toy recipe (debug builds its own models and prompts): "
                "real teachers, student and prompt files need --config experts"
            )
        return
    missing = [k for k in ("teacher_paths", "student_path", "prompts") if not getattr(cfg, k)]
    if missing:
        raise DistillRefused(
            f"--config experts needs teachers, a student and prompt files; missing: {', '.join(missing)} "
            "(--teacher DOMAIN=DIR ..., --student DIR, --prompts DOMAIN=FILE ...)"
        )
    if set(cfg.prompts) != set(cfg.teacher_paths):
        raise DistillRefused(
            f"one prompt file per teacher domain: teachers {sorted(cfg.teacher_paths)}, prompts {sorted(cfg.prompts)}"
        )
    for what, path in [("student", cfg.student_path), *((f"teacher {d!r}", p) for d, p in cfg.teacher_paths.items())]:
        if not Path(path).is_dir():
            raise DistillRefused(f"{what}: {path} is not a model directory")
    for d, path in cfg.prompts.items():
        if not Path(path).is_file():
            raise DistillRefused(f"prompts {d!r}: no file {path}")


def load_tokenizer(path: str, what: str) -> Any:
    """The tokenizer saved in model directory ``path`` (refused when there is none: OPD must compare it)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise DistillRefused(f"{what} at {path} has no loadable tokenizer ({e}); save it beside the model") from None


def check_tokenizers(student: Any, student_path: str, teachers: dict[str, tuple[Any, str]]) -> None:
    """Every teacher's vocabulary (token → id) and special-token ids equal the student's, else ``TokenizerMismatch``
    naming the teacher and the first differences."""
    sv = student.get_vocab()
    specials = ("bos_token_id", "eos_token_id", "pad_token_id")
    for d, (tok, path) in teachers.items():
        tv = tok.get_vocab()
        diffs = []
        if tv != sv:
            only_t, only_s = sorted(tv.keys() - sv.keys()), sorted(sv.keys() - tv.keys())
            moved = sorted(t for t in tv.keys() & sv.keys() if tv[t] != sv[t])
            diffs.append(f"{len(tv)} vs {len(sv)} tokens")
            if only_t:
                diffs.append(f"{len(only_t)} only in the teacher (e.g. {only_t[:3]})")
            if only_s:
                diffs.append(f"{len(only_s)} only in the student (e.g. {only_s[:3]})")
            if moved:
                diffs.append(f"{len(moved)} at other ids (e.g. {moved[0]!r}: {tv[moved[0]]} vs {sv[moved[0]]})")
        for k in specials:
            if getattr(tok, k) != getattr(student, k):
                diffs.append(f"{k} {getattr(tok, k)} vs {getattr(student, k)}")
        if diffs:
            raise TokenizerMismatch(
                f"tokenizer mismatch: teacher {d!r} ({path}) vs student ({student_path}): {'; '.join(diffs)}. "
                "OPD scores the student's sampled token ids with the teacher, so both must share one tokenizer "
                "(distil from experts fine-tuned from the student's own checkpoint)"
            )


# -- prompts -----------------------------------------------------------------------------------------------------
class ToyPrompts:
    """The debug recipe's prompts: the toy generator, one seeded stream for training and one for evaluation."""

    def __init__(self, cfg: DistillConfig, domains: list[str]) -> None:
        self.cfg = cfg
        self.gen = torch.Generator().manual_seed(cfg.seed + 1)
        eval_gen = torch.Generator().manual_seed(cfg.seed + 999_999)
        self.eval = {d: prompts(cfg, d, cfg.eval_queries, eval_gen) for d in domains} if cfg.eval_queries else {}

    def draw(self, domain: str, n: int) -> list[list[int]]:
        return prompts(self.cfg, domain, n, self.gen)

    def state_dict(self) -> dict[str, Any]:
        return {"gen": self.gen.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.gen.set_state(state["gen"])


class FilePrompts:
    """Prompts of each domain from its jsonl file, tokenised once (``prompt_ids``: chats through the student's chat
    template); each domain cycles through its rows in a seeded order per epoch, the cursor resumes with the run."""

    def __init__(self, files: dict[str, str], tokenizer: Any, seed: int, eval_queries: int) -> None:
        self.seed = seed
        self.rows = {d: read_prompts(path, tokenizer) for d, path in files.items()}
        self.cursor = dict.fromkeys(files, 0)
        self.eval = {}
        for d, rows in self.rows.items():
            if eval_queries:
                picked = random.Random(f"{seed}/eval/{d}").sample(range(len(rows)), min(eval_queries, len(rows)))
                self.eval[d] = [rows[i] for i in picked]

    def draw(self, domain: str, n: int) -> list[list[int]]:
        rows, out = self.rows[domain], []
        for _ in range(n):
            epoch, i = divmod(self.cursor[domain], len(rows))
            order = list(range(len(rows)))
            random.Random(f"{self.seed}/{domain}/{epoch}").shuffle(order)
            out.append(rows[order[i]])
            self.cursor[domain] += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"cursor": dict(self.cursor)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cursor = dict(state["cursor"])


def read_prompts(path: str, tokenizer: Any) -> list[list[int]]:
    """Token ids of every row of a prompt file (``{"prompt": str}`` or ``{"messages": [...]}``); a bad row is an
    error naming its line (a prompt file is small and hand-made: better to fix it than to train around it)."""
    from formats import fs

    out = []
    for n, line in enumerate(fs.read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or not (isinstance(row.get("prompt"), str) or "messages" in row):
                raise ValueError('expected {"prompt": str} or {"messages": [...]}')
            ids = prompt_ids(row, tokenizer)
        except (ValueError, TypeError, KeyError) as e:
            raise DistillRefused(f"{path}:{n}: {e}") from None
        if not ids:
            raise DistillRefused(f"{path}:{n}: an empty prompt")
        out.append(ids)
    if not out:
        raise DistillRefused(f"{path}: no prompts")
    return out


# -- debug models and data ---------------------------------------------------------------------------------------
def toy_sequences(cfg: DistillConfig, domain: str, n: int, gen: torch.Generator, length: int) -> Tensor:
    """``[n, length]`` text of one domain's toy language: marker, noise, then a counting run."""
    m = cfg.vocab_size - FIRST_CONTENT
    noise = torch.randint(0, m, (n, cfg.prompt_len - 1), generator=gen)
    start = torch.randint(0, m, (n, 1), generator=gen)
    run = (start + STEP[domain] * torch.arange(length - cfg.prompt_len).unsqueeze(0)) % m
    body = torch.cat([noise, run], dim=1)
    flip = torch.rand(body.shape, generator=gen) < cfg.teacher_noise
    flip[:, : cfg.prompt_len] = False
    body = torch.where(flip, torch.randint(0, m, body.shape, generator=gen), body)
    return torch.cat([torch.full((n, 1), MARKER[domain]), body + FIRST_CONTENT], dim=1)


def prompts(cfg: DistillConfig, domain: str, n: int, gen: torch.Generator) -> list[list[int]]:
    return toy_sequences(cfg, domain, n, gen, cfg.prompt_len + 1)[:, : cfg.prompt_len + 1].tolist()


def train_teacher(cfg: DistillConfig, domain: str) -> torch.nn.Module:
    """A tiny LM fitted briefly to one domain's toy language (it never sees the other domain)."""
    teacher = PolicyConfig(hidden_size=cfg.teacher_hidden, seed=cfg.seed + 100 + MARKER[domain])
    model = engines.build_policy(teacher, vocab_size=cfg.vocab_size, max_position_embeddings=64)[0]
    gen = torch.Generator().manual_seed(cfg.seed + 7 * MARKER[domain])
    n = cfg.prompt_len + 1 + cfg.max_new_tokens
    texts = (toy_sequences(cfg, domain, 64, gen, n) for _ in range(cfg.teacher_steps))
    fit(model, texts, lambda m, x: m(input_ids=x, labels=x).loss, FitConfig(lr=3e-3, optimizer="adam"))
    return model


# -- the stage ---------------------------------------------------------------------------------------------------
class DistillStage(Stage):
    """``posttrain distill`` (the module docstring) as a stage of the one driver (``posttrain.rl.loop.run_stage``);
    π_prox is the student the learner scores the batch with at the start of its update."""

    name = "posttrain distill"

    def __init__(
        self,
        cfg: DistillConfig,
        student: torch.nn.Module,
        teachers: dict[str, torch.nn.Module],
        tokenizer: Any = None,
        source: ToyPrompts | FilePrompts | None = None,
    ) -> None:
        from posttrain.rl.learner import Learner, LearnerConfig

        self.cfg, self.steps, self.tokenizer = cfg, cfg.steps, tokenizer
        lcfg = LearnerConfig(
            lr=cfg.lr,
            n_minibatches=1,
            update_epochs=cfg.updates_per_batch,
            clip=ClipConfig(eps_low=cfg.clip_low, eps_high=cfg.clip_high),
            bkl_phi=0.0,
            grad_clip=0.0,
            seed=cfg.seed,
        )
        self.learner = Learner(student, lcfg, temperature=cfg.temperature, total_versions=cfg.steps)
        self.student, self.teachers = student, teachers
        self.router = DomainRouter({d: DomainRoute(teacher=d, weight=cfg.weights.get(d, 1.0)) for d in teachers})
        self.scorer = TeacherScorer(TeacherConfig(path="<in-process>"))
        self.moe = engines.config_is_moe(student.config)  # R3: the engine records routes, the learner replays them
        self.engine = engines.start_engine(cfg, self.learner.weights(), 0, capacity=256, model=student)
        self.source = source if source is not None else ToyPrompts(cfg, list(teachers))
        self.teacher_calls: list[tuple[str, list[str]]] = []
        self.eval_prompts = self.source.eval
        eos = None if tokenizer is None else tokenizer.eos_token_id
        self.stop = () if eos is None else (int(eos),)  # toy languages have no EOS: fixed-length responses
        self._step = 0

    # -- the driver's stage protocol ----------------------------------------------------------------------------
    def warmup(self) -> Warmup:
        """``sft_steps`` steps of student CE on teacher-sampled trajectories (each domain's own teacher), with the
        learner's optimizers; step 0 is the held-out reverse KL before OPD (and the last SFT loss)."""

        def teacher_samples() -> Iterator[Any]:
            for s in range(self.cfg.sft_steps):
                trajs = []
                for d, teacher in self.teachers.items():
                    ps = {d: self.source.draw(d, self.cfg.queries_per_domain)}
                    trajs += run_all(HFEngine(teacher, capacity=256), self._requests(f"sft{s}", ps, 1, 10**6 * s))
                yield pack(trajs)

        def nll(model: torch.nn.Module, p: Any) -> Tensor:
            return -(token_logprobs(model, p) * p.response_mask).sum() / p.response_mask.sum()

        def after(losses: list[float]) -> dict[str, Any]:
            return {**({"sft_loss": losses[-1]} if losses else {}), **self.evaluate()}

        return Warmup(teacher_samples(), after, loss=nll, learner_optimizers=True)

    def collect(self) -> Batch:
        cfg = self.cfg
        self._step += 1
        by_domain = {d: self.source.draw(d, cfg.queries_per_domain) for d in self.teachers}
        reqs = self._requests(f"s{self._step}", by_domain, cfg.samples_per_query, 1000 * self._step, routes=self.moe)
        trajs = run_all(self.engine, reqs)
        groups: dict[str, list[Trajectory]] = {}
        for t in trajs:
            groups.setdefault(t.group_id, []).append(t)
        ordered = [t for g in groups.values() for t in g]
        scored = self.teacher_logprobs(ordered)[0]
        lp = [row[: t.n_tokens].tolist() for row, t in zip(scored, ordered)]
        return Batch(list(groups.values()), self.learner.version, teacher_logprobs=lp)

    def train(self, batch: Batch) -> dict[str, Any]:
        trajs = [t for g in batch.groups for t in g]
        p = pack(trajs)
        teacher_lp = padded(batch.teacher_logprobs, p.behaviour)
        domains = [t.request.meta["domain"] for t in trajs]
        weights = self.router.route(domains).weights
        proximal: list[Tensor] = []

        def advantage(prox: Tensor) -> Tensor:  # Eq 33–36: λ_d · sg[log π_T − log π_prox] on response tokens
            proximal.append(prox)
            adv = torch.where(p.response_mask, opd_advantage(teacher_lp, prox), torch.zeros_like(prox))
            return adv * weights.to(adv.dtype).unsqueeze(-1)

        row: dict[str, Any] = self.learner.update(p, advantage)
        for d in self.teachers:
            rows = torch.tensor([x == d for x in domains])
            mask = p.response_mask[rows]
            gap = ((proximal[0][rows] - teacher_lp[rows]) * mask).sum() / mask.sum()
            row[f"gap_{d}"] = float(gap)  # mean log π_S − log π_T on the student's own samples
        row.update(self.evaluate())
        return row

    def state_dict(self) -> dict[str, Any]:
        return {"prompts": self.source.state_dict(), "step": self._step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.source.load_state_dict(state["prompts"])
        self._step = state["step"]
        self.sync()

    def _requests(
        self, tag: str, by_domain: dict[str, list[list[int]]], n: int, seed0: int, routes: bool = False
    ) -> list[Request]:
        kw = dict(stop_token_ids=self.stop, ignore_eos=not self.stop, return_routed_experts=routes)
        base, reqs = SamplingParams(self.cfg.max_new_tokens, self.cfg.temperature, **kw), []
        for d, ps in by_domain.items():
            for qi, p in enumerate(ps):
                for s in range(n):
                    sp = replace(base, seed=seed0 + len(reqs))
                    reqs.append(Request(f"{tag}-{d}-{qi}-{s}", p, sp, group_id=f"{tag}-{d}-{qi}", meta={"domain": d}))
        return reqs

    def teacher_logprobs(self, trajs: list[Trajectory]) -> tuple[Tensor, Tensor]:
        """``[B, T]`` log π_T(y_t) of each sampled token, each row scored ONLY by its domain's teacher; and λ_d ``[B]``."""
        p = pack(trajs)
        routed = self.router.route([t.request.meta["domain"] for t in trajs])
        answers = {}
        for name, idx in routed.by_teacher.items():
            self.teacher_calls.append((name, [trajs[i].request_id for i in idx.tolist()]))
            lp = self.scorer.run_batch(p.input_ids[idx], p.attention_mask[idx], self.teachers[name])  # [n, L]
            answers[name] = lp.gather(1, p.positions[idx] + 1)  # the sampled token's logprob only
        return DomainRouter.assemble(routed, answers, tuple(p.tokens.shape)), routed.weights

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Held-out reverse KL(π_S ‖ π_T) per domain, exact over the vocabulary, on the student's samples."""
        out: dict[str, float] = {}
        if not self.eval_prompts:
            return out
        eng = HFEngine(copy.deepcopy(self.student).eval(), capacity=256)
        for d, ps in self.eval_prompts.items():
            trajs = run_all(eng, self._requests(f"eval-{d}", {d: ps}, 1, 777))
            p = pack(trajs)
            s_logits = self.student(input_ids=p.input_ids, attention_mask=p.attention_mask).logits
            t_logits = self.teachers[d](input_ids=p.input_ids, attention_mask=p.attention_mask).logits
            v = min(s_logits.shape[-1], t_logits.shape[-1])  # real models may pad their vocabularies differently
            idx = p.positions.unsqueeze(-1).expand(-1, -1, v)
            ls = sampling_logprobs(s_logits[..., :v].gather(1, idx), self.cfg.temperature)
            lt = sampling_logprobs(t_logits[..., :v].gather(1, idx))
            kl = (ls.exp() * (ls - lt)).sum(-1)
            m = p.response_mask.float()
            out[f"rkl_{d}"] = float((kl * m).sum() / m.sum())
        return out


def build(cfg: DistillConfig) -> DistillStage:
    """The stage of ``cfg``: toy models and prompts (``debug``), or teachers, student and prompt files from their
    paths (``experts``), tokenizers checked before any model is loaded. Raises ``DistillRefused``."""
    check_config(cfg)
    cfg = engines.resolve(cfg, ("hf",), "posttrain distill")
    if cfg.policy.path is not None:
        raise DistillRefused(
            f"policy.path={cfg.policy.path}: the student of posttrain distill is student_path (--student)"
        )
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    if cfg.toy:
        teachers = {d: train_teacher(cfg, d) for d in DOMAINS}
        student = engines.build_policy(cfg.policy, vocab_size=cfg.vocab_size, max_position_embeddings=64)[0]
        return DistillStage(cfg, student.eval(), teachers)
    tokenizer = load_tokenizer(cfg.student_path, "student")
    check_tokenizers(
        tokenizer, cfg.student_path, {d: (load_tokenizer(p, f"teacher {d!r}"), p) for d, p in cfg.teacher_paths.items()}
    )
    source = FilePrompts(cfg.prompts, tokenizer, cfg.seed, cfg.eval_queries)
    teachers = {d: TeacherScorer(TeacherConfig(path=path)).load() for d, path in cfg.teacher_paths.items()}
    student = engines.build_policy(PolicyConfig(path=cfg.student_path), tokenizer=tokenizer)[0]  # fp32 master weights
    return DistillStage(cfg, student.eval(), teachers, tokenizer, source)


def run(cfg: DistillConfig, out: str | Path, progress: bool = False, resume: bool = False) -> list[dict[str, Any]]:
    """The one driver over a ``DistillStage``: step 0 (SFT warm-up + evaluation), then ``cfg.steps`` OPD steps;
    ``out/policy`` is the distilled student. Returns every row, step 0 included."""
    from formats.rundir import RunDir

    rows = run_stage(build(cfg), out, resume=resume, progress=progress)
    return [r for r in RunDir(out, resume=True).rows() if r["step"] == 0] + rows
