"""The index job's embedding stage (Beam ``RunInference`` over ``pipelines.jobs.index.CropEmbedding``) vs a bare
``SentenceTransformer.encode`` loop over the same crops at the same batch size, on one core of DirectRunner.

Crops are PIL-drawn PNGs (random shapes and colours, 224×224 so the model's image preprocessing runs as it
would on real figures); the model is the tiny random CLIP of ``scifolio models tiny`` unless ``--model`` names
another sentence-transformers image model. Runs alternate (loop, Beam, loop, Beam…) and the median of each is
reported, so load from other processes on the machine falls on both sides.

    nice python benchmarks/embed_stage.py --crops 512 --batch-size 32 --repeats 3
"""

from __future__ import annotations

import argparse
import io
import pickle
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def make_crops(n: int, size: int = 224):
    from PIL import Image, ImageDraw

    from retrieval.crops import CropItem

    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        im = Image.new("RGB", (size, size), tuple(int(c) for c in rng.integers(0, 255, 3)))
        d = ImageDraw.Draw(im)
        for _ in range(4):
            x0, y0 = (int(v) for v in rng.integers(0, size // 2, 2))
            d.rectangle([x0, y0, x0 + size // 3, y0 + size // 4], fill=tuple(int(c) for c in rng.integers(0, 255, 3)))
        buf = io.BytesIO()
        im.save(buf, "PNG")
        out.append(CropItem(f"{i:064x}", buf.getvalue(), size, size, "figure", "d", 0, "s", i, ""))
    return out


def bare_loop(crops, model_path: str, batch: int) -> tuple[float, np.ndarray]:
    from PIL import Image
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_path, device="cpu").eval()
    t = time.perf_counter()
    vecs = []
    for s in range(0, len(crops), batch):
        images = [Image.open(io.BytesIO(c.png)).convert("RGB") for c in crops[s : s + batch]]
        vecs.append(model.encode(images, batch_size=batch, convert_to_numpy=True, show_progress_bar=False))
    return len(crops) / (time.perf_counter() - t), np.concatenate(vecs)


def beam_stage(crops, model_path: str, batch: int) -> tuple[float, np.ndarray]:
    """Pipeline throughput, start-up included, model load excluded (the loop's is too): RunInference's own
    load-time metric is subtracted."""
    import apache_beam as beam
    from apache_beam.ml.inference.base import RunInference

    from pipelines.jobs.index import CropEmbedding, IndexJobConfig
    from retrieval.index import IndexConfig

    cfg = IndexJobConfig(out="unused", index=IndexConfig(), embed_model=model_path, batch_size=batch)
    handler = CropEmbedding(cfg)
    tmp = Path(tempfile.mkdtemp())
    out = tmp / "vectors.npy"
    # The crops enter the pipeline from a file, as the job's ReadCrops reads them from shards: beam.Create would
    # pickle and bz2-compress every crop into the pipeline graph (seconds of construction, not the stage).
    src = tmp / "crops.pkl"
    src.write_bytes(pickle.dumps(crops))
    opts = beam.options.pipeline_options.PipelineOptions(
        ["--runner=DirectRunner", "--direct_running_mode=in_memory", "--direct_num_workers=1"]
    )
    t = time.perf_counter()
    p = beam.Pipeline(options=opts)
    if True:
        (
            p
            | beam.Create([str(src)], reshuffle=False)
            | beam.FlatMap(lambda path: pickle.loads(Path(path).read_bytes()))
            | RunInference(handler)
            | beam.Map(lambda r: (int(r.example.row), r.inference[0]))
            | beam.combiners.ToList()
            | beam.Map(lambda xs: np.save(out, np.stack([v for _, v in sorted(xs, key=lambda x: x[0])])))
        )
    result = p.run()
    result.wait_until_finish()
    # RunInference reports its own model load time; the loop's load is outside its timing too.
    load_ms = sum(
        d.committed.sum
        for d in result.metrics().query()["distributions"]
        if d.key.metric.name.endswith("load_model_latency_milli_secs")
    )
    elapsed = time.perf_counter() - t - load_ms / 1000
    return len(crops) / elapsed, np.load(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--crops", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default=None, help="sentence-transformers image model (default: tiny random CLIP)")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    model = args.model
    if model is None:
        from pipelines.tiny import write_area

        model = write_area(Path(tempfile.mkdtemp()), "retrieval")["retrieval-clip"]
    crops = make_crops(args.crops)
    loop_r, beam_r = [], []
    for _ in range(args.repeats):
        r, ref = bare_loop(crops, model, args.batch_size)
        loop_r.append(r)
        r, out = beam_stage(crops, model, args.batch_size)
        beam_r.append(r)
        norm = ref / np.linalg.norm(ref, axis=1, keepdims=True)
        assert np.allclose(out, norm, atol=1e-5), "RunInference output differs from the bare loop"
    lo, be = statistics.median(loop_r), statistics.median(beam_r)
    print(f"bare encode loop: {lo:.1f} crops/s  (runs {', '.join(f'{x:.1f}' for x in loop_r)})")
    print(f"RunInference stage: {be:.1f} crops/s  (runs {', '.join(f'{x:.1f}' for x in beam_r)})")
    print(f"crops={args.crops} batch={args.batch_size} torch_threads=1")
    print(f"embed_stage_ratio: {be / lo:.3f}")


if __name__ == "__main__":
    main()
