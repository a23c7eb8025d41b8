"""Which rollout engine a run uses: ``EngineConfig`` → one picklable ``EngineFactory``, in process or on Ray.

    scifolio posttrain rl --config debug --out runs/rl --set engine.kind=speculative --set engine.ray=local
    scifolio posttrain rl --config debug-moe --out runs/moe          # MoE policy: R3 recording switches itself on

The driver calls the factory once in process, or starts ``engine.workers`` Ray actors from the same factory
(``posttrain.ray_actors``). ``--speculative``, ``--ray`` and ``memdec.enabled`` are spellings of these fields.

| kind            | in process                             | Ray (``engine.ray``)                                  |
|-----------------|----------------------------------------|-------------------------------------------------------|
| ``hf``          | rl, agentic, distill, lemma train      | rl, agentic, distill, lemma train                     |
| ``speculative`` | rl (R3: the verification forwards)     | rl                                                    |
| ``fused``       | rl (R3: the policy inside the fused model) | refused: λ statistics are read in the driver     |
| ``vllm``        | rl; needs vLLM on a GPU (``pip install vllm``), refused here with that message | same        |
| ``scripted``    | rl (virtual clock), agentic (scripted agent) | refused: a test double has no weights to ship   |

Every stage takes the same ``policy`` and ``engine`` sections; ``resolve(cfg, kinds, stage)`` refuses a kind the stage
does not run on. An MoE policy (detected from its config) records routed experts in the engine and the learner
replays them (R3); an MoE policy on an engine kind that cannot record them is refused, never run with live routing.
The precision map: the engine holds the policy in ``policy.dtype`` (bfloat16 or float32); the learner keeps fp32
master weights; logprobs, the loss and the BKL test are computed in fp32 on both sides (``sampling_logprobs``).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch

from posttrain.rollout.engine import RolloutEngine

KINDS = ("hf", "speculative", "fused", "vllm", "scripted")
CAN_RECORD_ROUTES = ("hf", "speculative", "fused", "vllm")


@dataclass(frozen=True)
class EngineConfig:
    """The rollout engine of an RL run."""

    kind: Literal["hf", "speculative", "fused", "vllm", "scripted"] = "hf"
    """``hf`` (transformers, CPU/GPU), ``speculative`` (draft trained online), ``fused`` (Memory Decoder rollouts),
    ``vllm`` (GPU), ``scripted`` (virtual clock, tests)."""
    ray: str | None = None
    """None: in this process; ``local``: a local Ray; ``HOST:PORT``: join that cluster (``--ray``)."""
    workers: int = 2
    """Engine workers on Ray (capacity is split evenly between them)."""


@dataclass(frozen=True)
class PolicyConfig:
    """The policy every stage trains (``policy.path``, ``policy.arch``, ``policy.dtype`` mean the same to rl, agentic,
    distill and lemma train)."""

    path: str | None = None
    """Hugging Face model directory or name (with its tokenizer); None builds the tiny debug policy."""
    tokenizer: str | None = None
    """Tokenizer directory or name when it is not with the model (``scifolio memdec`` writes them apart)."""
    hidden_size: int = 64
    """Tiny policy only: width."""
    num_layers: int = 2
    """Tiny policy only: depth."""
    seed: int = 0
    """Tiny policy only: initialisation seed."""
    attn_implementation: str = "sdpa"
    """The same attention implementation on engine and learner (their logprobs must agree)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """The engine's copy of the policy; the learner keeps fp32 master weights (the precision map: module docstring)."""
    arch: Literal["qwen2", "qwen2_moe"] = "qwen2"
    """Tiny policy only: dense Qwen2, or Qwen2-MoE (4 experts, top-2) to exercise R3."""


class EngineRefused(ValueError):
    """A kind × placement pair (or a policy on a kind) that cannot run; the message says which and why."""


