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
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from posttrain.distill import DomainRoute, DomainRouter, TeacherConfig, TeacherScorer, distill_loss
from posttrain.policy_loss import ClipConfig
from posttrain.rl.learner import pack, token_logprobs
from posttrain.rollout.engines.hf import HFEngine
from posttrain.rollout.sampling import sampling_logprobs
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
    from posttrain.tiny_lm import causal_lm

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
    """Student + engine + router + teachers; ``step()`` = sample, route/score, train, sync."""

    def __init__(self, cfg: DistillConfig, student: torch.nn.Module, teachers: dict[str, torch.nn.Module]) -> None:
        self.cfg = cfg
        self.student = student
        self.teachers = teachers
        self.router = DomainRouter({d: DomainRoute(teacher=d, weight=cfg.weights.get(d, 1.0)) for d in teachers})
        self.scorer = TeacherScorer(TeacherConfig(path="<in-process>"))
        self.engine = HFEngine(copy.deepcopy(student).eval(), capacity=256)
        self.opt = torch.optim.Adam(student.parameters(), lr=cfg.lr)
        self.gen = torch.Generator().manual_seed(cfg.seed + 1)
        self.version = 0
        self.teacher_calls: list[tuple[str, list[str]]] = []
        """(teacher, request ids it scored) per call: what crossed to which teacher (tests check the routing)."""
        eval_gen = torch.Generator().manual_seed(cfg.seed + 999_999)
        self.eval_prompts = {d: prompts(cfg, d, cfg.eval_queries, eval_gen) for d in teachers}

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
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            losses.append(float(loss.detach()))
        self._sync()
        return losses

    def _sync(self) -> None:
        self.version += 1
        self.engine.update_weights({k: v.detach().clone() for k, v in self.student.state_dict().items()}, self.version)

    def step(self, step: int) -> dict[str, Any]:
        cfg = self.cfg
        by_domain = {d: prompts(cfg, d, cfg.queries_per_domain, self.gen) for d in self.teachers}
        trajs = self._sample(self.engine, self._requests(f"s{step}", by_domain, cfg.samples_per_query, 1000 * step))
        p = pack(trajs)
        teacher_lp, weights = self.teacher_logprobs(trajs)
        with torch.no_grad():  # π_prox: the student frozen at the start of this batch
            prox = token_logprobs(self.student, p, cfg.temperature)
        clip = ClipConfig(eps_low=cfg.clip_low, eps_high=cfg.clip_high)
        self.student.train()
        loss_val = 0.0
        for _ in range(cfg.updates_per_batch):
            lp = token_logprobs(self.student, p, cfg.temperature)
            loss, _ = distill_loss(lp, prox, teacher_lp, p.response_mask, weights, p.behaviour, clip)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            loss_val = float(loss.detach())
        self.student.eval()
        self._sync()
        row: dict[str, Any] = {"step": step, "version": self.version, "loss": loss_val}
        domains = [t.request.meta["domain"] for t in trajs]
        for d in self.teachers:
            rows = torch.tensor([x == d for x in domains])
            m = p.response_mask[rows]
            gap = ((prox[rows] - teacher_lp[rows]) * m).sum() / m.sum()
            row[f"gap_{d}"] = float(gap)  # mean log π_S − log π_T on the student's own samples
        row.update(self.evaluate())
        return row

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
    else:
        student = tiny_lm(cfg.vocab_size, cfg.student_hidden, seed=cfg.seed)
    return DistillStage(cfg, student.eval(), teachers)


def run(cfg: DistillConfig, out: str | Path, progress: bool = False) -> list[dict[str, Any]]:
    """Build, (optionally) SFT warm-up, then ``cfg.steps`` OPD steps; one metrics row per step."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stage = build(cfg)
    metrics = out / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    rows = []
    start = {"step": 0, "version": stage.version, **stage.evaluate()}
    if cfg.sft_steps:
        start["sft_loss"] = stage.sft_warmup()[-1]
        start.update(stage.evaluate())
    rows.append(start)
    with open(metrics, "a") as f:
        f.write(json.dumps(start) + "\n")
        for step in range(1, cfg.steps + 1):
            t0 = time.perf_counter()
            row = stage.step(step)
            row["step_s"] = time.perf_counter() - t0
            f.write(json.dumps(row) + "\n")
            f.flush()
            rows.append(row)
            if progress:
                print(json.dumps(row), flush=True)
    stage.student.save_pretrained(out / "student")
    return rows
