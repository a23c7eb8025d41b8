"""The one RL driver's semantics (SPEC §C): BKL at matched weights, R3 on by itself for MoE policies, engine kinds
and their refusals, every shaping stage and learner option reachable through ``--set``.

    PYTHONPATH=. python -m pytest tests/posttrain/rl/test_driver.py -q
"""

from __future__ import annotations

import json
import math
import subprocess

import pytest
import torch

from formats.overrides import with_overrides
from posttrain.rl import engines
from posttrain.rl.loop import run
from posttrain.rl.recipes import debug, debug_moe
from tests.conftest import in_loopback_namespace
from tests.posttrain.rl.test_cli_rl import cli, env, rows


def small(cfg, **sets):
    base = {"steps": "3", "scheduler.batch_target": "4", "engine_capacity": "40", "sampling.max_new_tokens": "8"}
    return with_overrides(cfg, {**base, **sets})


# -- BKL at matched weights ------------------------------------------------------------------------------------
def test_bkl_masks_engine_mismatch_not_drift(tmp_path, one_torch_thread):
    """Strong drift (lr 1e-2, 4 minibatches, partial rollout: tokens of older versions in every batch) moves the
    IS weights (clip_fraction > 0) while the engine and the learner, numerically identical at equal weights, agree
    on every token they both saw at the learner's version: the mask stays (almost) empty."""
    cfg = small(debug(), **{"steps": "6", "learner.lr": "0.01", "learner.n_minibatches": "4"})
    r = run(cfg, tmp_path, progress=False)
    assert max(x["max_lag"] for x in r) >= 1  # partial rollout carried tokens across syncs
    assert max(x["clip_fraction"] for x in r) > 0  # drift: the IS weight's job
    assert sum(x["bkl_masked_fraction"] for x in r) / len(r) < 1e-3
    assert all(x["matched_mismatch_abs_max"] < 1e-3 for x in r)
    assert min(x["bkl_compared_fraction"] for x in r[1:]) > 0.3  # resumed prefixes were rescored at the new version
    # DAPO's dropped trajectories, by reason in the row and by id in trained.jsonl
    per_group = cfg.scheduler.group_size
    drops = [(x.get("dropped_dapo_all_equal", 0), len(t["dapo_dropped"]), x["dapo_dropped_groups"] * per_group)
             for x, t in zip(r, rows(tmp_path, "trained.jsonl"))]  # fmt: skip
    assert all(a == b == c for a, b, c in drops) and sum(a for a, _, _ in drops) > 0, drops


class ShiftChosen:
    """Fault injector around an engine: the engine reports a very different probability for every third token
    it hands back (as a broken kernel would); the learner must mask exactly those."""

    def __init__(self, engine):
        self.engine, self.chosen = engine, {}

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def step(self):
        out = self.engine.step()
        for t in out.finished:
            for j in range(0, t.n_tokens, 3):
                a = math.exp(t.logprobs[j])
                t.logprobs[j] = math.log(0.999 if a < 0.5 else 0.001)
            self.chosen[t.request_id] = set(range(0, t.n_tokens, 3))
        return out


def test_bkl_masks_exactly_the_tokens_whose_engine_probability_was_perturbed(tmp_path, one_torch_thread):
    from posttrain.rl.learner import Learner

    seen = {}
    original = Learner.update

    def spy(self, p, adv):
        out = original(self, p, adv)
        seen["mask"] = self.last_mask
        return out

    cfg = small(debug(), **{"steps": "1", "scheduler.partial": "false"})  # every token sampled at the version
    box = {}

    def wrap(engine):
        box["w"] = ShiftChosen(engine)
        return box["w"]

    Learner.update = spy
    try:
        run(cfg, tmp_path, progress=False, wrap_engine=wrap)
    finally:
        Learner.update = original
    trained = json.loads((tmp_path / "trained.jsonl").read_text().splitlines()[0])["ids"]
    m = seen["mask"]
    masked = m["response"] & ~m["kept"]
    assert bool(m["compared"][m["response"]].all())
    for i, rid in enumerate(trained):
        n = int(m["response"][i].sum())
        expect = {j for j in box["w"].chosen[rid] if j < n}
        assert {j for j in range(n) if masked[i, j]} == expect, rid


