"""The vLLM adapter's request/response mapping, against stand-ins shaped like vLLM's output objects.

vLLM is not installed here (GPU only): these check OUR mapping logic on objects with the fields of
``vllm.outputs.CompletionOutput`` (token_ids, logprobs as ``[{token_id: Logprob}]``, routed_experts
``np.ndarray [positions, layers, top_k]``, finish_reason, weight_versions ``[WeightVersionSpan]``). The engine
class itself (AsyncLLM, keep-mode pause, IPC weight transfer) is not exercised.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from posttrain.rollout.engines.vllm import (
    Launch,
    VLLMConfig,
    VLLMEngine,
    apply_completion,
    expand_weight_versions,
    resubmission_seed,
    vllm_prompt,
    vllm_sampling_kwargs,
)
from posttrain.rollout.types import FINISH_LENGTH, FINISH_STOP, Request, SamplingParams, Trajectory


@dataclass
class Logprob:  # vllm.logprobs.Logprob
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class WeightVersionSpan:  # vllm.outputs.WeightVersionSpan
    version: str
    start: int
    end: int


@dataclass
class CompletionOutput:  # vllm.outputs.CompletionOutput (the fields the adapter reads)
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    routed_experts: np.ndarray | None = None
    finish_reason: str | None = None
    stop_reason: Any = None
    weight_versions: list[WeightVersionSpan] | None = field(default=None)


def _completion(tokens, lps, spans, finish=None, routes=None):
    logprobs = [{t: Logprob(lp, rank=1)} for t, lp in zip(tokens, lps, strict=True)]
    return CompletionOutput(0, "", list(tokens), sum(lps), logprobs, routes, finish, None, spans)


def test_sampling_kwargs_fresh_request():
    p = SamplingParams(max_new_tokens=16, temperature=0.7, top_p=0.9, seed=5, stop_token_ids=(2,))
    kw = vllm_sampling_kwargs(p)
    assert kw["max_tokens"] == 16 and kw["temperature"] == 0.7 and kw["top_p"] == 0.9
    assert kw["logprobs"] == 0 and kw["n"] == 1 and kw["detokenize"] is False
    assert kw["stop_token_ids"] == [2] and kw["ignore_eos"] is False
    assert kw["seed"] == resubmission_seed(5, 0, 0)
    assert "min_tokens" not in kw and "routed_experts_prompt_start" not in kw and "logit_bias" not in kw
    assert vllm_sampling_kwargs(p, never=(7,))["logit_bias"] == {7: -100.0}  # a VLM's image placeholder


def test_sampling_kwargs_forced_length_and_continuation():
    p = SamplingParams(max_new_tokens=64, forced_length=10, seed=5, stop_token_ids=(2,), return_routed_experts=True)
    kw = vllm_sampling_kwargs(p, n_kept=4, attempt=1, routes_from=7)
    assert kw["max_tokens"] == 6 and kw["min_tokens"] == 6  # exactly the 6 tokens still owed
    assert kw["ignore_eos"] is True and kw["stop_token_ids"] == []
    assert kw["routed_experts_prompt_start"] == 7
    assert kw["seed"] != vllm_sampling_kwargs(p, n_kept=0, attempt=1)["seed"]  # continuation draws afresh
    with pytest.raises(ValueError, match="nothing left"):
        vllm_sampling_kwargs(p, n_kept=10)


def test_prompt_carries_kept_tokens():
    t = Trajectory(Request("r", [1, 2, 3]))
    t.append(9, -0.1, 0)
    assert vllm_prompt(t) == {"prompt_token_ids": [1, 2, 3, 9]}


def test_image_prompts_give_vllm_one_placeholder_per_image_and_the_images():
    """vLLM expands a token prompt's image placeholders itself: each run of N (the HF processor's expansion) becomes
    one, the images go in ``multi_modal_data``; a continuation keeps them (a resubmission after a pause)."""
    from PIL import Image

    from posttrain.rollout.engines.vllm import image_placeholder

    red, blue = Image.new("RGB", (8, 8), (255, 0, 0)), Image.new("RGB", (4, 6), (0, 0, 255))
    t = Trajectory(Request("r", [1, 7, 7, 7, 7, 7, 7, 2, 7, 7, 7, 3], images=(red, blue, red)))
    t.append(9, -0.1, 0)
    assert vllm_prompt(t, (7, 3)) == {"prompt_token_ids": [1, 7, 7, 2, 7, 3, 9], "multi_modal_data": {"image": [red, blue, red]}}  # fmt: skip
    with pytest.raises(ValueError, match="not a multiple of 4"):
        vllm_prompt(t, (7, 4))
    with pytest.raises(ValueError, match="not a vision-language model"):
        vllm_prompt(t)
    with pytest.raises(ValueError, match="2 image placeholders for 3 images"):
        vllm_prompt(Trajectory(Request("r", [1, 7, 7, 7, 7, 7, 7], images=(red, blue, red))), (7, 3))
    with pytest.raises(ValueError, match="placeholders in the prompt and no images"):
        vllm_prompt(Trajectory.from_dict(t.to_dict()), (7, 3))  # a checkpoint keeps no images
    with pytest.raises(ValueError, match="without decoded images"):
        vllm_prompt(Trajectory(Request("r", [1, 7, 7, 7], pixel_values=object())), (7, 3))

    llava = SimpleNamespace(vision_config=object(), image_token_index=7, image_seq_length=3)
    assert image_placeholder(SimpleNamespace(hf_config=llava)) == (7, 3)
    assert image_placeholder(SimpleNamespace(hf_config=SimpleNamespace(vocab_size=10))) is None
    assert image_placeholder(SimpleNamespace()) is None


def test_vllm_plugin_registers_the_exports_identity_activation(monkeypatch):
    """The VLM export's projector names activation ``linear``; vLLM's registry lacks it. Our ``vllm.general_plugins``
    entry point adds it (here into a stand-in of ``vllm.model_executor.layers.activation``)."""
    from importlib.metadata import entry_points

    import torch

    (ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "scifolio"]
    registry = {"gelu": lambda: torch.nn.GELU()}  # vLLM's is a LazyDict of factories
    layers = SimpleNamespace(activation=SimpleNamespace(_ACTIVATION_REGISTRY=registry))
    for name, mod in [("vllm", SimpleNamespace(model_executor=None)), ("vllm.model_executor", None)]:
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setitem(sys.modules, "vllm.model_executor.layers", layers)
    ep.load()()
    x = torch.randn(3, 5)
    assert isinstance(registry["linear"](), torch.nn.Identity) and torch.equal(registry["linear"]()(x), x)


def test_expand_weight_versions():
    spans = [WeightVersionSpan("3", 0, 2), WeightVersionSpan("4", 2, 5)]
    assert expand_weight_versions(spans, 5) == [3, 3, 4, 4, 4]
    assert expand_weight_versions(spans, 4) == [3, 3, 4, 4]
    with pytest.raises(ValueError, match="cover"):
        expand_weight_versions(spans, 6)
    with pytest.raises(ValueError, match="contiguous"):
        expand_weight_versions([WeightVersionSpan("3", 0, 2), WeightVersionSpan("4", 3, 5)], 5)
    with pytest.raises(ValueError, match="no weight_versions"):
        expand_weight_versions(None, 1)


def test_cumulative_outputs_fold_in_once_with_their_versions_and_finish():
    traj = Trajectory(Request("g0-1", [5, 6, 7], SamplingParams(max_new_tokens=8, stop_token_ids=(2,))))
    launch = Launch("g0-1@0.1", traj, base=0, routes_from=0)
    assert apply_completion(launch, _completion([11, 12], [-0.5, -1.0], [WeightVersionSpan("0", 0, 2)])) == 2
    # The next cumulative output repeats the first two tokens; a weight sync happened before token 3.
    spans = [WeightVersionSpan("0", 0, 2), WeightVersionSpan("1", 2, 4)]
    assert apply_completion(launch, _completion([11, 12, 13, 2], [-0.5, -1.0, -0.25, -2.0], spans, "stop")) == 2
    assert traj.token_ids == [11, 12, 13, 2]
    assert traj.logprobs == [-0.5, -1.0, -0.25, -2.0]
    assert traj.versions == [0, 0, 1, 1]
    assert traj.finish_reason == FINISH_STOP
    traj.validate()


def test_resubmitted_continuation_appends_after_kept_tokens_and_routes():
    p = SamplingParams(max_new_tokens=6, return_routed_experts=True)
    traj = Trajectory(Request("g1-0", [5, 6, 7], p), routed_experts=[])
    first = Launch("g1-0@0.1", traj, base=0, routes_from=0)
    routes = np.arange(4 * 2 * 2).reshape(4, 2, 2)  # prompt positions 0-2 and token 1 (position 3)
    apply_completion(first, _completion([11, 12], [-0.1, -0.2], [WeightVersionSpan("0", 0, 2)], "abort", routes))
    assert traj.finish_reason is None  # our own pause aborted it: still in flight
    assert len(traj.routed_experts) == 4  # prompt (3) + first token; the last sampled token is not fed yet
    # Resubmitted after a sync: prompt = 3 + 2 kept tokens; vLLM returns routes from position 4 on.
    kw = vllm_sampling_kwargs(p, traj.n_tokens, traj.attempt, len(traj.routed_experts))
    assert kw["max_tokens"] == 4 and kw["routed_experts_prompt_start"] == 4
    second = Launch("g1-0@0.2", traj, base=2, routes_from=4)
    more = np.full((5, 2, 2), 7)  # positions 4..8: fed are 3 prompt + 6 tokens - 1 = 8 → rows 4..7 kept
    spans = [WeightVersionSpan("1", 0, 4)]
    apply_completion(second, _completion([13, 14, 15, 16], [-0.3, -0.4, -0.5, -0.6], spans, "length", more))
    assert traj.token_ids == [11, 12, 13, 14, 15, 16]
    assert traj.versions == [0, 0, 1, 1, 1, 1]
    assert traj.finish_reason == FINISH_LENGTH
    assert len(traj.routed_experts) == len(traj.prompt_ids) + traj.n_tokens - 1
    assert traj.routed_experts[3] == routes[3].tolist() and traj.routed_experts[4] == [[7, 7], [7, 7]]


def test_bad_outputs_are_refused():
    traj = Trajectory(Request("r", [1]))
    launch = Launch("r@0.1", traj, 0, 0)
    no_lp = CompletionOutput(0, "", [3], None, None, None, None, None, [WeightVersionSpan("0", 0, 1)])
    with pytest.raises(ValueError, match="logprobs"):
        apply_completion(launch, no_lp)
    with pytest.raises(ValueError, match="weight_versions"):
        apply_completion(launch, _completion([3], [-0.1], None))
    with pytest.raises(ValueError, match="finish_reason"):
        apply_completion(launch, _completion([3], [-0.1], [WeightVersionSpan("0", 0, 1)], "exploded"))


def test_engine_without_vllm_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ImportError, match="pip install vllm"):
        VLLMEngine(VLLMConfig(model="x"))


def test_speculative_config_maps_to_vllm() -> None:
    from posttrain.rollout.engines.speculative import SpeculativeConfig
    from posttrain.rollout.engines.vllm import vllm_speculative_config

    spec = SpeculativeConfig(enabled=True, k=3)
    assert vllm_speculative_config("/ckpt/draft", spec.k) == {
        "method": "draft_model",
        "model": "/ckpt/draft",
        "num_speculative_tokens": 3,
    }
    assert vllm_speculative_config(None, 4) is None
    with pytest.raises(ValueError):
        vllm_speculative_config("/ckpt/draft", 0)
    assert VLLMConfig(model="m", draft_model="d").speculative_k == SpeculativeConfig().k
