"""OREAL-H training of the lemma-memory agent on the one RL driver (``posttrain.rl.loop.run_stage``).

    scifolio posttrain lemma train --config debug --out runs/lemma          # tiny policy, CPU, minutes
    scifolio posttrain lemma train --config s1mo --out runs/s1mo --set policy.path=/models/qwen   # S1-MO's recipe

``LemmaStage`` per driver step: ``questions`` task-family questions, each solved ``rollouts`` times by the agent
(one policy with role prompts on the policy's own ``HFEngine``; lemmas and answers checked by the configured
verifier, the noisy wrapper at P 0.931 / R 0.818 in ``debug``); the final reward (centred conjugate, or the raw
pass ratio as an ablation) and the lemma graph credit (or, as an ablation, the final reward on every round)
give per-round values; ``hier.hierarchical_batch`` turns them into one ``Trajectory`` per reasoner / summariser /
reviser call with the round advantage (value − leave-one-out mean of the other rollouts' rewards) on its tokens,
masks no-lemma rounds and drops questions whose pass rate is 0 or 1; one ``Learner.update`` (detached IS weight,
BKL at matched weights, KL β to the cold-started policy). ``warmup`` is the cold start: behavioural cloning on the
scripted reasoner's credited rounds of solved problems (``bc.py``), since a tiny random policy writes no
parseable lemma; the KL reference is the cloned policy.

Rollouts are seeded by (seed, step) and the noisy verifier's draw counter is checkpointed, so a resumed run
samples what the uninterrupted one would have.
"""

from __future__ import annotations

import copy
import functools
import random
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from formats.records import Dropped
from posttrain.fit import FitConfig
from posttrain.lemma.agent import AgentConfig, LemmaAgent, Trace
from posttrain.lemma.bc import BCExample, collate, examples_from_traces, solved
from posttrain.lemma.credit import batch_metrics
from posttrain.lemma.hier import hierarchical_batch
from posttrain.lemma.roles import ROLE_INSTRUCTIONS, ROLE_INSTRUCTIONS_SHORT, HFCodec, RoleCaller, char_codec
from posttrain.lemma.tasks import make_rows
from posttrain.lemma.verifiers import NoisyVerifier, make_verifier
from posttrain.rl import engines
from posttrain.rl.engines import EngineConfig, PolicyConfig
from posttrain.rl.learner import Learner, LearnerConfig
from posttrain.rl.loop import Stage, Warmup, run_stage
from posttrain.rollout.scheduler import Batch


@dataclass(frozen=True)
class TaskConfig:
    """The lemma-chain questions trained on (``tasks.make_rows``, train split)."""

    n_train: int = 8
    """Questions in the training pool (each step draws ``questions`` of them)."""
    steps: int = 2
    """Chain length of a question (lemmas on the way to the answer)."""
    magnitude: int = 1
    """Size of the numbers."""
    distinct_kinds: bool = False
    """No two training questions share their sequence of step kinds (``tasks.make_rows``)."""
    seed: int = 0

    def rows(self) -> list[dict[str, Any]]:
        """The training questions (the train split of ``tasks.make_rows``)."""
        return make_rows(self.n_train, self.seed, "train", self.steps, self.magnitude, self.distinct_kinds)


@dataclass(frozen=True)
class ColdStartConfig:
    """Behavioural cloning before RL on the scripted reasoner's credited rounds of solved problems."""

    enabled: bool = True
    p_correct: float = 0.9
    """Scripted reasoner: probability one derived step is right (only solved problems' rounds are kept)."""
    rollouts: int = 4
    """Scripted runs per training question (the BC set is their successful, credited rounds)."""
    epochs: int = 40
    """Passes over the BC examples (upper bound when ``loss_target`` is set)."""
    loss_target: float = 0.0
    """Stop once the mean BC loss of the last pass over the examples is at or below this (nats per trained
    token; 0 = run every epoch)."""
    batch_size: int = 16
    lr: float = 3e-3
    """AdamW learning rate of the cold start (its own optimizer; the RL learner's is untouched)."""


