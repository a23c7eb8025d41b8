"""Mutational fuzzing of PDFs through `scifolio build`: every mutant accounted for, no crash, no hang.

    python benchmarks/fuzz_pdfs.py [SEED_DIR] [--mutants 60] [--seed 0] [--page-timeout 10] [--backend B --layout L]

The parser is the one `scifolio build` uses by default (``ParseConfig``: MinerU with the fused layout) unless
``--backend``/``--layout`` say otherwise; the first line of the output names it.

Seeds are the PDFs of SEED_DIR (default ``/work/shared/samples``; with ``--generated``, or when the folder
is missing, two small papers written by ``tests.pipelines.pdfs.write_paper``). Each mutant is one seed with one
mutation: ``flip`` (random bytes overwritten), ``truncate`` (cut at a random offset), ``xref`` (the xref table
and ``startxref`` offset garbled), ``stream`` (bytes inside a content/image stream garbled, or its ``/Length``
changed), ``nesting`` (an object replaced by arrays and dictionaries nested thousands deep), ``objects`` (an
``obj``/``endobj`` pair removed or duplicated). All mutants go through ONE real `scifolio build` process
(``--max-error-rate 1``: failures are expected, they must be accounted for), with a wall-clock budget.

What is counted, per input and in total:
- crashes: the build exits non-zero, leaves no manifest, or an input is left ``retryable`` (an infrastructure
  failure caused by a file is a crash of ours);
- hangs: the build ran past its budget (``page timeout × pages + start-up``) and was killed (every input
  it had not accounted for counts), plus page dead letters whose detail says a page ran past the timeout by
  more than the slack (none can, by construction; the count proves it);
- losses: inputs that are neither in the shards nor in quarantine (by content hash, or by path for unreadable).
Peak RSS of the whole process tree is sampled every 0.2 s. The last line is ``crashes: N, hangs: N, losses: N``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MUTATIONS = ("flip", "truncate", "xref", "stream", "nesting", "objects")


def mutate(data: bytes, kind: str, rng: random.Random) -> bytes:
    b = bytearray(data)
    if kind == "flip":
        for _ in range(rng.randint(1, 64)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif kind == "truncate":
        del b[rng.randint(1, max(1, len(b) - 1)) :]
    elif kind == "xref":
        i = data.rfind(b"startxref")
        if i >= 0:
            b[i + 9 : i + 30] = b"\n" + str(rng.randrange(10**9)).encode() + b"\n%%EOF"
        j = data.rfind(b"xref", 0, i if i > 0 else len(data))
        if j >= 0:
            for k in range(j + 5, min(len(b), j + 400)):
                if rng.random() < 0.2 and chr(b[k]).isdigit():
                    b[k] = ord(str(rng.randrange(10)))
    elif kind == "stream":
        starts = [m.end() for m in re.finditer(rb"stream\r?\n", data)]
        if starts:
            s = rng.choice(starts)
            if rng.random() < 0.5:
                for _ in range(rng.randint(1, 200)):
                    k = s + rng.randrange(2048)
                    if k < len(b):
                        b[k] = rng.randrange(256)
            else:
                lengths = list(re.finditer(rb"/Length (\d+)", data))
                if lengths:
                    m = rng.choice(lengths)
                    b[m.start(1) : m.end(1)] = str(rng.choice([0, 1, 10**9, int(m.group(1)) * 3])).encode()
    elif kind == "nesting":
        objs = list(re.finditer(rb"\d+ 0 obj", data))
        if objs:
            m = rng.choice(objs)
            depth = rng.choice([500, 5000, 50000])
            deep = (b"[" * depth + b"]" * depth) if rng.random() < 0.5 else (b"<</A " * depth + b">>" * depth)
            b[m.end() : m.end()] = b"\n" + deep + b"\n"
    elif kind == "objects":
        objs = list(re.finditer(rb"\d+ 0 obj.*?endobj", data, re.S))
        if objs:
            m = rng.choice(objs)
            b[m.start() : m.end()] = b"" if rng.random() < 0.5 else data[m.start() : m.end()] * 2
    return bytes(b)


def seeds(folder: Path | None, scratch: Path) -> list[Path]:
    if folder is not None and folder.is_dir():
        found = sorted(p for p in folder.iterdir() if p.suffix.lower() == ".pdf")
        if found:
            return found
    from tests.pipelines.pdfs import write_paper

    scratch.mkdir(parents=True, exist_ok=True)
    return [write_paper(scratch / "paper-a.pdf", n_pages=2, seed=1), write_paper(scratch / "paper-b.pdf", 1, seed=2)]


def _tree_rss_mb(pid: int) -> float:
    import psutil

    try:
        p = psutil.Process(pid)
        procs = [p, *p.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for q in procs:
        try:
            total += q.memory_info().rss / 2**20
        except psutil.Error:
            pass
    return total


def run_build(
    inputs: Path, out: Path, tokenizer: str, page_timeout: float, backend: str, layout: str, budget_s: float
) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SCIFOLIO_PARSE_TEST_HANG", None)
    env.pop("SCIFOLIO_PARSE_TEST_RAISE", None)
    cmd = [sys.executable, "-m", "pipelines.cli", "build", str(inputs), "--out", str(out), "--tokenizer", tokenizer]
    cmd += ["--backend", backend, "--layout", layout, "--page-timeout", str(page_timeout), "--no-progress"]
    cmd += ["--max-error-rate", "1"]
    cmd += ["--max-tokens", "2048", "--overlap", "32", "--no-dedup"]  # every mutant goes through the whole parse
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    peak = [0.0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _tree_rss_mb(proc.pid))
            stop.wait(0.2)

    threading.Thread(target=sample, daemon=True).start()
    killed = False
    try:
        stdout, stderr = proc.communicate(timeout=budget_s)
    except subprocess.TimeoutExpired:
        killed = True
        os.killpg(proc.pid, 9)
        stdout, stderr = proc.communicate()
    stop.set()
    return {
        "rc": proc.returncode,
        "killed": killed,
        "wall_s": time.monotonic() - t0,
        "peak_rss_mb": peak[0],
        "stdout": stdout.decode(errors="replace"),
        "stderr": stderr.decode(errors="replace"),
    }


def account(inputs: dict[str, str], out: Path) -> tuple[dict[str, str], int]:
    """input name -> where it went ("shard", "stage.reason", "retryable" or "LOST"), and late page timeouts."""
    from formats.manifest import Manifest
    from formats.quarantine import iter_quarantine
    from formats.shards import ShardFile

    where: dict[str, str] = {}
    in_shards: set[str] = set()
    for e in Manifest.read(out).shards:
        in_shards |= ShardFile(str(out / "shards" / e.file)).doc_ids()
    by_id: dict[str, str] = {}
    for d in iter_quarantine(out / "quarantine"):
        if ":" in d.item_id and len(d.item_id.split(":")[0]) == 64 and d.item_id.split(":")[1].isdigit():
            continue  # a page of a document accounted for by its document
        key = d.item_id.split("@")[0]
        by_id[key] = "retryable" if d.reason == "retryable" else f"{d.stage}.{d.reason}"
        src = (d.detail or {}).get("source")
        if src:
            by_id.setdefault(Path(src).name, by_id[key])
    for name, digest in inputs.items():
        if digest in in_shards:
            where[name] = "shard"
        else:
            where[name] = by_id.get(digest) or by_id.get(name) or "LOST"
    return where, 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("seed_dir", nargs="?", default="/work/shared/samples")
    ap.add_argument("--generated", action="store_true", help="seed with two generated papers, not SEED_DIR")
    ap.add_argument("--mutants", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--page-timeout", type=float, default=10.0)
    from parsing.config import ParseConfig

    ap.add_argument("--backend", default=ParseConfig.backend, help="layout backend (default: the build's default)")
    ap.add_argument("--layout", default=ParseConfig.layout, help="fused or fast (default: the build's default)")
    ap.add_argument("--tokenizer", default=None, help="tokenizer dir (default: the tiny one, written to a temp dir)")
    ap.add_argument("--json", default=None, help="also write the figures as JSON here")
    ap.add_argument(
        "--kinds", default=",".join(MUTATIONS), help=f"mutations to use (default all: {','.join(MUTATIONS)})"
    )
    args = ap.parse_args(argv)
    kinds_used = [k for k in args.kinds.split(",") if k]
    unknown = set(kinds_used) - set(MUTATIONS)
    if unknown or not kinds_used:
        ap.error(f"unknown mutation(s) {sorted(unknown)}; choose from {MUTATIONS}")

    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="fuzz-pdfs-") as tmp:
        tmp_path = Path(tmp)
        seed_files = seeds(None if args.generated else Path(args.seed_dir), tmp_path / "seeds")
        tokenizer = args.tokenizer
        if tokenizer is None:
            from pipelines.tiny import write_tiny_tokenizer

            tokenizer = str(write_tiny_tokenizer(tmp_path / "tokenizer"))
        inputs_dir = tmp_path / "inputs"
        inputs_dir.mkdir()
        inputs: dict[str, str] = {}
        kinds: dict[str, str] = {}
        pages = 0
        import pymupdf

        for i in range(args.mutants):
            kind = kinds_used[i % len(kinds_used)]
            src = (
                seed_files[(i // len(kinds_used)) % len(seed_files)]
                if i < len(seed_files) * len(kinds_used)
                else rng.choice(seed_files)
            )
            data = mutate(src.read_bytes(), kind, rng)
            name = f"m{i:04d}-{kind}-{src.stem[:24]}.pdf"
            (inputs_dir / name).write_bytes(data)
            inputs[name], kinds[name] = hashlib.sha256(data).hexdigest(), kind
            try:
                with pymupdf.open(stream=data, filetype="pdf") as d:
                    pages += d.page_count
            except Exception:
                pages += 1
        budget = 120 + args.page_timeout * max(pages, len(inputs)) * 1.5
        r = run_build(inputs_dir, tmp_path / "out", tokenizer, args.page_timeout, args.backend, args.layout, budget)
        manifest = (tmp_path / "out" / "manifest.json").exists()
        where = account(inputs, tmp_path / "out")[0] if manifest else {n: "LOST" for n in inputs}
        crashes = int(r["rc"] != 0 and not r["killed"]) + int(not manifest and not r["killed"])
        crashes += sum(1 for v in where.values() if v == "retryable")
        hangs = sum(1 for v in where.values() if v == "LOST") if r["killed"] else 0
        losses = 0 if r["killed"] else sum(1 for v in where.values() if v == "LOST")

    outcome = Counter(f"{kinds[n]:<9} {v}" for n, v in where.items())
    print(f"backend: {args.backend} (layout {args.layout})")
    print(f"seeds: {len(seed_files)}  mutants: {len(inputs)}  pages (as opened here): {pages}")
    print(f"build: rc={r['rc']} killed={r['killed']} wall={r['wall_s']:.1f}s (budget {budget:.0f}s) ", end="")
    print(f"peak RSS of the build's process tree: {r['peak_rss_mb']:.0f} MiB")
    for key, n in sorted(outcome.items()):
        print(f"  {key:<48}{n:>5}")
    if crashes and r["stderr"]:
        print(r["stderr"][-3000:], file=sys.stderr)
    figures = {
        "backend": args.backend,
        "layout": args.layout,
        "mutants": len(inputs),
        "seeds": len(seed_files),
        "crashes": crashes,
        "hangs": hangs,
        "losses": losses,
        "wall_s": round(r["wall_s"], 1),
        "peak_rss_mb": round(r["peak_rss_mb"]),
        "outcomes": dict(Counter(where.values())),
    }
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    print(f"crashes: {crashes}, hangs: {hangs}, losses: {losses}")
    return 0 if crashes == hangs == losses == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
