"""Online draft training against a PEAKED policy: acceptance per verify round rises while the draft trains on the
states just collected, drops after a policy update and recovers within a few iterations; a frozen draft stays low."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from posttrain.rl.draft import DraftTrainer
from posttrain.rollout.engines.feature_draft import FeatureDraft
from posttrain.rollout.engines.speculative import SpeculativeConfig, SpeculativeEngine
from posttrain.rollout.types import Request, SamplingParams

V = 8
SHIFT = 5


def tiny(seed: int, hidden: int = 64, scale: float = 40.0, layers: int = 2) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=V,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    m = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        m.lm_head.weight.mul_(scale)  # peaked next-token distributions: a random draft is mostly rejected
    return m


def iterate(train: bool, n_it: int = 10, features: bool = False) -> tuple[list[float], DraftTrainer, SpeculativeEngine]:
    policy = tiny(0)
    draft = FeatureDraft(policy) if features else tiny(1, hidden=32, scale=1.0, layers=1)
    cfg = SpeculativeConfig(enabled=True, k=3, draft_lr=1e-2, draft_steps=8)
    eng = SpeculativeEngine(policy, draft, k=3, capacity=64)
    dt = DraftTrainer(draft, cfg)
    g = torch.Generator().manual_seed(0)
    accs = []
    for it in range(n_it):
        if it == SHIFT:  # a policy update the draft has to chase
            with torch.no_grad():
                new = copy.deepcopy(policy.state_dict())
                new["lm_head.weight"] = 0.6 * new["lm_head.weight"] + 0.4 * tiny(9).lm_head.weight
            eng.update_weights(new, eng.version + 1)
        prompts = torch.randint(0, V, (48, 3), generator=g).tolist()
        eng.submit(
            [
                Request(f"{it}-{i}", p, SamplingParams(max_new_tokens=10, ignore_eos=True, seed=1000 * it + i))
                for i, p in enumerate(prompts)
            ]
        )
        a0, p0, done = eng.accepted, eng.reached, []
        while eng.n_active:
            done += eng.step().finished
        accs.append((eng.accepted - a0) / (eng.reached - p0))  # per-position acceptance
        dt.observe(eng.take_round_log())
        if train:
            dt.update(done, eng.model)
            eng.update_draft(dt.weights(), dt.version)
    return accs, dt, eng


@pytest.mark.parametrize("features", [False, True], ids=["lm-draft", "feature-draft"])
def test_online_draft_rises_and_chases_the_policy_frozen_baseline_does_not(features: bool) -> None:
    """The same for a separate small LM and for an EAGLE-style ``FeatureDraft`` reading the policy's features."""
    torch.set_num_threads(1)
    trained, dt, eng = iterate(True, features=features)
    frozen, _, _ = iterate(False, features=features)
    assert trained[0] == frozen[0] < 0.3  # the random draft is NOT already accepted
    pre = sum(trained[SHIFT - 2 : SHIFT]) / 2
    assert pre > trained[0] + 0.3  # rises while the policy is fixed
    assert max(frozen) < 0.4  # the frozen baseline does not
    assert trained[SHIFT] < pre - 0.08  # the policy moved away from the draft
    assert max(trained[SHIFT + 1 : SHIFT + 5]) >= pre - 0.05  # and the draft caught up within a few iterations
    assert all(t > f for t, f in zip(trained[1:], frozen[1:]))
    assert dt.version == 10 and eng.draft_version == 10
    assert float(dt.tracker.value.min()) > 0.2  # the running acceptance that sets λ_k followed the rounds


def test_draft_trainer_state_round_trips() -> None:
    _, dt, _ = iterate(True, n_it=2)
    other = DraftTrainer(tiny(3, hidden=32, scale=1.0, layers=1), dt.cfg)
    other.load_state_dict(dt.state_dict())
    assert other.version == dt.version
    assert torch.equal(other.tracker.value, dt.tracker.value)
    for (n, a), (_, b) in zip(dt.draft.state_dict().items(), other.draft.state_dict().items()):
        assert torch.equal(a, b), n
