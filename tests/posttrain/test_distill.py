"""Tests for posttrain.objectives.distill (SPEC §C8, Eq 31–36), including real tiny HF teachers.

Run: python -m pytest tests/posttrain/test_distill.py -q
"""

from __future__ import annotations

import pytest
import torch

from pipelines.tiny import write_area
from posttrain.objectives.distill import DomainRoute, DomainRouter, distill_loss, opd_advantage, sampled_logprobs
from posttrain.objectives.policy_loss import policy_loss
from posttrain.rl.teachers import TeacherConfig, TeacherScorer

F64 = torch.float64


def test_opd_advantage_is_detached_difference() -> None:
    t = torch.tensor([[-0.5, -2.0]], requires_grad=True)
    p = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    a = opd_advantage(t, p)
    assert a.tolist() == [[0.5, -1.0]]
    assert not a.requires_grad


def test_sampled_logprobs_matches_log_softmax() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 17, generator=gen, dtype=F64)
    tokens = torch.randint(0, 17, (2, 5), generator=gen)
    ref = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(sampled_logprobs(logits, tokens).double(), ref, atol=1e-6)


def test_router_splits_and_reassembles() -> None:
    router = DomainRouter(
        {
            "math": DomainRoute("reasoner", 1.0),
            "swe": DomainRoute("agent", 0.5),
            "physics": DomainRoute("reasoner", 2.0),
        }
    )
    domains = ["swe", "math", "physics", "swe"]
    routed = router.route(domains)
    assert routed.weights.tolist() == [0.5, 1.0, 2.0, 0.5]
    assert routed.by_teacher["reasoner"].tolist() == [1, 2]
    assert routed.by_teacher["agent"].tolist() == [0, 3]
    answers = {"reasoner": torch.tensor([[1.0, 1.0], [2.0, 2.0]]), "agent": torch.tensor([[0.0, 0.0], [3.0, 3.0]])}
    assert DomainRouter.assemble(routed, answers, (4, 2))[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(KeyError, match="chemistry"):
        router.route(["chemistry"])
    with pytest.raises(KeyError, match="agent"):
        DomainRouter.assemble(routed, {"reasoner": answers["reasoner"]}, (4, 2))
    with pytest.raises(ValueError):
        DomainRouter.assemble(routed, {**answers, "agent": torch.zeros(1, 2)}, (4, 2))


def test_distill_loss_is_eq29_with_weighted_token_advantages() -> None:
    gen = torch.Generator().manual_seed(1)
    student = (-torch.rand(3, 4, generator=gen, dtype=F64)).requires_grad_(True)
    prox = -torch.rand(3, 4, generator=gen, dtype=F64)
    teacher = -torch.rand(3, 4, generator=gen, dtype=F64)
    resp = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    lam = torch.tensor([1.0, 0.0, 2.0], dtype=F64)
    loss, _ = distill_loss(student, prox, teacher, resp, lam)
    ref, _ = policy_loss(student, prox, lam.unsqueeze(-1) * (teacher - prox), resp)
    assert loss.item() == pytest.approx(ref.item(), abs=1e-12)
    loss.backward()
    assert student.grad[1].abs().sum().item() == 0.0  # λ_d = 0 switches a domain off
    assert student.grad[0].abs().sum().item() > 0.0


def test_real_tiny_teachers_end_to_end(tmp_path) -> None:
    paths = write_area(tmp_path, "posttrain")
    router = DomainRouter({"math": DomainRoute("teacher-reasoning"), "swe": DomainRoute("teacher-agentic", 0.5)})
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (4, 10), generator=gen)
    attn = torch.ones_like(ids)
    resp = torch.zeros(4, 10, dtype=torch.bool)
    resp[:, 4:] = True  # prompt of 4 tokens, response of 6
    routed = router.route(["math", "swe", "swe", "math"])
    answers = {}
    for name, idx in routed.by_teacher.items():
        scorer = TeacherScorer(TeacherConfig(path=paths[name]))
        model = scorer.load()
        got = scorer.run_batch(ids[idx], attn[idx], model)
        assert got.shape == (len(idx), 10)  # O(H): one number per position, no vocab axis
        with torch.no_grad():
            full = torch.log_softmax(model(input_ids=ids[idx]).logits.float(), -1)
        ref = full[:, :-1].gather(-1, ids[idx][:, 1:].unsqueeze(-1)).squeeze(-1)
        assert torch.allclose(got[:, 1:], ref, atol=1e-5)
        answers[name] = got
    teacher_lp = DomainRouter.assemble(routed, answers, (4, 10))
    assert torch.isfinite(teacher_lp).all()

    student_scorer = TeacherScorer(TeacherConfig(path=paths["student"]))
    student = student_scorer.load().train()
    prox = student_scorer.run_batch(ids, attn, student)  # frozen proximal copy: no grad
    logits = student(input_ids=ids, attention_mask=attn).logits
    lp = torch.cat([torch.zeros(4, 1), sampled_logprobs(logits[:, :-1], ids[:, 1:])], 1)
    loss, stats = distill_loss(lp, prox, teacher_lp, resp, routed.weights)
    loss.backward()
    grads = [p.grad for p in student.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert stats.n_tokens.item() == 24
    assert stats.clip_fraction.item() == 0.0  # on-policy: ρ = 1 exactly up to float noise
