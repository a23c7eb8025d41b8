"""Steps/s of the DeepSpeed engine vs. a plain PyTorch loop: same tiny model, batch and optimizer (target ≥ 0.8×).

    python benchmarks/pretrain_step.py --steps 30 --rounds 3 --zero-stage 2

Both sides train a VisualPretrainModel loaded from freshly written tiny models (2 layers, d=64) with
torch.optim.AdamW and gradient clipping 1.0, on the same pre-built packed batches (text rows with image slots
plus page renders). Rounds alternate plain/DeepSpeed so a noisy shared CPU hits both alike; medians and the median paired
ratio are reported.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30, help="timed optimizer steps per round")
    ap.add_argument("--rounds", type=int, default=3, help="alternating plain/DeepSpeed rounds")
    ap.add_argument("--zero-stage", type=int, default=2)
    args = ap.parse_args()

    from pretrain.train import init_distributed

    init_distributed()
    import deepspeed
    import torch

    from pipelines.tiny import write_area, write_tiny_tokenizer
    from pretrain.config import debug, deepspeed_config
    from pretrain.data import Packer, ShardIndex, model_inputs
    from pretrain.model import VisualPretrainModel
    from tests.pretrain.fixtures import write_corpus

    tmp = Path(tempfile.mkdtemp(prefix="bench-pretrain-"))
    write_area(tmp / "tiny", "pretrain", write_tiny_tokenizer(tmp / "tiny" / "tokenizer"))
    write_corpus(tmp / "out", n_docs=16, n_shards=1, vocab=700)
    cfg = debug(shards=str(tmp / "out"), models=str(tmp / "tiny"), zero_stage=args.zero_stage)
    packer = Packer(cfg.data, ShardIndex.open(cfg.data.shards), 0, 1)
    batches = [model_inputs(packer.next_batch()) for _ in range(8)]

    def build():
        model = VisualPretrainModel.load(cfg.model, cfg.objective, patch=cfg.data.patch, seed=0)
        params = model.trainable_parameters()
        return model, params, torch.optim.AdamW(params, lr=1e-3, betas=cfg.optim.betas, weight_decay=0.0)

    model, params, opt = build()

    def plain_step(i: int) -> float:
        out = model(**batches[i % len(batches)])
        out["loss"].backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out["loss"].item()

    ds_model, ds_params, ds_opt = build()
    engine, *_ = deepspeed.initialize(
        model=ds_model, model_parameters=ds_params, optimizer=ds_opt, config=deepspeed_config(cfg, world_size=1)
    )

    def ds_step(i: int) -> float:
        out = engine(**batches[i % len(batches)])
        engine.backward(out["loss"])
        engine.step()
        return out["loss"].item()

    for i in range(3):  # warm-up: fills the (identical) encoder feature caches and allocator pools
        plain_step(i), ds_step(i)
    rates: dict[str, list[float]] = {"plain": [], "deepspeed": []}
    for _ in range(args.rounds):
        for name, step in (("plain", plain_step), ("deepspeed", ds_step)):
            t0 = time.perf_counter()
            for i in range(args.steps):
                step(i)
            rates[name].append(args.steps / (time.perf_counter() - t0))
    plain, ds = statistics.median(rates["plain"]), statistics.median(rates["deepspeed"])
    print(
        f"model: tiny Llama 2x64 + frozen CLIP tower, micro_batch={cfg.data.micro_batch} seq_len={cfg.data.seq_len} "
        f"pages={cfg.data.pages_per_batch}, AdamW, clip {cfg.optim.grad_clip}, fp32, {torch.get_num_threads()} threads"
    )
    print(f"plain PyTorch loop     : {plain:7.2f} steps/s  (rounds: {', '.join(f'{r:.2f}' for r in rates['plain'])})")
    print(
        f"DeepSpeed ZeRO-{args.zero_stage} engine : {ds:7.2f} steps/s  "
        f"(rounds: {', '.join(f'{r:.2f}' for r in rates['deepspeed'])})"
    )
    paired = statistics.median(d / p for d, p in zip(rates["deepspeed"], rates["plain"]))
    print(
        f"ratio DeepSpeed / plain: {ds / plain:.3f}x of medians, {paired:.3f}x median of paired rounds (target >= 0.8x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
