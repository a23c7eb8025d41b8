"""The corpus job's visual-gain stage (Beam ``RunInference`` over ``pipelines.jobs.scoring.VisualGainScoring``) vs
the direct batched scorer loop (``VisualGainScorer.run_batch`` over each document's pages, as the job's DoFn did
before) over the same pages, same batch size, same model, on one core of DirectRunner.

Pages are those of ``benchmarks/visual_gain.py`` (seeded text blocks and PIL-drawn figures) grouped into
documents of 1–6 pages; the model is a random Qwen2-VL (``--hidden``, ``--layers``) unless ``--model`` names a
real one. Runs alternate (loop, Beam, loop, Beam…) and the median of each is reported, so load from other
processes falls on both sides. Both sides exclude model loading (the Beam side times its handler's
``load_model`` and subtracts it); the Beam side includes pipeline start-up and reading the documents from a
file. Reported twice: wall-clock pages/s, and pages per CPU-second of this process (the in-memory DirectRunner
runs in it), which other jobs on a shared machine disturb much less. Scores must be equal (bit for bit) or the
script fails.

    nice python benchmarks/vg_stage.py --pages 48 --batch-size 8 --repeats 3
"""

from __future__ import annotations

import argparse
import pickle
import random
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.beam_timing import cpu_s, run_without_load, timed_handler  # noqa: E402


def make_documents(n_pages: int, seed: int = 0) -> list:
    from benchmarks.visual_gain import make_pages
    from formats.records import Document
    from pipelines.assembly.build import PendingDocument

    rng = random.Random(seed)
    pages = make_pages(n_pages, seed)
    docs, i = [], 0
    while i < len(pages):
        k = min(rng.randint(1, 6), len(pages) - i)
        doc_id = f"{len(docs):064x}"
        doc_pages = [replace(p, doc_id=doc_id, page_index=j) for j, p in enumerate(pages[i : i + k])]
        docs.append(PendingDocument(doc_id, f"doc{len(docs)}.pdf", Document(doc_id, "x", k), doc_pages, [], {}))
        i += k
    return docs


def direct_loop(docs, scorer, model) -> tuple[float, float, dict]:
    """(wall s, CPU s, scores) of ``run_batch`` over each document's pages."""
    t, c = time.perf_counter(), cpu_s()
    scores = {p.page_id: p.scores["visual_gain"] for d in docs for p in scorer.run_batch(d.pages, model)}
    return time.perf_counter() - t, cpu_s() - c, scores


def beam_stage(docs, slot) -> tuple[float, float, dict]:
    """(wall s, CPU s, scores) of the pipeline, its model load excluded."""
    import apache_beam as beam
    from apache_beam.ml.inference.base import RunInference

    from pipelines.jobs.scoring import VisualGainScoring

    tmp = Path(tempfile.mkdtemp())
    src, out = tmp / "docs.pkl", tmp / "scores.pkl"
    # documents enter from a file, as ProcessDocument hands them over: beam.Create would pickle and compress
    # every page into the pipeline graph (construction time, not the stage)
    src.write_bytes(pickle.dumps(docs))
    opts = beam.options.pipeline_options.PipelineOptions(
        ["--runner=DirectRunner", "--direct_running_mode=in_memory", "--direct_num_workers=1"]
    )

    def collect(results) -> None:
        for r in results:
            if r.inference.pages is None:
                raise RuntimeError(f"scoring failed: {r.inference.error}")
        out.write_bytes(pickle.dumps({p.page_id: p.scores["visual_gain"] for r in results for p in r.inference.pages}))

    loads = tmp / "loads.txt"
    t, c = time.perf_counter(), cpu_s()
    p = beam.Pipeline(options=opts)
    (
        p
        | beam.Create([str(src)], reshuffle=False)
        | beam.FlatMap(lambda path: pickle.loads(Path(path).read_bytes()))
        | RunInference(timed_handler(VisualGainScoring, slot, loads))
        | beam.combiners.ToList()
        | beam.Map(collect)
    )
    wall, cpu = run_without_load(p, t, c, loads)
    return wall, cpu, pickle.loads(out.read_bytes())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=48)
    ap.add_argument("--hidden", type=int, default=256, help="decoder width of the random Qwen2-VL")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-image-pixels", type=int, default=28 * 28 * 64, help="≤ 64 image tokens per crop")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--model", default=None, help="a real VLM dir/id instead of the random one")
    args = ap.parse_args(argv)

    import torch

    from pipelines.jobs.stages import VisualGainSlot
    from pipelines.tiny import TinyKit, write_models
    from visual_gain.scorer import VisualGainConfig, VisualGainScorer
    from visual_gain.tiny import qwen2_vl

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        build = ("vlm", lambda: qwen2_vl(TinyKit(), hidden_size=args.hidden, layers=args.layers))
        path = args.model or write_models(Path(tmp), {"vlm": build})["vlm"]
        cfg = VisualGainConfig(model=path, batch_size=args.batch_size, max_image_pixels=args.max_image_pixels)
        slot = VisualGainSlot(cfg)
        scorer = VisualGainScorer(cfg)
        model = scorer.load()
        docs = make_documents(args.pages)
        direct_loop(docs[:2], scorer, model)  # warm-up (allocator, lazy inits)
        beam_stage(docs[:1], slot)  # Beam's own first-use imports and caches (the loop's warm-up above)
        runs: dict[str, list[tuple[float, float]]] = {"loop": [], "beam": []}
        for _ in range(args.repeats):
            w, c, ref = direct_loop(docs, scorer, model)
            runs["loop"].append((w, c))
            w, c, got = beam_stage(docs, slot)
            runs["beam"].append((w, c))
            if got != ref:
                raise SystemExit("RunInference scores differ from the direct scorer loop")
    n = sum(len(d.pages) for d in docs)
    rate = {k: ([n / w for w, _ in v], [n / c for _, c in v]) for k, v in runs.items()}
    print(
        f"model: {'random Qwen2-VL' if not args.model else args.model} hidden={args.hidden} layers={args.layers} "
        f"threads={args.threads}; pages={args.pages} in {len(docs)} documents; batch={args.batch_size}"
    )
    for key, name in (("loop", "direct run_batch loop"), ("beam", "RunInference stage")):
        wall, cpu = rate[key]
        print(
            f"{name:<22} {statistics.median(wall):7.2f} pages/s wall (runs {', '.join(f'{x:.2f}' for x in wall)}); "
            f"{statistics.median(cpu):7.2f} pages/CPU-s (runs {', '.join(f'{x:.2f}' for x in cpu)})"
        )
    print("scores equal: yes (bit for bit, every run)")
    ratio_cpu = statistics.median(rate["beam"][1]) / statistics.median(rate["loop"][1])
    print(f"wall-clock ratio: {statistics.median(rate['beam'][0]) / statistics.median(rate['loop'][0]):.3f}")
    print(f"vg_stage_ratio (CPU): {ratio_cpu:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