def resolve(cfg: Any, kinds: tuple[str, ...] = KINDS, stage: str = "posttrain rl") -> Any:
    """The run config (any stage's: ``policy`` and ``engine`` sections) with the legacy spellings folded into
    ``engine`` and every refusal raised up front; ``kinds``: the engine kinds ``stage`` runs on."""
    kind = cfg.engine.kind
    if hasattr(cfg, "speculative"):  # rl's spellings of a kind: speculative.enabled, memdec.enabled
        spelled = [k for k, on in (("speculative", cfg.speculative.enabled), ("fused", cfg.memdec.enabled)) if on]
        if len(spelled) > 1:
            raise EngineRefused("speculative.enabled and memdec.enabled both set: one engine kind per run")
        if spelled:
            if kind not in ("hf", spelled[0]):
                raise EngineRefused(f"engine.kind={kind} contradicts {spelled[0]} spelled by its enabled flag")
            kind = spelled[0]
        cfg = replace(
            cfg,
            speculative=replace(cfg.speculative, enabled=kind == "speculative"),
            memdec=replace(cfg.memdec, enabled=kind == "fused"),
        )
    cfg = replace(cfg, engine=replace(cfg.engine, kind=kind))
    where = "in process" if cfg.engine.ray is None else f"on Ray ({cfg.engine.ray})"
    if kind not in kinds:
        raise EngineRefused(f"engine.kind={kind!r}: {stage} runs on {', '.join(kinds)}")
    if kind == "vllm":
        try:
            import vllm  # noqa: F401
        except ImportError:
            raise EngineRefused(
                f"engine.kind=vllm {where}: vLLM is not installed (it needs a CUDA GPU): pip install vllm"
            ) from None
        if cfg.policy.path is None:
            raise EngineRefused("engine.kind=vllm needs policy.path (vLLM loads the model from a directory or name)")
    not_on_ray = {
        "fused": "The fused model's router λ statistics (memdec_lambda_mean) are read from the engine in the driver's "
        "process; run the fused engine in process (no engine.ray)",
        "scripted": "The scripted engine is a test double with no weights to ship; run it in process",
    }
    if kind in not_on_ray and cfg.engine.ray is not None:
        raise EngineRefused(f"engine.kind={kind} on Ray: refused. {not_on_ray[kind]}")
    if cfg.engine.ray is not None and cfg.engine.workers < 1:
        raise EngineRefused(f"engine.workers={cfg.engine.workers}: at least one Ray worker")
    if kind not in CAN_RECORD_ROUTES and policy_is_moe(cfg.policy):  # asked only then: --print-config stays offline
        raise EngineRefused(
            f"an MoE policy on engine.kind={kind}: refused. That engine cannot record routed experts, so the "
            f"learner could not replay them (R3) and would train on live routing; use engine.kind="
            + " or ".join(k for k in kinds if k in CAN_RECORD_ROUTES)
        )
    return cfg


# -- models ------------------------------------------------------------------------------------------------------
def policy_is_moe(policy: Any) -> bool:
    """Whether the policy routes tokens to experts, from its config alone (no weights loaded)."""
    if policy.path is None:
        return policy.arch == "qwen2_moe"
    from transformers import AutoConfig

    return config_is_moe(AutoConfig.from_pretrained(policy.path, local_files_only=True))


def config_is_moe(config: Any) -> bool:
    """Whether a Hugging Face config describes a Mixture-of-Experts model (its text config, for multimodal ones)."""
    c = getattr(config, "text_config", None) or config
    return any(
        int(getattr(c, k, 0) or 0) > 1
        for k in ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
    )


def build_policy(
    p: Any, dtype: torch.dtype = torch.float32, tokenizer: Any = None, vocab_size: int = 0, **config: Any
) -> tuple[Any, Any]:
    """The one policy loader of every stage: (model, tokenizer) from ``policy.path``, or the tiny policy (Qwen2 or
    Qwen2-MoE by ``policy.arch``, seeded by ``policy.seed``) built on the spot over ``tokenizer`` (default: the toy
    tasks' character tokenizer) or ``vocab_size`` bare ids; ``config``: more fields of the tiny model's config.
    ``p``: a ``PolicyConfig`` or a config with a ``policy`` section."""
    p = getattr(p, "policy", p)
    if p.path is None:
        from posttrain.tiny.lm import causal_lm

        if tokenizer is None and not vocab_size:
            from posttrain.rl.task import char_tokenizer

            tokenizer = char_tokenizer()
        special = ("bos_token_id", "eos_token_id", "pad_token_id")
        common = {  # heads (4, 2 key/value) and tied embeddings: both tiny configs' own
            "max_position_embeddings": 256,
            **({k: getattr(tokenizer, k) for k in special} if tokenizer is not None else {}),
            **config,
        }
        vocab = vocab_size or len(tokenizer)
        torch.manual_seed(p.seed)
        if p.arch == "qwen2_moe":
            from transformers import Qwen2MoeForCausalLM

            from posttrain.tiny.moe import tiny_moe_config

            mcfg = tiny_moe_config(vocab_size=vocab, hidden_size=p.hidden_size, num_layers=p.num_layers)
            for k, v in common.items():
                setattr(mcfg, k, v)
            return Qwen2MoeForCausalLM(mcfg).to(dtype), tokenizer
        model = causal_lm(vocab, p.hidden_size, p.num_layers, attn_implementation=p.attn_implementation, **common)
        return model.to(dtype), tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    if not Path(p.path).is_dir() and not _in_hub_cache(p.path):
        raise EngineRefused(
            f"policy.path={p.path}: no such model directory, and no model of that name in the local Hugging Face "
            "cache (nothing is downloaded offline). `scifolio models real DIR` writes SmolLM2 to DIR/lm."
        )
    vlm = hasattr(AutoConfig.from_pretrained(p.path), "vision_config")  # `pretrain export --vlm`: LLaVA-style
    auto = AutoModelForImageTextToText if vlm else AutoModelForCausalLM
    model = auto.from_pretrained(p.path, dtype=dtype, attn_implementation=p.attn_implementation)
    if vlm:  # the vision tower E_v stays frozen after pre-training as in it; the projector W_in and the LM train
        model.model.vision_tower.requires_grad_(False)
    return model, tokenizer or AutoTokenizer.from_pretrained(p.tokenizer or p.path)


