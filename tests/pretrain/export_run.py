"""A short DeepSpeed pre-training run that also records the engine's own logits on a fixed input, for the export
test to compare the exported model against.

    python -m tests.pretrain.export_run SHARDS MODELS OUT ZERO_STAGE                  # one rank
    python -m torch.distributed.run --nproc_per_node 2 -m tests.pretrain.export_run SHARDS MODELS OUT 3

Writes OUT/ckpt (the run) and OUT/engine_logits.pt (rank 0): the trained backbone's logits on ``probe_ids()``,
computed by the engine that trained it (under ZeRO-3 with every rank's partition gathered).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch


def probe_ids() -> torch.Tensor:
    return torch.tensor([[5, 17, 99, 42, 7, 300, 11, 64, 23, 501, 2, 9]])


def main(shards: str, models: str, out: str, zero_stage: str) -> None:
    from pretrain.config import debug
    from pretrain.train import shutdown_distributed, train

    def record(engine) -> None:  # noqa: ANN001
        import deepspeed
        import torch.distributed as dist

        backbone = engine.module.backbone.eval()
        with deepspeed.zero.GatheredParameters(list(backbone.parameters()), enabled=int(zero_stage) == 3):
            with torch.no_grad():
                logits = backbone(input_ids=probe_ids()).logits
        if dist.get_rank() == 0:
            torch.save(logits, Path(out) / "engine_logits.pt")

    cfg = debug(
        shards=shards,
        models=models,
        out_dir=out,
        max_steps=3,
        save_every=2,
        zero_stage=int(zero_stage),
        tensorboard=False,
        **{"data.seq_len": 64},
    )
    train(cfg, on_end=record)
    shutdown_distributed()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(*sys.argv[1:5])
