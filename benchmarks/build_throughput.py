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

Steady state (``--pages N``): the samples are repeated, each copy made distinct by bytes appended after
``%%EOF`` (a new content hash; readers ignore them), until the corpus has ≥ N pages, so start-up weighs little.
The baseline is then the **same parser configuration at the same parallelism**: ``parsing.api.iter_parse``
with the build's ``ParseConfig`` (the same parse worker and MinerU lanes), in as many processes as the build
has Beam workers, each over its share of the files; the ratio is the job's own overhead (validation, crops,
tokenising, chunking, shards, manifest, Beam), whatever the parser costs. Near-duplicate removal is off on
the build side (the copies are near-duplicates by construction). With ``--repeats R`` the loop and the build run
R times each, in pairs whose order alternates, so a load that drifts during the run hits both sides alike; the
last line is ``steady_state_ratio: R``, the median of the pairs' ratios.

    python benchmarks/build_throughput.py /work/shared/samples --pages 1000 --repeats 2
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
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


def build(
    paths_dir: Path, tokenizer: str, workers: int | None, lanes: int = 1, dedup: bool = True
) -> tuple[float, int]:
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
        if not dedup:
            config = dataclasses.replace(config, dedup=None)
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


def repeat_corpus(paths: list[Path], min_pages: int) -> tuple[Path, list[Path], int]:
    """Copies of ``paths`` with distinct content hashes until they hold ≥ ``min_pages`` pages."""
    out = Path(tempfile.mkdtemp(prefix="bench-pages-"))
    per = {p: count_pages([p]) for p in paths}
    files, pages, k = [], 0, 0
    while pages < min_pages:
        for p in paths:
            dst = out / f"{k:04d}-{p.name}"
            dst.write_bytes(p.read_bytes() + f"\n%scifolio-copy-{k}\n".encode())
            files.append(dst)
            pages += per[p]
        k += 1
    return out, files, pages


def _parse_share(args: tuple[list[str], object]) -> int:
    from parsing.api import close_default_parser, iter_parse

    files, config = args
    n = 0
    try:
        for f in files:
            for _ in iter_parse(Path(f).read_bytes(), f, config):
                n += 1
    finally:
        close_default_parser()
    return n


def same_parser_loop(files: list[Path], lanes: int, workers: int) -> float:
    """``iter_parse`` with the build's ParseConfig over ``files`` in ``workers`` processes (1 = this one)."""
    from parsing import ParseConfig

    config = ParseConfig(backend="mineru", tier="flash", backend_lanes=lanes, layout=LAYOUT)
    shares = [[str(f) for f in files[i::workers]] for i in range(workers)]
    t0 = time.perf_counter()
    if workers == 1:
        _parse_share((shares[0], config))
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
            list(pool.map(_parse_share, [(s, config) for s in shares]))
    return time.perf_counter() - t0


def steady_state(pdf_paths: list[Path], min_pages: int, tokenizer: str, repeats: int = 1) -> int:
    """``repeats`` pairs of (``iter_parse`` loop, build), the order alternating pair by pair (loop first, then
    build first, ...) so that a load that drifts during the run hits both sides alike; the ratio printed last is
    the median of the pairs' ratios."""
    from parsing import ParseConfig
    from pipelines.assembly.build import BuildConfig
    from pipelines.jobs.corpus import local_beam_args

    corpus, files, pages = repeat_corpus(pdf_paths, min_pages)
    lanes = ParseConfig().backend_lanes
    workers = int(
        next(
            a
            for a in local_beam_args(BuildConfig(tokenizer=tokenizer, parse=ParseConfig()))
            if a.startswith("--direct_num_workers=")
        ).split("=")[1]
    )
    print(
        f"{len(files)} PDFs ({len(pdf_paths)} samples repeated), {pages} pages, {os.cpu_count()} cores, "
        f"{workers} Beam worker(s) / parse processes, backend_lanes={lanes}, {repeats} pair(s)",
        flush=True,
    )

    def loop() -> float:
        t = same_parser_loop(files, lanes, workers)
        print(f"iter_parse loop, same ParseConfig, {workers} process(es): {t:8.2f} s  {pages / t:7.2f} pages/s")
        return t

    def job() -> float:
        t, used = build(corpus, tokenizer, workers=None, lanes=lanes, dedup=False)
        print(f"scifolio build, default ({used} Beam worker(s)):       {t:8.2f} s  {pages / t:7.2f} pages/s")
        return t

    ratios = []
    try:
        for i in range(repeats):
            if i % 2 == 0:
                t_loop, t_build = loop(), job()
            else:
                t_build, t_loop = job(), loop()
            ratios.append(t_loop / t_build)
            print(f"pair {i + 1}: ratio {ratios[-1]:.3f}   (load average {os.getloadavg()[0]:.2f})", flush=True)
    finally:
        shutil.rmtree(corpus, ignore_errors=True)
    print(f"steady_state_ratio: {statistics.median(ratios):.3f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pdf_dir", nargs="?", default=str(ROOT.parent / "shared" / "samples"))
    ap.add_argument("--tokenizer", default=None, help="tokenizer path (default: a freshly trained tiny one)")
    ap.add_argument("--layout", default="fast", choices=["fast", "fused"], help="the builds' --layout (default fast)")
    ap.add_argument("--pages", type=int, default=None, help="steady state: repeat the samples to >= N pages")
    ap.add_argument("--repeats", type=int, default=1, help="steady state: (loop, build) pairs, order alternating")
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
    if args.pages:
        return steady_state(paths, args.pages, tokenizer, args.repeats)
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