@dataclass(frozen=True)
class LemmaTrainConfig:
    """``scifolio posttrain lemma train``: OREAL-H on the one RL driver."""

    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """As in every stage: ``policy.path`` (a local Hugging Face model directory with its tokenizer; ``""``: the recipe
    needs one), or None for the tiny random policy (Qwen2, or Qwen2-MoE with ``policy.arch=qwen2_moe``) over the
    character codec, built offline."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """The policy's rollout engine: ``hf``, in process or on Ray (``engine.ray``)."""
    steps: int = 20
    """Learner steps."""
    questions: int = 4
    """Questions per step."""
    rollouts: int = 4
    """Agent runs per question (the group of the leave-one-out baseline)."""
    reward: str = "conjugate"
    """Final reward: ``conjugate`` (centred conjugate reward of the answer's k of n checks) or ``ratio`` (raw pass
    ratio k/n; ablation)."""
    graph_credit: bool = True
    """Round values from the lemma dependency graph (reward injected at terminal success lemmas and propagated
    back); false: the ablation giving every unmasked round the final reward."""
    drop_saturated: bool = True
    """Drop questions whose rollouts all succeed or all fail (pass rate 0 or 1; S1-MO)."""
    verifier: str = "noisy"
    """``noisy`` (simulated P/R over the formal checker), ``formal`` (sympy; 0 or n passes only) or ``model`` (the
    policy in the verifier role; its calls are not trained)."""
    precision: float = 0.931
    """Noisy verifier precision (the report's lemma verifier)."""
    recall: float = 0.818
    """Noisy verifier recall."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    cold_start: ColdStartConfig = field(default_factory=ColdStartConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    temperature: float = 1.0
    """Sampling temperature of every role."""
    max_tokens: int = 4096
    """Longest sequence (prompt + response) of one call; prompts beyond it lose the middle of their memory."""
    engine_capacity: int = 64
    """Requests the policy's engine decodes at once."""
    torch_threads: int = 0
    """``torch.set_num_threads`` (0 = leave as is)."""
    prompts: str = "full"
    """Role instructions in every prompt: ``full`` (``roles.ROLE_INSTRUCTIONS``) or ``short``
    (``roles.ROLE_INSTRUCTIONS_SHORT``, one line each: a character-level policy pays a token per character)."""
    seed: int = 0


def debug() -> LemmaTrainConfig:
    """Tiny policy on CPU: 1-step chains, 4 training questions of distinct kinds × 16 rollouts per step, 2 reasoning
    rounds and 1 revision, noisy verifier, one-line role instructions (``prompts="short"``: every character is a
    token, and the full instructions alone are ~300 of a call's ~500 prompt tokens), sampling temperature 0.5, one
    minibatch per step, 60 steps; a step is ≈ 5–8 s on 2 cores. Each choice was measured (benchmarks/RESULTS.md,
    "OREAL-H training"):

    - distinct kinds: with two ``sum`` questions in the pool RL traded one's answer for the other's (the
      character-level policy answers the template, not the numbers) and levelled off near a reward of 0.70;
    - cold start until a pass's mean BC loss ≤ 0.12 nats/token (lr 3e-3, batch 16, at most 60 passes): ~1.1 leaves
      a policy that solves nothing (RL never updates), ~0.01 starts RL saturated, 0.08 starts some seeds within 0.1
      of the ceiling; RL lr 2e-4 cosine to 1/5 (1e-3 and 5e-4 wreck the just-cloned policy);
    - temperature 0.5: at 1 the cloned policy's samples are garbled text and every update reinforces noise;
    - 16 rollouts: with 8 the per-question solve counts swing and the policy drifts without improving. Two-step
      chains (``task.steps=2``) start at a reward of 0.12–0.25 and their questions fall to pass rate 0 (no gradient)."""
    agent = AgentConfig(max_rounds=2, max_revisions=1, reasoner_tokens=150, summariser_tokens=150, reviser_tokens=30)
    learner = LearnerConfig(
        lr=2e-4, schedule="cosine", min_lr_ratio=0.2, n_minibatches=1, kl_beta=0.01, bkl_phi=0.1, seed=0
    )
    return LemmaTrainConfig(
        steps=60,
        rollouts=16,
        agent=agent,
        learner=learner,
        task=TaskConfig(n_train=4, steps=1, distinct_kinds=True),
        cold_start=ColdStartConfig(rollouts=4, epochs=60, loss_target=0.12, lr=3e-3),
        temperature=0.5,
        max_tokens=1024,
        torch_threads=2,
        prompts="short",
    )


