"""Pages/s of `scifolio build` (no visual gain) vs. a bare MinerU flash `parse` loop over the same PDFs.

    python benchmarks/build_throughput.py [PDF_DIR] [--repeat 1]

Both sides parse with MinerU flash (text-layer mode: OCR needs models that are not staged here). The build adds validation, the killable parse worker, crops at
200 DPI, tokenisation, chunking, shard writing and the Beam runner's overhead. The build is measured
with one Beam worker (same parallelism as the bare loop: the fair ratio) and with the default local
setting (one worker per core). Each build starts from an empty output directory (no resumption).
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


def build(paths_dir: Path, tokenizer: str, workers: int) -> float:
    from parsing import ParseConfig
    from pipelines.build import BuildConfig
    from pipelines.corpus import run

    out = Path(tempfile.mkdtemp(prefix="bench-build-"))
    try:
        config = BuildConfig(tokenizer=tokenizer, parse=ParseConfig(backend="mineru", tier="flash"))
        beam_args = (
            ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
            if workers == 1
            else ["--direct_running_mode=multi_processing", f"--direct_num_workers={workers}"]
        )
        t0 = time.perf_counter()
        manifest = run([str(paths_dir)], str(out), config, beam_args, progress=False)
        elapsed = time.perf_counter() - t0
        assert manifest["totals"]["chunks"] > 0, "build produced no chunks"
        return elapsed
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pdf_dir", nargs="?", default=str(ROOT.parent / "shared" / "samples"))
    ap.add_argument("--tokenizer", default=None, help="tokenizer path (default: a freshly trained tiny one)")
    args = ap.parse_args()
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
    t_build1 = build(pdf_dir, tokenizer, workers=1)
    n = max(1, os.cpu_count() or 1)
    t_buildn = build(pdf_dir, tokenizer, workers=n) if n > 1 else t_build1

    rows = [
        ("bare MinerU flash parse loop (1 process)", t_bare),
        ("scifolio build, 1 Beam worker", t_build1),
        (f"scifolio build, {n} Beam workers (default)", t_buildn),
    ]
    for name, t in rows:
        print(f"{name:<45} {t:8.2f} s  {pages / t:7.2f} pages/s")
    print(f"ratio build(1 worker) / bare = {t_bare / t_build1:.2f}x   (target >= 0.8x)")
    print(f"ratio build({n} workers) / bare = {t_bare / t_buildn:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
