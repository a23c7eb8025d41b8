"""Pages/s of `scifolio build` (no visual gain) vs. a bare MinerU flash `parse` loop over the same PDFs.

    python benchmarks/build_throughput.py [PDF_DIR] [--tokenizer DIR]

Both sides parse with MinerU flash (text-layer mode: OCR needs models that are not staged here). The build
adds validation, the killable parse worker, box clean-up, crops at 200 DPI, tokenisation, chunking, shard
and manifest writing and the Beam runner's overhead. The bare loop calls MinerU once per file in one
process; MinerU keeps about one core busy. The build is measured with ``scifolio build``'s local default
(``pipelines.jobs.corpus.local_beam_args``: one Beam worker per 1 + backend_lanes cores; the headline ratio),
with one Beam worker and no backend lane (``ParseConfig.backend_lanes=0``: MinerU then runs in one process,
as in the bare loop, and only clean-up/crops overlap it), and, where that differs from the default, with
one Beam worker per core. Each build starts from an empty output directory (no resumption).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def count_pages(paths: list[Path]) -> int:
    import pymupdf

    total = 0
    for p in paths:
        with pymupdf.open(p) as doc:
            total += doc.page_count
    return total


def bare_mineru(paths: list[Path]) -> float:
    from parsing.backends import ensure_mineru_env

    ensure_mineru_env()
    from mineru import parse

    t0 = time.perf_counter()
    for p in paths:
        result = parse(str(p), tier="flash", ocr_mode="txt")  # the same call the mineru backend makes
        result.to_dict()
    return time.perf_counter() - t0


LAYOUT = "fast"
"""``--layout`` of the measured builds: ``fast`` (MinerU and the rules alone: the like-for-like comparison with
the bare MinerU loop, target >= 0.8x) unless ``--layout fused`` is given."""


def build(paths_dir: Path, tokenizer: str, workers: int | None, lanes: int = 1) -> tuple[float, int]:
    """One build from an empty output directory; ``workers=None`` takes ``scifolio build``'s local default.
    Returns (seconds, Beam workers used)."""
    from parsing import ParseConfig
    from parsing.api import close_default_parser
    from pipelines.assembly.build import BuildConfig
    from pipelines.jobs.corpus import local_beam_args, run

    out = Path(tempfile.mkdtemp(prefix="bench-build-"))
    try:
        parse = ParseConfig(backend="mineru", tier="flash", backend_lanes=lanes, layout=LAYOUT)
        config = BuildConfig(tokenizer=tokenizer, parse=parse)
        if workers is None:
            beam_args = local_beam_args(config)
        elif workers == 1:
            beam_args = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
        else:
            beam_args = ["--direct_running_mode=multi_processing", f"--direct_num_workers={workers}"]
        used = int(next(a for a in beam_args if a.startswith("--direct_num_workers=")).split("=")[1])
        t0 = time.perf_counter()
        manifest = run([str(paths_dir)], str(out), config, beam_args, progress=False)
        elapsed = time.perf_counter() - t0
        assert manifest.totals.chunks > 0, "build produced no chunks"
        return elapsed, used
    finally:
        close_default_parser()  # the next build starts its parse worker cold, as a new `scifolio` process does
        shutil.rmtree(out, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pdf_dir", nargs="?", default=str(ROOT.parent / "shared" / "samples"))
    ap.add_argument("--tokenizer", default=None, help="tokenizer path (default: a freshly trained tiny one)")
    ap.add_argument("--layout", default="fast", choices=["fast", "fused"], help="the builds' --layout (default fast)")
    args = ap.parse_args()
    global LAYOUT
    LAYOUT = args.layout
    os.environ.setdefault("MINERU_HOME", str(ROOT / ".cache" / "mineru"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    pdf_dir = Path(args.pdf_dir)
    paths = sorted(p for p in pdf_dir.rglob("*") if p.suffix.lower() == ".pdf")
    if not paths:
        print(f"no PDFs under {pdf_dir}", file=sys.stderr)
        return 2
    tokenizer = args.tokenizer
    if tokenizer is None:
        from pipelines.tiny import write_tiny_tokenizer

        tokenizer = str(write_tiny_tokenizer(Path(tempfile.mkdtemp()) / "tok"))
    pages = count_pages(paths)
    print(f"{len(paths)} PDFs, {pages} pages, {os.cpu_count()} cores")

    t_bare = bare_mineru(paths)
    t_default, n_default = build(pdf_dir, tokenizer, workers=None)
    t_nolane, _ = build(pdf_dir, tokenizer, workers=1, lanes=0)
    rows = [
        ("bare MinerU flash parse loop (1 process)", t_bare),
        (f"scifolio build, default: {n_default} Beam worker(s)", t_default),
        ("scifolio build, 1 Beam worker, no backend lane", t_nolane),
    ]
    cores = max(1, os.cpu_count() or 1)
    if cores != n_default:  # the older default, one Beam worker per core, for contrast
        rows.append((f"scifolio build, {cores} Beam workers (one per core)", build(pdf_dir, tokenizer, cores)[0]))
    for name, t in rows:
        print(f"{name:<48} {t:8.2f} s  {pages / t:7.2f} pages/s")
    print(f"ratio build(default) / bare = {t_bare / t_default:.2f}x   (target >= 0.8x)")
    for name, t in rows[2:]:
        print(f"ratio {name.removeprefix('scifolio ')} / bare = {t_bare / t:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