def s1mo() -> LemmaTrainConfig:
    """Intern-S1-MO's recipe: 64 questions × 16 rollouts, drop pass rate 0/1, AdamW, lr 5e-7 cosine to 1/5, KL β
    0.01, calls up to 65,536 tokens, the SPEC's 8 + 8 rounds. Needs a real policy: ``--set policy.path=DIR`` (a local
    Hugging Face model with its tokenizer); the tiny one writes no usable reasoning at this scale."""
    agent = AgentConfig(reasoner_tokens=32768, summariser_tokens=4096, reviser_tokens=4096)
    learner = LearnerConfig(lr=5e-7, schedule="cosine", min_lr_ratio=0.2, kl_beta=0.01, optimizer="adamw")
    return LemmaTrainConfig(
        policy=PolicyConfig(path=""),
        steps=200,
        questions=64,
        rollouts=16,
        agent=agent,
        learner=learner,
        task=TaskConfig(n_train=4096, steps=4, magnitude=2),
        cold_start=ColdStartConfig(rollouts=4, epochs=2, lr=1e-5),
        max_tokens=65536,
        engine_capacity=256,
    )


RECIPES = {"debug": debug, "s1mo": s1mo}
"""Named configs for ``scifolio posttrain lemma train --config NAME``."""


resolve = functools.partial(engines.resolve, kinds=("hf",), stage="posttrain lemma train")
"""The engine section checked (``engines.resolve``: the kinds lemma train runs on, R3 for MoE)."""


def build_policy(policy: PolicyConfig, max_positions: int) -> tuple[torch.nn.Module, HFCodec]:
    """The policy (``engines.build_policy``) and its codec: the character codec for the tiny policy (positions up to
    ``max_positions``)."""
    if policy.path == "":
        raise ValueError("this recipe needs a policy: --set policy.path=DIR (a local Hugging Face model directory)")
    codec = char_codec() if policy.path is None else None
    tok = None if codec is None else codec.tokenizer
    model, tok = engines.build_policy(policy, tokenizer=tok, max_position_embeddings=max_positions)
    return model.eval(), codec or HFCodec(tok)


def _instructions(cfg: LemmaTrainConfig) -> dict[str, str]:
    if cfg.prompts not in ("full", "short"):
        raise ValueError(f"prompts={cfg.prompts!r}: full | short")
    return ROLE_INSTRUCTIONS_SHORT if cfg.prompts == "short" else ROLE_INSTRUCTIONS


def _prompt_cap(cfg: LemmaTrainConfig) -> int:
    a = cfg.agent
    return max(64, cfg.max_tokens - max(a.reasoner_tokens, a.summariser_tokens, a.reviser_tokens))


