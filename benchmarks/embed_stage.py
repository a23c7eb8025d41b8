"""The index job's embedding stage (Beam ``RunInference`` over ``pipelines.jobs.index.CropEmbedding``) vs a bare
``SentenceTransformer.encode`` loop over the same crops at the same batch size, on one core of DirectRunner.

Crops are PIL-drawn PNGs (random shapes and colours, 224×224 so the model's image preprocessing runs as it
would on real figures); the model is the tiny random CLIP of ``scifolio models tiny`` unless ``--model`` names
another sentence-transformers image model. Runs alternate (loop, Beam, loop, Beam…) and the median of each is
reported, so load from other processes on the machine falls on both sides. Both sides exclude model loading (the
Beam side times its handler's ``load_model`` and subtracts it); the Beam side includes pipeline start-up, reading
the crops from a file and collecting the vectors. Reported twice: wall-clock crops/s, and crops per CPU-second of
this process (the in-memory DirectRunner runs in it), which other jobs on a shared machine disturb much less;
the last line is the CPU ratio.

    nice python benchmarks/embed_stage.py --crops 512 --batch-size 32 --repeats 3
"""

from __future__ import annotations

import argparse
import io
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.beam_timing import cpu_s, run_without_load, timed_handler  # noqa: E402


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


def bare_loop(crops, model_path: str, batch: int) -> tuple[float, float, np.ndarray]:
    """(wall s, CPU s, vectors), model load excluded."""
    from PIL import Image
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_path, device="cpu").eval()
    t, c = time.perf_counter(), cpu_s()
    vecs = []
    for s in range(0, len(crops), batch):
        images = [Image.open(io.BytesIO(c.png)).convert("RGB") for c in crops[s : s + batch]]
        vecs.append(model.encode(images, batch_size=batch, convert_to_numpy=True, show_progress_bar=False))
    return time.perf_counter() - t, cpu_s() - c, np.concatenate(vecs)


def beam_stage(crops, model_path: str, batch: int) -> tuple[float, float, np.ndarray]:
    """(wall s, CPU s, vectors) of the pipeline, start-up included, model load excluded (the loop's is too)."""
    import apache_beam as beam
    from apache_beam.ml.inference.base import RunInference

    from pipelines.jobs.index import IndexJobConfig
    from retrieval.index import IndexConfig

    cfg = IndexJobConfig(out="unused", index=IndexConfig(), embed_model=model_path, batch_size=batch)
    tmp = Path(tempfile.mkdtemp())
    loads = tmp / "loads.txt"
    from pipelines.jobs.index import CropEmbedding

    handler = timed_handler(CropEmbedding, cfg, loads)
    out = tmp / "vectors.npy"
    # The crops enter the pipeline from a file, as the job's ReadCrops reads them from shards: beam.Create would
    # pickle and bz2-compress every crop into the pipeline graph (seconds of construction, not the stage).
    src = tmp / "crops.pkl"
    src.write_bytes(pickle.dumps(crops))
    opts = beam.options.pipeline_options.PipelineOptions(
        ["--runner=DirectRunner", "--direct_running_mode=in_memory", "--direct_num_workers=1"]
    )
    t, c = time.perf_counter(), cpu_s()
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
    wall, cpu = run_without_load(p, t, c, loads)
    return wall, cpu, np.load(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--crops", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--steady",
        action="store_true",
        help="also run both sides on 2 batches per repeat and report the marginal (steady-state) CPU ratio, "
        "without the fixed cost of starting a pipeline",
    )
    ap.add_argument("--model", default=None, help="sentence-transformers image model (default: tiny random CLIP)")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    model = args.model
    if model is None:
        from pipelines.tiny import write_area

        model = write_area(Path(tempfile.mkdtemp()), "retrieval")["retrieval-clip"]
    crops = make_crops(args.crops)
    bare_loop(crops[: 2 * args.batch_size], model, args.batch_size)  # warm-up of both sides: imports, caches
    beam_stage(crops[: 2 * args.batch_size], model, args.batch_size)
    runs: dict[str, list[tuple[float, float]]] = {"loop": [], "beam": []}
    small: dict[str, list[float]] = {"loop": [], "beam": []}  # CPU s of a 2-batch run: the fixed costs
    for _ in range(args.repeats):
        w, c, ref = bare_loop(crops, model, args.batch_size)
        runs["loop"].append((w, c))
        w, c, out = beam_stage(crops, model, args.batch_size)
        runs["beam"].append((w, c))
        norm = ref / np.linalg.norm(ref, axis=1, keepdims=True)
        assert np.allclose(out, norm, atol=1e-5), "RunInference output differs from the bare loop"
        if args.steady:
            small["loop"].append(bare_loop(crops[: 2 * args.batch_size], model, args.batch_size)[1])
            small["beam"].append(beam_stage(crops[: 2 * args.batch_size], model, args.batch_size)[1])
    n = len(crops)
    rate = {k: ([n / w for w, _ in v], [n / c for _, c in v]) for k, v in runs.items()}
    for key, name in (("loop", "bare encode loop"), ("beam", "RunInference stage")):
        wall, cpu = rate[key]
        print(
            f"{name:<18} {statistics.median(wall):7.1f} crops/s wall (runs {', '.join(f'{x:.1f}' for x in wall)}); "
            f"{statistics.median(cpu):7.1f} crops/CPU-s (runs {', '.join(f'{x:.1f}' for x in cpu)})"
        )
    print(f"crops={args.crops} batch={args.batch_size} torch_threads=1")
    if args.steady:
        # what a long job pays per crop: the CPU of the N-crop run minus that of a 2-batch run, per crop
        dn = n - 2 * args.batch_size
        marginal = {k: [dn / (c - s) for (_, c), s in zip(runs[k], small[k])] for k in runs}
        fixed = {k: statistics.median(v) for k, v in small.items()}
        print(
            f"fixed CPU s of a 2-batch run: loop {fixed['loop']:.2f}, RunInference {fixed['beam']:.2f}; steady state "
            f"(marginal) crops/CPU-s: loop {statistics.median(marginal['loop']):.1f} "
            f"(runs {', '.join(f'{x:.1f}' for x in marginal['loop'])}), RunInference "
            f"{statistics.median(marginal['beam']):.1f} (runs {', '.join(f'{x:.1f}' for x in marginal['beam'])})"
        )
        m_ratio = statistics.median(marginal["beam"]) / statistics.median(marginal["loop"])
        print(f"steady-state ratio (CPU, marginal): {m_ratio:.3f}")
    print(f"wall-clock ratio: {statistics.median(rate['beam'][0]) / statistics.median(rate['loop'][0]):.3f}")
    print(f"embed_stage_ratio (CPU): {statistics.median(rate['beam'][1]) / statistics.median(rate['loop'][1]):.3f}")


if __name__ == "__main__":
    main()
