"""Parser evaluation: MinerU flash (default) vs PyMuPDF layout on the same PDFs, side by side in one run.

    python benchmarks/parse_backends.py ../shared/samples [--draw /tmp/boxes] [--skip GeoTopo]

Prints, per file and backend: pages, seconds, pages/s and counts of figure/table/equation/caption blocks
(and how many captions are linked), then totals, the pages/s ratio mineru/pymupdf, and the baseline: a bare
MinerU flash ``parse`` loop over the same files with the ratio of our pipeline (validation, worker
isolation, box clean-up, crops) to it. ``--draw`` writes
every page with its boxes drawn (``parsing.visualize``) for looking at box quality. Skips when the
directory is missing (the samples are third-party and not part of the repository).
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KINDS = ("figure", "table", "equation", "caption")


def run(files: list[Path], backend: str, draw: Path | None) -> dict[str, dict]:
    from parsing import Dropped, Page, ParseConfig, Parser
    from parsing.visualize import draw_boxes

    cfg = ParseConfig(backend=backend)
    stats: dict[str, dict] = {}
    with Parser() as parser:
        list(parser.iter_parse(files[0].read_bytes(), str(files[0]), cfg))  # warm up: worker start, model load
        for f in files:
            data = f.read_bytes()
            t0 = time.perf_counter()
            recs = list(parser.iter_parse(data, str(f), cfg))
            dt = time.perf_counter() - t0
            c: collections.Counter[str] = collections.Counter()
            parsers: collections.Counter[str] = collections.Counter()
            for r in recs:
                if isinstance(r, Page):
                    parsers[r.parser] += 1
                    c.update(b.kind for b in r.blocks)
                    c["linked"] += sum(1 for b in r.blocks if b.kind == "caption" and b.caption_of is not None)
                    c["crops"] += len(r.crops)
                    if draw is not None:
                        d = draw / backend
                        d.mkdir(parents=True, exist_ok=True)
                        (d / f"{f.stem[:30]}_p{r.page_index:03d}.png").write_bytes(draw_boxes(data, r, 60))
                elif isinstance(r, Dropped):
                    c["dropped"] += 1
            stats[f.name] = {"pages": sum(parsers.values()), "seconds": dt, "counts": c, "parsers": dict(parsers)}
    return stats


def bare_mineru(files: list[Path]) -> tuple[int, float]:
    """The baseline: MinerU flash ``parse`` on each whole file in this process (no validation, no crops,
    no worker isolation or timeouts), as a user of MinerU alone would run it."""
    from parsing.backends import ensure_mineru_env

    ensure_mineru_env()
    from mineru import parse
    from mineru.utils.logger import configure_global_log_level

    configure_global_log_level("WARNING")
    parse(str(files[0]), tier="flash", ocr_mode="txt", page_range="1")  # warm up
    pages, secs = 0, 0.0
    for f in files:
        t0 = time.perf_counter()
        r = parse(str(f), tier="flash", ocr_mode="txt")
        secs += time.perf_counter() - t0
        pages += len(r.pages)
    return pages, secs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("samples", type=Path)
    ap.add_argument("--draw", type=Path, default=None)
    ap.add_argument("--skip", action="append", default=[], help="skip files whose name contains this")
    args = ap.parse_args()
    if not args.samples.is_dir():
        print(f"skip: {args.samples} not found (the sample PDFs are not part of the repository)")
        return 0
    files = sorted(p for p in args.samples.glob("*.pdf") if not any(s in p.name for s in args.skip))
    results = {b: run(files, b, args.draw) for b in ("mineru", "pymupdf")}
    head = f"{'file':44s} {'backend':8s} {'pages':>5s} {'s':>6s} {'p/s':>5s} " + " ".join(f"{k[:4]:>4s}" for k in KINDS)
    print(head + "  link crops parsers")
    tot = {b: [0, 0.0] for b in results}
    for f in files:
        for b, stats in results.items():
            s = stats[f.name]
            c = s["counts"]
            tot[b][0] += s["pages"]
            tot[b][1] += s["seconds"]
            cells = " ".join(f"{c[k]:4d}" for k in KINDS)
            print(
                f"{f.name[:44]:44s} {b:8s} {s['pages']:5d} {s['seconds']:6.1f} {s['pages'] / s['seconds']:5.2f} "
                f"{cells}  {c['linked']:4d} {c['crops']:5d} {s['parsers']}"
            )
    for b, (pages, secs) in tot.items():
        print(f"TOTAL {b:8s} pages={pages} seconds={secs:.1f} pages/s={pages / secs:.2f}")
    r = (tot["mineru"][0] / tot["mineru"][1]) / (tot["pymupdf"][0] / tot["pymupdf"][1])
    print(f"ratio pages/s mineru/pymupdf = {r:.2f}")
    pages, secs = bare_mineru(files)
    ours = tot["mineru"][0] / tot["mineru"][1]
    print(f"BASELINE bare MinerU flash parse: pages={pages} seconds={secs:.1f} pages/s={pages / secs:.2f}")
    print(f"ratio pages/s parsing.iter_parse(mineru)/bare MinerU = {ours / (pages / secs):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