class LemmaStage(Stage):
    """``posttrain lemma train`` as a stage of the one driver."""

    name = "posttrain lemma"

    def __init__(self, cfg: LemmaTrainConfig) -> None:
        cfg = resolve(cfg)
        if cfg.reward not in ("conjugate", "ratio"):
            raise ValueError(f"reward={cfg.reward!r}: conjugate | ratio")
        self.cfg, self.steps = cfg, cfg.steps
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        model, self.codec = build_policy(cfg.policy, cfg.max_tokens + 8)
        self.tokenizer = self.codec.tokenizer
        self.learner = Learner(model, cfg.learner, cfg.temperature, 1.0, total_versions=cfg.steps)
        self.engine = engines.start_engine(cfg, self.learner.weights(), 0, cfg.engine_capacity, model)
        self.caller = RoleCaller(self.engine, self.codec, cfg.temperature, cfg.seed, _prompt_cap(cfg))
        self.caller.routes = engines.config_is_moe(model.config)  # R3: routes recorded, replayed by the learner
        self.caller.instructions = _instructions(cfg)
        self.verifier = make_verifier(cfg.verifier, self.caller, cfg.seed, cfg.precision, cfg.recall)
        self.rows = cfg.task.rows()
        self.step_index = 0

    # -- cold start ---------------------------------------------------------------------------------------
    def bc_examples(self) -> tuple[list[BCExample], list[Trace]]:
        """The scripted reasoner on every training question (``cold_start.rollouts`` times, its own noisy
        verifier), through the agent with the training budgets; the credited rounds of the solved ones."""
        from posttrain.lemma.scripted import scripted_caller

        cs, cfg = self.cfg.cold_start, self.cfg
        caller = scripted_caller(cs.p_correct, tokens_per_step=0, seed=cfg.seed + 1)
        caller.codec, caller.policy.codec = self.codec, self.codec
        caller.max_prompt_tokens = _prompt_cap(cfg)
        caller.instructions = _instructions(cfg)
        rows = [{**r, "id": f"{r['id']}#bc{g}"} for r in self.rows for g in range(cs.rollouts)]
        verifier = NoisyVerifier(cfg.precision, cfg.recall, seed=cfg.seed + 1)
        traces = LemmaAgent(caller, verifier, cfg.agent).solve(rows)
        return examples_from_traces(traces, cfg.reward), traces

    def warmup(self) -> Warmup | None:
        cs = self.cfg.cold_start
        if not cs.enabled:
            return None
        examples, traces = self.bc_examples()
        if not examples:
            raise RuntimeError("cold start: the scripted reasoner solved no training question")
        pad = self.tokenizer.pad_token_id or 0
        gen = torch.Generator().manual_seed(self.cfg.seed)
        per_epoch = -(-len(examples) // cs.batch_size)

        def batches() -> Iterator[dict[str, torch.Tensor]]:  # shuffled passes, weighted masked CE (``bc.collate``)
            for _ in range(cs.epochs):
                order = torch.randperm(len(examples), generator=gen).tolist()
                for i in range(0, len(order), cs.batch_size):
                    yield collate([examples[j] for j in order[i : i + cs.batch_size]], pad_id=pad)

        def done(losses: list[float]) -> bool:  # a pass's mean loss at or below the target
            return (
                cs.loss_target > 0
                and len(losses) % per_epoch == 0
                and sum(losses[-per_epoch:]) / per_epoch <= cs.loss_target
            )

        def after(losses: list[float]) -> dict[str, Any]:
            if self.learner.reference is not None:  # KL β anchors RL to the cloned policy, not the random one
                self.learner.reference = copy.deepcopy(self.learner.model).eval().requires_grad_(False)
            return {
                "bc_examples": len(examples),
                "bc_tokens": sum(sum(e.loss_mask) for e in examples),
                "bc_scripted_solved": sum(solved(t) for t in traces) / len(traces),
                "bc_loss_first": losses[0],
                "bc_loss_last": losses[-1],
                "bc_updates": len(losses),
                "bc_epochs": -(-len(losses) // per_epoch),
            }

        return Warmup(batches(), after, cfg=FitConfig(lr=cs.lr, grad_clip=1.0), stop=done)

    # -- the RL step ----------------------------------------------------------------------------------------
    def collect(self) -> Batch:
        cfg, step = self.cfg, self.step_index
        rng = random.Random(f"{cfg.seed}/questions/{step}")
        qs = rng.sample(self.rows, min(cfg.questions, len(self.rows)))
        rows = [{**r, "id": f"{r['id']}#s{step}g{g}"} for r in qs for g in range(cfg.rollouts)]
        self.caller.seed = cfg.seed * 1_000_003 + step  # rollouts of step k are a function of (seed, k, weights)
        self.caller._n = 0
        self.caller.calls.clear()
        traces = LemmaAgent(self.caller, self.verifier, cfg.agent).solve(rows)
        groups = [traces[i * cfg.rollouts : (i + 1) * cfg.rollouts] for i in range(len(qs))]
        trajs, adv, kept = hierarchical_batch(
            groups, cfg.reward, graph=cfg.graph_credit, drop_saturated=cfg.drop_saturated
        )
        m = batch_metrics(traces, cfg.reward)
        conj = batch_metrics(traces, "conjugate")["reward"] if cfg.reward != "conjugate" else m["reward"]
        stats = {
            **m,
            "reward_conjugate": conj,
            "questions_kept": len(kept),
            "questions_dropped": len(qs) - len(kept),
            "trained_calls": len(trajs),
            "trained_tokens": sum(sum(t.loss_mask) for t in trajs),
            "parse_errors_per_round": sum(len(r.parse_errors) for t in traces for r in t.rounds)
            / max(1, sum(len(t.rounds) for t in traces)),
        }
        by_q: dict[str, list] = {}
        for t in trajs:
            by_q.setdefault(t.group_id.rsplit("g", 1)[0], []).append(t)
        self.step_index += 1
        credit = {t.request_id: adv[i, : t.n_tokens].tolist() for i, t in enumerate(trajs)}  # round advantages
        dropped = [Dropped(q["id"], self.name, "saturated") for b, q in enumerate(qs) if b not in kept]  # pass rate 0/1
        credit_of = [credit[t.request_id] for g in by_q.values() for t in g]
        return Batch(list(by_q.values()), self.learner.version, metrics=stats, dropped=dropped, advantages=credit_of)

    def train(self, batch: Batch) -> dict[str, Any]:
        if not batch.groups:  # every question saturated: no gradient this step (the version still advances)
            self.learner.version += 1
            return {"loss": 0.0, "skipped_update": 1}
        return {**self.learner.train(batch), "skipped_update": 0}

    def state_dict(self) -> dict[str, Any]:
        ref = self.learner.reference
        seen = dict(self.verifier._seen) if isinstance(self.verifier, NoisyVerifier) else None
        return {
            "step_index": self.step_index,
            "reference": None if ref is None else ref.state_dict(),
            "verifier_seen": seen,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step_index = int(state["step_index"])
        if state.get("reference") is not None and self.learner.reference is not None:
            self.learner.reference.load_state_dict(state["reference"])
        if state.get("verifier_seen") is not None and isinstance(self.verifier, NoisyVerifier):
            self.verifier._seen.clear()
            self.verifier._seen.update(state["verifier_seen"])
        self.sync()


def run(cfg: LemmaTrainConfig, out: str, resume: bool = False, progress: bool = True) -> list[dict[str, Any]]:
    """The driver over a ``LemmaStage``; rows as ``run_stage`` returns them (step 0, the cold start, in the file)."""
    return run_stage(LemmaStage(cfg), out, resume=resume, progress=progress)


def with_ablation(cfg: LemmaTrainConfig, name: str) -> LemmaTrainConfig:
    """``full`` | ``ratio`` (raw pass ratio reward) | ``no_graph`` (graph credit off); same seeds."""
    return {"full": cfg, "ratio": replace(cfg, reward="ratio"), "no_graph": replace(cfg, graph_credit=False)}[name]
