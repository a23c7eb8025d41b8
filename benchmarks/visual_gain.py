"""Two-pass visual-gain scorer vs. one batched single-pass forward over the same pages, same model.

The baseline is what any VLM scoring costs anyway: the interleaved (text + crops) rows only, through the
same padded, length-sorted batching. Ours adds the text-only pass (shorter rows, no vision tower).
Issue target: two-pass time ≤ 2.2 × single-pass time. Both sides include row building (tokenising,
image preprocessing), measured in one process, best of --repeats.

    python benchmarks/visual_gain.py --pages 32 --hidden 256 --layers 4
"""

from __future__ import annotations

import argparse
import io
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def make_pages(n: int, seed: int = 0) -> list:
    from PIL import Image, ImageDraw

    from formats.records import Block, Crop, Page
    from visual_gain.tiny import corpus

    rng = random.Random(seed)
    words = " ".join(corpus()).replace(".", "").split()
    pages = []
    for i in range(n):
        blocks = []
        n_blocks = rng.randint(3, 7)
        for j in range(n_blocks):
            bbox = (50.0, 40.0 * j, 550.0, 40.0 * j + 30)
            if j % 3 == 1:  # every third block a figure, so most pages carry 1–2 crops
                w, h = rng.randint(120, 400), rng.randint(90, 300)
                im = Image.new("RGB", (w, h), tuple(rng.randrange(256) for _ in range(3)))
                ImageDraw.Draw(im).line([(0, 0), (w, h)], fill=(0, 0, 0), width=3)
                buf = io.BytesIO()
                im.save(buf, "PNG")
                blocks.append(Block("figure", bbox, "", j, crop=Crop.from_png(buf.getvalue(), w, h, 144)))
            else:
                text = " ".join(rng.choice(words) for _ in range(rng.randint(30, 120)))
                blocks.append(Block("text", bbox, text, j))
        pages.append(Page(f"bench{i}", 0, 612.0, 792.0, tuple(blocks), "bench"))
    return pages


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=256, help="decoder width of the random Qwen2-VL")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-image-pixels", type=int, default=28 * 28 * 64, help="≤ 64 image tokens per crop")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default=None, help="a real VLM dir/id instead of the random one")
    args = ap.parse_args(argv)

    import torch

    from pipelines.tiny import TinyKit, write_models
    from visual_gain.scorer import VisualGainConfig, VisualGainScorer
    from visual_gain.tiny import qwen2_vl

    torch.set_num_threads(max(1, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as tmp:
        build = ("vlm", lambda: qwen2_vl(TinyKit(), hidden_size=args.hidden, layers=args.layers))
        path = args.model or write_models(Path(tmp), {"vlm": build})["vlm"]
        cfg = VisualGainConfig(model=path, batch_size=args.batch_size, max_image_pixels=args.max_image_pixels)
        scorer = VisualGainScorer(cfg)
        model = scorer.load()
        pages = make_pages(args.pages)

        def two_pass() -> None:
            scorer.run_batch(pages, model)

        def single_pass() -> None:
            rows = [r for pr in scorer.page_rows(pages, model) for r in pr.rows if r.interleaved]
            scorer.forward_rows(rows, model)

        rows = [r for pr in scorer.page_rows(pages, model) for r in pr.rows]
        n_text = sum(len(r.input_ids) for r in rows if not r.interleaved)
        n_inter = sum(len(r.input_ids) for r in rows if r.interleaved)
        two_pass()  # warm-up (allocator, lazy inits)
        single_pass()
        times: dict[str, list[float]] = {"two_pass": [], "single_pass": []}
        for _ in range(args.repeats):
            for name, fn in (("single_pass", single_pass), ("two_pass", two_pass)):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    best = {k: min(v) for k, v in times.items()}
    n_img_pages = sum(1 for p in pages if any(k == "image" for k, _ in p.content()))
    print(
        f"model: {'random Qwen2-VL' if not args.model else args.model} hidden={args.hidden} layers={args.layers} "
        f"threads={torch.get_num_threads()} dtype={next(model.model.parameters()).dtype}"
    )
    print(
        f"pages: {len(pages)} ({n_img_pages} with crops); tokens: text-only rows {n_text}, interleaved rows {n_inter}"
    )
    for name in ("single_pass", "two_pass"):
        print(
            f"{name:<12} best {best[name]:.3f} s  {len(pages) / best[name]:7.2f} pages/s  (runs: "
            + ", ".join(f"{t:.3f}" for t in times[name])
            + ")"
        )
    ratio = best["two_pass"] / best["single_pass"]
    print(f"ratio two_pass / single_pass time: {ratio:.2f}x  (target ≤ 2.2x: {'met' if ratio <= 2.2 else 'MISSED'})")
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