def load_processor(p: Any) -> Any:
    """The processor of a vision-language policy (``pretrain export --vlm``: its config has a ``vision_config``) that
    renders its image rows, else None (a text-only or tiny policy)."""
    from transformers import AutoConfig, AutoProcessor

    p = getattr(p, "policy", p)
    vlm = p.path is not None and hasattr(AutoConfig.from_pretrained(p.path), "vision_config")
    return AutoProcessor.from_pretrained(p.path) if vlm else None


def _in_hub_cache(name: str) -> bool:
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except HFValidationError:  # not a repository name (a path that does not exist)
        return False


def _dense_config(config: Any) -> Any:
    """A copy of the policy's config for a dense Qwen2 beside it (the tiny draft, the tiny memory): an MoE policy's
    config keeps its vocabulary, attention and special tokens and loses its experts."""
    if not config_is_moe(config):
        return copy.deepcopy(config)
    from transformers import Qwen2Config

    known = Qwen2Config().to_dict()
    drop = ("architectures", "model_type", "transformers_version", "layer_types")
    return Qwen2Config(**{k: v for k, v in config.to_dict().items() if k in known and k not in drop})


def _side_model(cfg: Any, policy: Any, path: str | None, refusal: str, hidden: int, seed: int, **dims: int) -> Any:
    """A model beside the policy: ``path`` loaded, or (tiny policy only) a dense Qwen2 on the policy's config with
    ``hidden`` width (and ``dims``: e.g. ``num_hidden_layers``), seeded with ``policy.seed + seed``."""
    if path is not None:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, attn_implementation=cfg.policy.attn_implementation
        ).eval()
    if cfg.policy.path is not None:
        raise ValueError(refusal)
    from transformers import Qwen2ForCausalLM

    mcfg = _dense_config(policy.config)
    mcfg.hidden_size, mcfg.intermediate_size = hidden, 2 * hidden
    for k, v in dims.items():
        setattr(mcfg, k, v)
    if "num_hidden_layers" in dims and hasattr(mcfg, "layer_types"):
        mcfg.layer_types = mcfg.layer_types[: mcfg.num_hidden_layers]
    torch.manual_seed(cfg.policy.seed + seed)
    return Qwen2ForCausalLM(mcfg).float().eval()