# -- R3 by itself ---------------------------------------------------------------------------------------------
def moe_cli(out, *extra):
    args = cli(out, *extra)
    assert args[5:7] == ["--config", "debug"]
    return [*args[:6], "debug-moe", *args[7:]]


def test_moe_policy_records_and_replays_routes_through_the_cli(tmp_path):
    done = subprocess.run(moe_cli(tmp_path, "--set", "steps=2"), env=env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    r = rows(tmp_path)
    assert len(r) == 2 and all(x["r3_replayed_tokens"] > 0 for x in r)
    assert json.loads((tmp_path / "config.json").read_text())["policy"]["arch"] == "qwen2_moe"


def _flip_engine_routes(engine):
    """A second implementation whose top-k tie-breaking differs: the engine's routers pick experts from noisy
    scores (gate weights still from the true logits at those ids), as two kernels can disagree on near-ties."""
    from posttrain.objectives.r3 import find_routers, replay_gate_weights

    gen = torch.Generator().manual_seed(0)

    def hook(module, _inputs, output):
        logits, _w, ids = output
        noisy = logits + 0.5 * torch.randn(logits.shape, generator=gen)
        new = noisy.topk(module.top_k, dim=-1).indices
        return logits, replay_gate_weights(logits, new, True), new.to(ids.dtype)

    for router in find_routers(engine.model):
        router.register_forward_hook(hook, prepend=True)  # before the R3 recorder: it records what ran
    return engine


@pytest.mark.parametrize("kind, replay", [("hf", True), ("hf", False), ("speculative", True), ("speculative", False)])
def test_r3_makes_engine_and_learner_agree_when_routing_differs(tmp_path, one_torch_thread, kind, replay):
    sets = {"steps": "2", "scheduler.partial": "false", "learner.replay_routes": str(replay), "engine.kind": kind}
    r = run(engines.resolve(small(debug_moe(), **sets)), tmp_path, progress=False, wrap_engine=_flip_engine_routes)
    gap = max(x["matched_mismatch_abs_max"] for x in r)
    if replay:
        assert gap < 1e-4 and all(x["r3_replayed_tokens"] > 0 for x in r)
    else:
        assert gap > 0.05 and "r3_replayed_tokens" not in r[0]


def test_fused_engine_records_the_routes_of_the_policy_inside_it(tmp_path, one_torch_thread):
    """The fused engine samples from Eq 3's mixture, so its logprobs are not the policy's; what R3 needs is that
    the routes it records are the policy's own, one row per fed position, and that the learner replays them."""
    cfg = engines.resolve(small(debug_moe(), **{"steps": "2", "engine.kind": "fused"}))
    r = run(cfg, tmp_path, progress=False)
    assert all(x["r3_replayed_tokens"] > 0 for x in r)


def test_moe_policy_on_ray_replays_routes(tmp_path):
    if not in_loopback_namespace():
        pytest.skip("Ray binds every interface: run inside `unshare -n sh -c 'ip link set lo up && exec pytest ...'`")
    done = subprocess.run(
        moe_cli(tmp_path, "--set", "steps=2", "--ray", "local"), env=env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert all(x["r3_replayed_tokens"] > 0 for x in rows(tmp_path))


# -- engine kinds ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "sets, message",
    [
        ({"engine.kind": "fused", "engine.ray": "local"}, "engine.kind=fused on Ray: refused"),
        ({"engine.kind": "scripted", "engine.ray": "local"}, "engine.kind=scripted on Ray: refused"),
        ({"engine.kind": "vllm"}, "engine.kind=vllm in process: vLLM is not installed"),
        ({"engine.kind": "vllm", "engine.ray": "local"}, r"engine.kind=vllm on Ray \(local\): vLLM is not installed"),
        ({"speculative.enabled": "true", "memdec.enabled": "true"}, "one engine kind per run"),
        ({"engine.kind": "hf", "engine.ray": "local", "engine.workers": "0"}, "at least one Ray worker"),
    ],
)
def test_refused_pairs_say_which_and_why(sets, message):
    pytest.importorskip("ray")
    if "vllm" in sets.get("engine.kind", ""):
        try:
            import vllm  # noqa: F401

            pytest.skip("vLLM is installed here")
        except ImportError:
            pass
    with pytest.raises(engines.EngineRefused, match=message):
        engines.resolve(with_overrides(debug(), sets))


@pytest.mark.parametrize("kind", ["scripted"])
def test_moe_policy_on_an_engine_that_cannot_record_routes_is_refused(kind):
    with pytest.raises(engines.EngineRefused, match=f"MoE policy on engine.kind={kind}: refused"):
        engines.resolve(with_overrides(debug_moe(), {"engine.kind": kind}))


def test_refusal_reaches_the_cli_as_an_error(tmp_path):
    done = subprocess.run(
        cli(tmp_path, "--set", "engine.kind=fused", "--ray", "local"), env=env(), capture_output=True, text=True
    )
    assert done.returncode == 2 and "engine.kind=fused on Ray: refused" in done.stderr


def test_spellings_resolve_to_engine_kinds():
    assert engines.resolve(with_overrides(debug(), {"speculative.enabled": "true"})).engine.kind == "speculative"
    assert engines.resolve(with_overrides(debug(), {"memdec.enabled": "true"})).engine.kind == "fused"
    cfg = engines.resolve(with_overrides(debug(), {"engine.kind": "speculative"}))
    assert cfg.speculative.enabled and not cfg.memdec.enabled


def test_scripted_engine_runs_in_process(tmp_path, one_torch_thread):
    r = run(small(debug(), **{"steps": "1", "engine.kind": "scripted"}), tmp_path, progress=False)
    assert r[0]["trained_tokens"] > 0 and r[0]["bkl_masked_fraction"] > 0.5  # its logprobs are not the model's


# -- everything reachable -------------------------------------------------------------------------------------
def test_every_shaping_stage_and_learner_option_is_reachable_by_set(tmp_path):
    sets = [
        "learner.shaping.gepo.h_low=0.5",
        "learner.shaping.gepo.h_high=6",
        "learner.shaping.gepo.c_low=0.5",
        "learner.shaping.gepo.c_high=1.5",
        "learner.shaping.length.tau=0.25",
        "learner.shaping.length.alpha=0.3",
        "learner.shaping.length.gamma=2",
        "learner.shaping.dapo_atol=0.01",
        "scheduler.dapo=false",
        "learner.clip.eps_low=0.1",
        "learner.clip.eps_high=0.3",
        "learner.bkl_phi=0.05",
        "learner.kl_beta=0.01",
        "learner.grad_clip=0.5",
        "learner.optimizer=muon",
        "learner.schedule=cosine",
        "learner.min_lr_ratio=0.2",
        "learner.warmup_steps=1",
        "learner.weight_decay=0.01",
        "learner.replay_routes=false",
        "policy.dtype=bfloat16",
    ]
    args = [*cli(tmp_path), "--print-config"]
    for s in sets:
        args += ["--set", s]
    done = subprocess.run(args, env=env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    cfg = json.loads(done.stdout)
    learner = cfg["learner"]
    assert learner["shaping"]["gepo"] == {"h_low": 0.5, "h_high": 6.0, "c_low": 0.5, "c_high": 1.5}
    assert learner["shaping"]["length"] == {"tau": 0.25, "alpha": 0.3, "gamma": 2.0}
    assert (learner["optimizer"], learner["schedule"], cfg["policy"]["dtype"]) == ("muon", "cosine", "bfloat16")
    assert learner["clip"]["eps_high"] == 0.3 and learner["kl_beta"] == 0.01 and cfg["scheduler"]["dapo"] is False


def test_gepo_set_changes_the_advantages_and_is_recorded(tmp_path, one_torch_thread):
    from posttrain.objectives.advantages import shape

    gepo = {"h_low": "100", "h_high": "200", "c_low": "0.25", "c_high": "1"}  # every group below H_low: x0.25
    cfg = with_overrides(debug(), {f"learner.shaping.gepo.{k}": v for k, v in gepo.items()})
    rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    logprobs, mask = torch.full((1, 4, 3), -0.1), torch.ones(1, 4, 3, dtype=torch.bool)
    plain = shape(rewards, logprobs, mask, config=debug().learner.shaping).advantages
    shaped = shape(rewards, logprobs, mask, config=cfg.learner.shaping).advantages
    assert torch.allclose(shaped[plain > 0], 0.25 * plain[plain > 0]) and torch.equal(
        shaped[plain < 0], plain[plain < 0]
    )
    run(small(cfg, steps="1"), tmp_path, progress=False)
    assert json.loads((tmp_path / "config.json").read_text())["learner"]["shaping"]["gepo"]["c_low"] == 0.25


# -- precision map and optimizers -----------------------------------------------------------------------------
def test_muon_takes_the_hidden_matrices_and_adamw_the_rest():
    from posttrain.rl.learner import make_optimizers

    cfg = with_overrides(debug(), {"learner.optimizer": "muon"})
    model, _ = engines.build_policy(cfg)
    muon, adamw = make_optimizers(model, cfg.learner)
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    in_muon = {id(q) for g in muon.param_groups for q in g["params"]}
    assert all(q.ndim == 2 for g in muon.param_groups for q in g["params"])
    assert id(model.get_input_embeddings().weight) not in in_muon
    assert muon.param_groups[0]["adjust_lr_fn"] == "match_rms_adamw"
    n_all = sum(1 for q in model.parameters())
    assert len(in_muon) + sum(len(g["params"]) for g in adamw.param_groups) == n_all


def test_cosine_schedule_decays_to_min_lr_ratio():
    from posttrain.fit import lr_factor

    cfg = with_overrides(debug(), {"learner.schedule": "cosine", "learner.min_lr_ratio": "0.2"}).learner
    got = [lr_factor(u, 100, cfg.schedule, cfg.min_lr_ratio, cfg.warmup_steps) for u in (0, 50, 100)]
    assert got == pytest.approx([1.0, 0.6, 0.2])


def test_bfloat16_engine_with_fp32_learner(tmp_path, one_torch_thread):
    cfg = small(debug(), **{"steps": "2", "policy.dtype": "bfloat16"})
    seen = {}
    run(cfg, tmp_path, progress=False, wrap_engine=lambda e: seen.setdefault("e", e))
    assert next(seen["e"].model.parameters()).dtype == torch.bfloat16
    policy = torch.load(tmp_path / "checkpoint" / "state.pt", weights_only=False)["learner"]["model"]
    assert all(v.dtype == torch.float32 for v in policy.values() if v.is_floating_point())
    r = rows(tmp_path)
    # bf16 sampling vs fp32 re-scoring: a real, small engine/trainer mismatch at equal weights, measured
    assert 0 < r[-1]["matched_mismatch_abs_max"] < 1.0


def test_posttrain_memdec_is_the_memdec_command():
    import argparse

    from pipelines.cli import memdec, posttrain

    top = argparse.ArgumentParser(prog="scifolio")
    sub = top.add_subparsers(dest="command")
    posttrain.register(sub)
    memdec.register(sub)
    a = top.parse_args(["posttrain", "memdec", "train", "--work-dir", "w", "--resume"])
    b = top.parse_args(["memdec", "train", "--work-dir", "w", "--resume"])
    assert a.func is b.func is memdec.run_memdec
    assert (a.memdec_command, a.work_dir, a.resume) == (b.memdec_command, b.work_dir, b.resume) == ("train", "w", True)


def test_a_missing_policy_path_is_refused_with_what_writes_one(tmp_path):
    for path in (str(tmp_path / "lm"), "real/lm"):  # a path, and a name that is no cached hub model
        with pytest.raises(engines.EngineRefused, match="models real DIR"):
            engines.build_policy(engines.PolicyConfig(path=path))
    cmd = cli(tmp_path / "run")
    cmd[cmd.index("debug")] = "smol"  # its default policy.path, real/lm, is not in tmp_path
    out = subprocess.run(cmd, cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "policy.path=real/lm: no such model directory" in out.stderr
