"""Two-teacher on-policy distillation stage (SPEC §C8, Eq 31–36), run on the RL loop's engine and learner pieces.

Each query carries one domain (``reasoning`` / ``agentic``) and is routed to that domain's teacher only
(``DomainRouter``). The student samples on-policy through a rollout engine (``HFEngine``); the teacher of
each query returns only the sampled tokens' logprobs (``TeacherScorer.run_batch``, O(H) numbers per
response); the per-token advantage is ``Â_t = sg[log π_T(y_t) − log π_prox(y_t)]`` against the student
frozen at the start of the batch, weighted by λ_d per domain, inside the Eq 29 objective
(``distill.distill_loss``). An optional SFT warm-up first fits the student to teacher trajectories.

    scifolio posttrain distill --config debug --out runs/opd        # builds tiny teachers + student
    python -c "from posttrain.rl.distill import run, debug; run(debug(), 'runs/opd')"

``debug`` builds its own models: two tiny teachers trained briefly on two different toy languages (the
reasoning teacher counts up by one after a domain marker, the agentic one counts down by two, both with
a little noise) and a random tiny student. Files under ``out``: ``metrics.jsonl`` (one row per step:
loss, per-domain sampled teacher-logprob gap and held-out reverse KL) and ``student/`` (HF checkpoint).

Run the tests: ``python -m pytest tests/posttrain/rl/test_distill_stage.py -q``
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from posttrain.objectives.distill import DomainRoute, DomainRouter, opd_advantage
from posttrain.objectives.policy_loss import ClipConfig
from posttrain.rl.learner import pack, token_logprobs
from posttrain.rl.teachers import TeacherConfig, TeacherScorer
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
    student_hidden: int = 32
    """Debug student width (2 layers)."""
    teacher_hidden: int = 64
    """Debug teacher width (2 layers)."""
    teacher_steps: int = 200
    """Debug teachers: Adam steps on their toy language."""
    teacher_noise: float = 0.1
    """Debug teachers: fraction of random tokens in their training text (keeps them stochastic)."""
    teacher_paths: dict[str, str] = field(default_factory=dict)
    """domain → local HF checkpoint of its teacher; empty builds the debug teachers."""
    student_path: str | None = None
    """Local HF checkpoint of the student; None builds the debug student."""
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
    """Held-out queries per domain for the reverse-KL metric."""
    seed: int = 0
    """Seeds models, data and sampling."""
    torch_threads: int = 1
    """torch intra-op threads (0: leave torch's default)."""


def debug(**overrides: Any) -> DistillConfig:
    """Tiny teachers and student built on the spot (~10–20 s on 2 busy cores)."""
    return DistillConfig(**overrides)


RECIPES: dict[str, Callable[..., DistillConfig]] = {"debug": debug}


# -- debug models and data ---------------------------------------------------------------------------------------
def tiny_lm(vocab: int, hidden: int, seed: int, layers: int = 2) -> torch.nn.Module:
    from posttrain.tiny.lm import causal_lm

    torch.manual_seed(seed)
    return causal_lm(vocab, hidden, layers, max_position_embeddings=64).train()


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
    model = tiny_lm(cfg.vocab_size, cfg.teacher_hidden, seed=cfg.seed + 100 + MARKER[domain])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(cfg.seed + 7 * MARKER[domain])
    model.train()
    for _ in range(cfg.teacher_steps):
        x = toy_sequences(cfg, domain, 64, gen, cfg.prompt_len + 1 + cfg.max_new_tokens)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return model.eval()


# -- the stage ---------------------------------------------------------------------------------------------------
class DistillStage:
    """``posttrain distill`` as a stage of the one driver (``posttrain.rl.loop.run_stage``): the student samples
    on-policy through its engine (the rollout workflow), each query is scored by its own domain's teacher, and the
    learner's update takes the OPD advantage λ_d·(log π_T − log π_prox) against the proximal student it computes
    at the start of the update (the Eq 29 objective with ``distill_loss``'s advantage)."""

    name = "posttrain distill"

    def __init__(
        self, cfg: DistillConfig, student: torch.nn.Module, teachers: dict[str, torch.nn.Module], tokenizer: Any = None
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
        self.student = student
        self.teachers = teachers
        self.router = DomainRouter({d: DomainRoute(teacher=d, weight=cfg.weights.get(d, 1.0)) for d in teachers})
        self.scorer = TeacherScorer(TeacherConfig(path="<in-process>"))
        self.engine = HFEngine(copy.deepcopy(student).eval(), capacity=256)
        self.gen = torch.Generator().manual_seed(cfg.seed + 1)
        self.teacher_calls: list[tuple[str, list[str]]] = []
        eval_gen = torch.Generator().manual_seed(cfg.seed + 999_999)
        self.eval_prompts = {d: prompts(cfg, d, cfg.eval_queries, eval_gen) for d in teachers}
        self._step = 0
        self._scored: tuple[Tensor, Tensor] | None = None
        self._prox: Tensor | None = None

    # -- the driver's stage protocol ----------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        import dataclasses

        return dataclasses.asdict(self.cfg)

    def warmup(self) -> dict[str, Any]:
        """Step 0: the held-out reverse KL before OPD (after the optional SFT warm-up on teacher samples)."""
        row: dict[str, Any] = {}
        if self.cfg.sft_steps:
            row["sft_loss"] = self.sft_warmup()[-1]
        return {**row, **self.evaluate()}

    def collect(self) -> Batch:
        cfg = self.cfg
        self._step += 1
        by_domain = {d: prompts(cfg, d, cfg.queries_per_domain, self.gen) for d in self.teachers}
        seeds = 1000 * self._step
        trajs = self._sample(self.engine, self._requests(f"s{self._step}", by_domain, cfg.samples_per_query, seeds))
        self._scored = self.teacher_logprobs(trajs)
        groups: dict[str, list[Trajectory]] = {}
        for t in trajs:
            groups.setdefault(t.group_id, []).append(t)
        return Batch(groups=list(groups.values()), version=self.learner.version, stats={})

    def train(self, batch: Batch) -> dict[str, Any]:
        trajs = [t for g in batch.groups for t in g]  # the order collect scored them in
        teacher_lp, weights = self._scored
        p = pack(trajs)

        def advantage(prox: Tensor) -> Tensor:  # Eq 33–36: λ_d · sg[log π_T − log π_prox] on response tokens
            self._prox = prox
            adv = torch.where(p.response_mask, opd_advantage(teacher_lp, prox), torch.zeros_like(prox))
            return adv * weights.to(adv.dtype).unsqueeze(-1)

        m = self.learner.update(p, advantage)
        row: dict[str, Any] = {"loss": m["loss"], "clip_fraction": m["clip_fraction"]}
        domains = [t.request.meta["domain"] for t in trajs]
        for d in self.teachers:
            rows = torch.tensor([x == d for x in domains])
            mask = p.response_mask[rows]
            gap = ((self._prox[rows] - teacher_lp[rows]) * mask).sum() / mask.sum()
            row[f"gap_{d}"] = float(gap)  # mean log π_S − log π_T on the student's own samples
        row.update(self.evaluate())
        return row

    def sync(self) -> None:
        self.engine.update_weights(self.learner.weights(), self.learner.version)

    def row(self, batch: Batch, metrics: dict[str, Any]) -> dict[str, Any]:
        return {"version": self.learner.version, **metrics}

    def state_dict(self) -> dict[str, Any]:
        return {"gen": self.gen.get_state(), "step": self._step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.gen.set_state(state["gen"])
        self._step = state["step"]
        self.sync()

    def close(self) -> None:
        pass

    def step(self, step: int) -> dict[str, Any]:
        """One driver step without a run directory (collect, train, sync): for tests and notebooks."""
        self._step = step - 1
        batch = self.collect()
        row = {"step": step, **self.row(batch, self.train(batch))}
        self.sync()
        return row

    def _requests(self, tag: str, by_domain: dict[str, list[list[int]]], n: int, seed0: int) -> list[Request]:
        reqs = []
        for d, ps in by_domain.items():
            for qi, p in enumerate(ps):
                for s in range(n):
                    sp = SamplingParams(
                        max_new_tokens=self.cfg.max_new_tokens,
                        temperature=self.cfg.temperature,
                        ignore_eos=True,
                        seed=seed0 + len(reqs),
                    )
                    reqs.append(Request(f"{tag}-{d}-{qi}-{s}", p, sp, group_id=f"{tag}-{d}-{qi}", meta={"domain": d}))
        return reqs

    def _sample(self, engine: HFEngine, reqs: list[Request]) -> list[Trajectory]:
        engine.submit(reqs)
        done: list[Trajectory] = []
        while engine.n_active:
            done += engine.step().finished
        order = {r.request_id: i for i, r in enumerate(reqs)}
        return sorted(done, key=lambda t: order[t.request_id])

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

    def sft_warmup(self) -> list[float]:
        """Student CE on teacher-sampled trajectories (each domain's own teacher), ``sft_steps`` steps."""
        losses = []
        for s in range(self.cfg.sft_steps):
            trajs = []
            for d, teacher in self.teachers.items():
                ps = {d: prompts(self.cfg, d, self.cfg.queries_per_domain, self.gen)}
                trajs += self._sample(HFEngine(teacher, capacity=256), self._requests(f"sft{s}", ps, 1, 10**6 * s))
            p = pack(trajs)
            self.student.train()
            lp = token_logprobs(self.student, p)
            loss = -(lp * p.response_mask).sum() / p.response_mask.sum()
            for opt in self.learner.optimizers:
                opt.zero_grad(set_to_none=True)
            loss.backward()
            for opt in self.learner.optimizers:
                opt.step()
            losses.append(float(loss.detach()))
        self.student.eval()
        self.sync()
        return losses

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Held-out reverse KL(π_S ‖ π_T) per domain, exact over the vocabulary, on the student's samples."""
        out = {}
        eng = HFEngine(copy.deepcopy(self.student).eval(), capacity=256)
        for d, ps in self.eval_prompts.items():
            trajs = self._sample(eng, self._requests(f"eval-{d}", {d: ps}, 1, 777))
            p = pack(trajs)
            s_logits = self.student(input_ids=p.input_ids, attention_mask=p.attention_mask).logits
            t_logits = self.teachers[d](input_ids=p.input_ids, attention_mask=p.attention_mask).logits
            idx = p.positions.unsqueeze(-1).expand(-1, -1, s_logits.shape[-1])
            ls = sampling_logprobs(s_logits.gather(1, idx), self.cfg.temperature)
            lt = sampling_logprobs(t_logits.gather(1, idx))
            kl = (ls.exp() * (ls - lt)).sum(-1)
            m = p.response_mask.float()
            out[f"rkl_{d}"] = float((kl * m).sum() / m.sum())
        return out


def _tokenizer_of(path: str) -> Any:
    """The student directory's tokenizer, or None when it has none (a bare model: exported without one)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError):
        return None


def build(cfg: DistillConfig) -> DistillStage:
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    if cfg.teacher_paths:
        teachers = {d: TeacherScorer(TeacherConfig(path=path)).load() for d, path in cfg.teacher_paths.items()}
    else:
        teachers = {d: train_teacher(cfg, d) for d in DOMAINS}
    if cfg.student_path is not None:
        from transformers import AutoModelForCausalLM

        student = AutoModelForCausalLM.from_pretrained(cfg.student_path, dtype=torch.float32, local_files_only=True)
        tokenizer = _tokenizer_of(cfg.student_path)
    else:
        student, tokenizer = tiny_lm(cfg.vocab_size, cfg.student_hidden, seed=cfg.seed), None
    return DistillStage(cfg, student.eval(), teachers, tokenizer)


def run(cfg: DistillConfig, out: str | Path, progress: bool = False, resume: bool = False) -> list[dict[str, Any]]:
    """The one driver over a ``DistillStage``: step 0 (SFT warm-up + evaluation), then ``cfg.steps`` OPD steps;
    ``out/policy`` is the distilled student. Returns every row, step 0 included."""
    from formats.rundir import RunDir
    from posttrain.rl.loop import run_stage

    rows = run_stage(build(cfg), out, resume=resume, progress=progress)
    return [r for r in RunDir(out, resume=True).rows() if r["step"] == 0] + rows