def build_draft(cfg: Any, policy: torch.nn.Module) -> torch.nn.Module:
    """The speculative draft: a ``FeatureDraft`` of the policy (``speculative.feature_draft``), ``speculative.draft_path``
    or, for the tiny policy, a narrower/shallower Qwen2."""
    spec, p = cfg.speculative, cfg.policy
    if spec.feature_draft:  # seeded: the learner's and every engine's draft start equal
        from posttrain.rollout.engines.feature_draft import FeatureDraft

        torch.manual_seed(p.seed + 1)
        return FeatureDraft(policy)
    refusal = "speculative decoding with a policy.path needs speculative.draft_path or speculative.feature_draft"
    hidden = max(8, int(p.hidden_size * spec.draft_scale) // 8 * 8)
    layers = max(1, int(p.num_layers * spec.draft_scale))
    return _side_model(cfg, policy, spec.draft_path, refusal, hidden, 1, num_hidden_layers=layers)


def build_fused(cfg: Any, policy: torch.nn.Module) -> torch.nn.Module:
    """``FusedLM(policy, memory, router)`` (Eq 3 rollouts): the memory from ``memdec.memory`` (``scifolio memdec
    train``'s directory) or, for the tiny policy, a random half-width Qwen2 on its vocabulary; the router from
    ``memdec.router`` or untrained."""
    from posttrain.memdec.fused import FusedLM, load_router
    from posttrain.objectives.memory_decoder import Router, RouterConfig

    m = cfg.memdec
    refusal = "the fused engine with a policy.path needs memdec.memory (a trained memory directory)"
    memory = _side_model(cfg, policy, m.memory, refusal, max(8, cfg.policy.hidden_size // 2 // 8 * 8), 2)
    widths = (policy.config.hidden_size, memory.config.hidden_size)
    router = Router(RouterConfig(*widths)) if m.router is None else load_router(m.router)
    return FusedLM(policy, memory, router)


# -- the factory ---------------------------------------------------------------------------------------------------
class EngineFactory:
    """Picklable: builds the run's engine (``cfg.engine.kind``) with ``capacity`` slots where it is called, around
    ``build()`` (a stage's own policy architecture; weights come with the first sync) or ``build_policy``. R3: an
    MoE policy (from its config) gets the experts recorder on its routers (not the draft's, not the memory's)."""

    def __init__(self, cfg: Any, capacity: int, version: int = 0, build: Callable[[], Any] | None = None) -> None:
        self.cfg, self.capacity, self.version, self.build = cfg, capacity, version, build

    def __call__(self) -> RolloutEngine:
        cfg, kind = self.cfg, self.cfg.engine.kind
        if kind == "scripted":
            from transformers import AutoConfig

            from posttrain.rollout.engines.scripted import ScriptedEngine

            path = cfg.policy.path
            vocab = (AutoConfig.from_pretrained(path) if path else build_policy(cfg.policy)[0].config).vocab_size
            return ScriptedEngine(capacity=self.capacity, version=self.version, vocab=vocab)
        if kind == "vllm":
            from posttrain.rollout.engines.vllm import VLLMConfig, VLLMEngine

            moe, args = policy_is_moe(cfg.policy), {"dtype": cfg.policy.dtype}
            return VLLMEngine(VLLMConfig(cfg.policy.path, self.capacity, self.version, moe, engine_args=args))
        build = self.build or (lambda: build_policy(cfg.policy)[0])
        policy = build().to({"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.policy.dtype]).eval()
        if kind == "speculative":
            from posttrain.rollout.engines.speculative import SpeculativeEngine

            draft = build_draft(cfg, policy).eval()
            engine = SpeculativeEngine(policy, draft, k=cfg.speculative.k, capacity=self.capacity, version=self.version)
        else:
            from posttrain.rollout.engines.hf import HFEngine

            model = build_fused(cfg, policy) if kind == "fused" else policy
            engine = HFEngine(model, capacity=self.capacity, version=self.version)
        if config_is_moe(policy.config):
            from posttrain.objectives.r3 import EngineRoutingRecorder

            engine.experts_recorder = EngineRoutingRecorder(policy)
        return engine


def start_engine(
    cfg: Any, weights: dict[str, torch.Tensor], version: int, capacity: int = 0, model: torch.nn.Module | None = None
) -> RolloutEngine:
    """The run's engine at the learner's exact ``weights`` and ``version``: built in process, or as
    ``engine.workers`` Ray actors from the same factory (Ray started or joined here). ``model``: the stage's policy,
    whose architecture the engine copies (default: ``build_policy(cfg.policy)``); ``capacity``: default
    ``cfg.engine_capacity``."""
    capacity = capacity or cfg.engine_capacity
    build = None if model is None else functools.partial(copy.deepcopy, model)
    if cfg.engine.ray is None:
        engine = EngineFactory(cfg, capacity, build=build)()
    else:
        from posttrain import ray_actors

        ray_actors.ensure_ray(cfg.engine.ray, cfg.engine.workers)
        per_worker = max(1, capacity // cfg.engine.workers)
        factory = EngineFactory(cfg, per_worker, build=build)
        engine = ray_actors.RayEngine(ray_actors.start_engine_workers(factory, cfg.engine.workers))
    if cfg.engine.kind != "scripted":
        engine.update_weights(weights, version)
    elif version:
        engine.update_weights({}, version)
    return engine


def stop_engine(cfg: Any) -> None:
    if cfg.engine.ray is not None:
        from posttrain import ray_actors

        ray_actors.shutdown_ray()
