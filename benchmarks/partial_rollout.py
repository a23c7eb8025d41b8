"""Partial rollout vs synchronous rollout on the HF engine with long-tailed (lognormal) forced lengths.

    python benchmarks/partial_rollout.py [--steps 20] [--capacity 64] [--group 4] [--mu 3.0] [--sigma 1.0]

Both schedulers drive the same ``HFEngine`` (tiny random Qwen2, fp32, 1 thread) with the same capacity and
the same batch (``capacity`` trajectories = capacity/group groups per learner step). Each request's length is
forced (``SamplingParams.forced_length``) from lognormal(mu, sigma), clipped to [1, max_len], drawn per
(group, sample) so both runs see the same distribution. The learner is replaced by a weight perturbation
(the engine must still re-prefill paused requests under new weights; the training itself is not what is
measured). Counted in engine steps (one batched decode step) and wall time:

- occupancy: decoded slot-steps / (engine steps × capacity)  (target ≥ 0.9 for partial)
- goodput: trained tokens per engine step, partial / sync  (target ≥ 1.5×)
- stale waste: tokens discarded (stale restart) or masked out of the loss (pinned restarted trajectories'
  tokens > max_stale versions old) / tokens sampled  (target ≤ 25%)
- length ratio: mean trained length / mean length of the requested distribution  (target ≥ 0.7)
- trained tokens are the tokens in the loss (loss mask 1)
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class _Source:
    def __init__(self) -> None:
        self.cursor = 0

    def next_prompt(self):
        from posttrain.rollout.scheduler import Prompt

        i = self.cursor
        self.cursor += 1
        return Prompt(f"p{i}", [2, 3 + i % 9, 12], {"group": i})

    def state_dict(self):
        return {"cursor": self.cursor}

    def load_state_dict(self, s):
        self.cursor = s["cursor"]


def run(partial: bool, args: argparse.Namespace) -> dict[str, float]:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from posttrain.rollout.engines.hf import HFEngine
    from posttrain.rollout.scheduler import PartialRolloutScheduler, SchedulerConfig, SyncScheduler
    from posttrain.rollout.types import SamplingParams

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=args.max_len + 16,
    )
    model = Qwen2ForCausalLM(cfg).eval()
    engine = HFEngine(model, capacity=args.capacity)
    requested: list[int] = []

    def forced(prompt, j, params):
        rng = random.Random(f"{prompt.meta['group']}/{j}")
        n = int(min(args.max_len, max(1, round(math.exp(rng.gauss(args.mu, args.sigma))))))
        requested.append(n)
        return replace(params, forced_length=n, max_new_tokens=args.max_len)

    sc = SchedulerConfig(
        batch_target=args.capacity // args.group, group_size=args.group, max_stale=args.max_stale, dapo=False
    )
    cls = PartialRolloutScheduler if partial else SyncScheduler
    sched = cls(engine, _Source(), lambda t: 0.0, SamplingParams(max_new_tokens=args.max_len), sc, params_fn=forced)
    t0, c0 = time.perf_counter(), time.process_time()
    trained_lengths: list[int] = []
    for _ in range(args.steps):
        batch = sched.collect()
        trained_lengths += [t.n_tokens for g in batch.groups for t in g]
        with torch.no_grad():  # stand-in for a learner step: new weights, new version
            state = {k: v + 1e-3 * torch.randn_like(v) for k, v in model.state_dict().items()}
        sched.sync(state, sched.version + 1)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    tot = sched.totals
    return {
        "engine_steps": tot["engine_steps"],
        "wall_s": wall,
        "occupancy": tot["decoded"] / tot["slots"],
        "trained_tokens": tot["trained_tokens"],
        "tokens_per_step": tot["trained_tokens"] / tot["engine_steps"],
        "cpu_s": cpu,
        "tokens_per_s": tot["trained_tokens"] / wall,
        "tokens_per_cpu_s": tot["trained_tokens"] / cpu,
        "stale_waste": (tot["discarded_tokens"] + tot["stale_masked_tokens"]) / max(tot["sampled_tokens"], 1),
        "stale_masked_tokens": tot["stale_masked_tokens"],
        "discarded": tot["discarded_trajectories"],
        "old_version_fraction": tot["old_version_tokens"] / max(tot["trained_tokens"], 1),
        "length_ratio": (sum(trained_lengths) / len(trained_lengths)) / (sum(requested) / len(requested)),
        "mean_trained_len": sum(trained_lengths) / len(trained_lengths),
        "mean_requested_len": sum(requested) / len(requested),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20, help="learner steps (weight syncs) per run")
    ap.add_argument("--capacity", type=int, default=64, help="engine slots; also the batch size in trajectories")
    ap.add_argument("--group", type=int, default=4, help="samples per prompt")
    ap.add_argument("--mu", type=float, default=3.0, help="lognormal mu of the forced lengths (median e^mu)")
    ap.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma")
    ap.add_argument("--max-len", type=int, default=512, help="length cap")
    ap.add_argument("--max-stale", type=int, default=3, help="staleness bound in versions")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    print(
        f"HFEngine tiny Qwen2, capacity {args.capacity}, group {args.group}, batch {args.capacity} trajectories, "
        f"{args.steps} learner steps, lengths lognormal(mu={args.mu}, sigma={args.sigma}) ≤ {args.max_len}, "
        f"max_stale {args.max_stale}"
    )
    res = {"sync": run(False, args), "partial": run(True, args)}
    keys = list(res["sync"])
    print(f"{'':24s}{'sync':>12s}{'partial':>12s}")
    for k in keys:
        print(f"{k:24s}{res['sync'][k]:12.3f}{res['partial'][k]:12.3f}")
    s, p = res["sync"], res["partial"]
    print(f"goodput ratio (trained tokens / engine step): {p['tokens_per_step'] / s['tokens_per_step']:.2f}x  (≥ 1.5)")
    print(f"wall-clock ratio (trained tokens / s):        {p['tokens_per_s'] / s['tokens_per_s']:.2f}x")
    print(f"CPU-time ratio (trained tokens / CPU s):      {p['tokens_per_cpu_s'] / s['tokens_per_cpu_s']:.2f}x")
    print(
        f"partial occupancy {p['occupancy']:.3f} (≥ 0.9), stale waste {p['stale_waste']:.3f} (≤ 0.25), "
        f"length ratio {p['length_ratio']:.3f} (≥ 0.7)"
    )


if __name__ == "__main__":
    main()
