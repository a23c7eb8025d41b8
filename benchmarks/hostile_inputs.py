"""Wall time of `scifolio build` over the sample PDFs plus hostile files vs the sample PDFs alone.

    python benchmarks/hostile_inputs.py [PDF_DIR] [--page-timeout 30] [--rounds 2] [--tokenizer DIR]

The hostile files are generated (``tests.pipelines.pdfs.write_hostile``): two PDFs with a page that never
finishes drawing (form XObjects nested 40 deep: one page alone, and the middle page of three), a corrupt,
a truncated, an encrypted, a zero-page, a 20,000-inch-page, an empty and a not-a-PDF file. Target (issue
11): the hostile files add at most 1.5 × (hanging pages × page timeout) of wall time, and nothing is lost
(every sample document gives the same chunks and tokens; every hostile file is quarantined with its reason).
Both builds are real `scifolio build` processes (MinerU flash, the local default runner) from an empty output
directory; the resident memory of every process of the build is sampled every 0.2 s and the peak is reported
per kind (the Beam worker, which here is the driver process; the parse worker; its helper processes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _kind(cmdline: list[str]) -> str:
    text = " ".join(cmdline)
    if "parsing.worker" in text:
        return "parse worker"
    if "multiprocessing" in text:
        return "parse helpers (finishers, lane, MinerU renderers)"
    if "pipelines.cli" in text:
        return "scifolio build (driver = Beam worker, in_memory)"
    return "other: " + Path(cmdline[0]).name if cmdline else ""


def build(inputs: list[str], out: Path, tokenizer: str, page_timeout: float) -> tuple[float, dict[str, float]]:
    """Run `scifolio build`; returns (seconds, peak RSS in MiB per process kind)."""
    import psutil

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "pipelines.cli", "build", *inputs, "--out", str(out), "--tokenizer", tokenizer]
    cmd += ["--page-timeout", str(page_timeout), "--no-progress", "--max-error-rate", "1"]  # hostile on purpose
    peaks: Counter[str] = Counter()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    stop = threading.Event()

    def sample() -> None:
        root = psutil.Process(proc.pid)
        while not stop.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                return
            for p in procs:
                try:
                    kind, rss = _kind(p.cmdline()), p.memory_info().rss / 2**20
                except psutil.Error:
                    continue
                if not kind:  # exited, not yet reaped
                    continue
                peaks[kind] = max(peaks[kind], rss)
            stop.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output, _ = proc.communicate()
    elapsed = time.perf_counter() - t0
    stop.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"scifolio build failed ({proc.returncode}):\n{output.decode()[-4000:]}")
    return elapsed, dict(peaks)


def per_document(out: Path) -> dict[str, tuple[int, int]]:
    """doc_id -> (chunks, tokens) over the build's shards."""
    import pyarrow.parquet as pq

    manifest = json.loads((out / "manifest.json").read_text())
    docs: dict[str, tuple[int, int]] = {}
    for e in manifest["shards"]:
        t = pq.read_table(out / "shards" / e["file"], columns=["doc_id", "n_tokens"]).to_pylist()
        for row in t:
            c, n = docs.get(row["doc_id"], (0, 0))
            docs[row["doc_id"]] = (c + 1, n + row["n_tokens"])
    return docs


def quarantined(out: Path) -> dict[str, set[str]]:
    """source file name -> the stage.reason of its dead letters."""
    reasons: dict[str, set[str]] = {}
    for f in sorted((out / "quarantine").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            row = json.loads(line)
            detail = json.loads(row["detail"]) if isinstance(row["detail"], str) else row["detail"]
            source = detail.get("source") or row["item_id"]
            reasons.setdefault(Path(source).name, set()).add(f"{row['stage']}.{row['reason']}")
    return reasons


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pdf_dir", nargs="?", default=str(ROOT.parent / "shared" / "samples"))
    ap.add_argument("--page-timeout", type=float, default=30.0, help="--page-timeout of both builds (s)")
    ap.add_argument("--rounds", type=int, choices=(1, 2), default=2, help="2: builds in A-B-B-A order; 1: A-B")
    ap.add_argument("--tokenizer", default=None, help="tokenizer path (default: a freshly trained tiny one)")
    args = ap.parse_args()
    os.environ.setdefault("MINERU_HOME", str(ROOT / ".cache" / "mineru"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from tests.pipelines.pdfs import write_hostile

    work = Path(tempfile.mkdtemp(prefix="bench-hostile-"))
    tokenizer = args.tokenizer
    if tokenizer is None:
        from pipelines.tiny import write_tiny_tokenizer

        tokenizer = str(write_tiny_tokenizer(work / "tok"))
    hostile = write_hostile(work / "hostile")
    hanging = sum(h for _, h in hostile.values())
    samples = sorted(str(p) for p in Path(args.pdf_dir).rglob("*") if p.suffix.lower() == ".pdf")
    print(
        f"{len(samples)} sample PDFs, {len(hostile)} hostile files ({hanging} hanging pages), "
        f"page timeout {args.page_timeout:g} s, {os.cpu_count()} cores"
    )

    # A-B-B-A order: on a shared machine the load drifts during a run; the mean over ABBA cancels a linear drift.
    runs: dict[str, list[float]] = {"base": [], "hostile": []}
    mem_base: Counter[str] = Counter()
    mem_host: Counter[str] = Counter()
    for i, which in enumerate(["base", "hostile", "hostile", "base"][: 4 if args.rounds == 2 else 2]):
        inputs = samples if which == "base" else [*samples, str(work / "hostile")]
        t, mem = build(inputs, work / f"out-{which}-{i}", tokenizer, args.page_timeout)
        runs[which].append(t)
        peaks = mem_base if which == "base" else mem_host
        for kind, v in mem.items():
            peaks[kind] = max(peaks[kind], v)
        print(f"  run {i + 1}: {which:<8} {t:8.1f} s", flush=True)
    t_base, t_host = sum(runs["base"]) / len(runs["base"]), sum(runs["hostile"]) / len(runs["hostile"])

    base_docs, host_docs = per_document(work / "out-base-0"), per_document(work / "out-hostile-1")
    lost = {d: v for d, v in base_docs.items() if host_docs.get(d) != v}
    q = quarantined(work / "out-hostile-1")
    wrong = {
        name: (want, sorted(q.get(name, ()))) for name, (want, _) in hostile.items() if want not in q.get(name, ())
    }
    extra, budget = t_host - t_base, 1.5 * hanging * args.page_timeout
    print(f"{'build over the samples (mean)':<44} {t_base:8.1f} s")
    print(f"{'build over the samples + hostile files (mean)':<44} {t_host:8.1f} s")
    print(
        f"hostile files added {extra:.1f} s; target <= 1.5 x {hanging} x {args.page_timeout:g} s = {budget:.0f} s: "
        f"{'met' if extra <= budget else 'NOT met'}"
    )
    print(f"sample documents whose chunks/tokens changed: {len(lost)} {lost or ''}")
    print(f"hostile files without their expected dead letter: {len(wrong)} {wrong or ''}")
    for name, (want, _) in sorted(hostile.items()):
        print(f"  {name:<24} {want:<22} got {sorted(q.get(name, ()))}")
    print("peak RSS (MiB)                                        samples   samples+hostile")
    for kind in sorted(set(mem_base) | set(mem_host)):
        print(f"  {kind:<50} {mem_base.get(kind, 0):8.0f}   {mem_host.get(kind, 0):8.0f}")
    return 0 if extra <= budget and not lost and not wrong else 1


if __name__ == "__main__":
    raise SystemExit(main())
