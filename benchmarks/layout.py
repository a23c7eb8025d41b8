"""Layout quality: figure / table / display-equation boxes of ``scifolio parse`` (fused and rules-only) and of
each wrapped backend used bare, scored against reference boxes, side by side, with pages/s; the fusion fitted
leave-one-file-out; the same rows on generated pages, digital and scanned copies apart.

    python benchmarks/layout.py ../shared/devset --fit [-v] [--only fused,rules,yolo] [--draw /tmp/layout]
    python benchmarks/layout.py --synthetic 40 --only fused,rules,yolo
    python benchmarks/layout.py ../shared/devset --degraded --only fused,yolo   # scans of the dev set's pages
    python benchmarks/layout.py ../shared/samples --labelled --degraded --only rules,yolo --fit
                             # the fusion of scanned pages fitted on degraded copies against self-labels

DIR holds ``pdfs/*.pdf`` and ``truth/*.json`` (``{"pdf": NAME, "pages": {"0": [{"kind", "bbox"}]}}``,
PDF points, top-left origin, 0-based pages). A predicted box matches a reference box of the same kind
when IoU >= 0.5, greedily best IoU first: the rule of the development set's ``score.py`` (copied below
verbatim; ``tests/parsing/test_layout_bench.py`` checks it against that file when present).

Rows:
- ``fused`` — ``parsing.Parser.iter_parse`` with the default ``ParseConfig`` (what ``scifolio parse``
  writes): MinerU flash + the layout rules (the rapid-layout scan path for image-only pages), fused with the
  YOLO DocLayNet detector by ``parsing.fusion.FITTED`` (fitted on all dev files: in-sample on the devset).
- ``rules`` — the same with ``layout="fast"``: MinerU + rules alone (what the parser was before issue 26).
- ``mineru`` — MinerU flash ``parse`` on the whole file, its blocks mapped to our kinds, nothing else.
- ``pymupdf`` — PyMuPDF's ONNX layout model (``pymupdf.layout`` via pymupdf4llm) on every page.
- ``rapid-layout`` — the scan path (page render, rapid-layout CDLA regions, OCR text) on every page, without
  our cut of equation regions at prose lines.
- ``yolo`` — the DocLayNet YOLOv8n detector (``parsing.detectors``) on every page.
- ``eqfinder`` — the pixel-level display-equation finder (``parsing.eqfinder``, trained on self-labelled
  pages) on every page: equations only (not in the default rows).
- ``LOFO rules+yolo`` (with ``--fit``) — ``parsing.fusion.fuse`` on the rules and yolo rows' boxes, each file
  with parameters fitted on the other files only (grid search per kind, ``fit``); pages/s is the sum of the
  two rows' times. ``LOFO rules+yolo+pymupdf`` likewise with PyMuPDF's layout as a third voter.
Bare backends run in this process after one warm-up page; ``fused``/``rules`` run in the worker, warmed on
the first file. pages/s counts all pages of all files, wall clock. With ``--rounds N`` every row is loaded
first, then the rows take turns, N passes each, and pages/s is the median pass (on a shared machine rows
timed in the same round see about the same load); ``fused / mineru`` is printed when both rows ran, and each
row's CPU seconds a page (this process and its children), which does not depend on the machine's load:

    python benchmarks/layout.py --synthetic 10 --no-scans --seed 3 --only mineru,fused,rules,yolo --rounds 3

Self-labelled layout data (``parsing.selflabel``: display equations from the text layer, degraded page images,
split by document), and the labels scored against reference boxes where a FOLDER with ``truth/`` is given (or
generated pages with ``--synthetic N``), on the pages that have a text layer:

    python benchmarks/layout.py --self-label ../shared/samples --out /tmp/selflabel
    python benchmarks/layout.py --self-label ../shared/devset/pdfs --out /tmp/sl-dev ../shared/devset
    python benchmarks/layout.py --self-label --synthetic 40 --seed 11 --out /tmp/sl-syn
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KINDS = ("figure", "table", "equation")
PAGE_TIMEOUT_S = 900.0
ROWS = ("fused", "rules", "mineru", "pymupdf", "rapid-layout", "yolo")


# ---- scoring: the development set's score.py rule, unchanged ------------------------------------------
def iou(a, b):
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    area_a = max(0.0, a[2] - a[0]) * max(0.0, a[3] - a[1])
    area_b = max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1])
    union = area_a + area_b - inter
    return inter / union if union > 0 else 0.0


def matches(truth, pred, thr=0.5):
    pairs = sorted(((iou(t, p), i, j) for i, t in enumerate(truth) for j, p in enumerate(pred)), reverse=True)
    used_t, used_p = set(), set()
    for v, i, j in pairs:
        if v < thr:
            break
        if i not in used_t and j not in used_p:
            used_t.add(i)
            used_p.add(j)
    return len(used_t)


def prf(a: int, n: int, p: int) -> tuple[float, float, float]:
    pr, rc = (a / p if p else 0.0), (a / n if n else 0.0)
    return pr, rc, (2 * pr * rc / (pr + rc) if pr + rc else 0.0)


Preds = dict[str, dict[str, list[tuple[str, list[float], float]]]]  # pdf -> page ("0") -> [(kind, bbox, score)]


def score(refs: list[dict], preds: Preds, verbose: bool = False) -> dict[str, tuple[int, int, int]]:
    """kind (and "micro") -> (matched, reference count, predicted count), as score.py counts them."""
    tp, nt, npred = defaultdict(int), defaultdict(int), defaultdict(int)
    for ref in refs:
        pred = preds.get(ref["pdf"], {})
        f = [0, 0, 0]
        for page in set(ref["pages"]) | set(pred):
            for k in KINDS:
                t = [b["bbox"] for b in ref["pages"].get(page, []) if b["kind"] == k]
                p = [bb for kk, bb, *_ in pred.get(page, []) if kk == k]
                h = matches(t, p)
                tp[k] += h
                nt[k] += len(t)
                npred[k] += len(p)
                f[0] += h
                f[1] += len(t)
                f[2] += len(p)
        if verbose:
            print(f"    {ref['pdf']}: matched {f[0]} of {f[1]} reference boxes, {f[2]} predicted")
    out = {k: (tp[k], nt[k], npred[k]) for k in KINDS}
    out["micro"] = (sum(tp.values()), sum(nt.values()), sum(npred.values()))
    return out


def load_refs(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((folder / "truth").glob("*.json"))]


def restrict(refs: list[dict], preds: Preds) -> Preds:
    """Predictions limited to what the references can judge: a reference file with ``"kinds"`` (self-labelled
    truth, complete only for those kinds) and ``"scored"`` (its pages with a text layer) counts nothing else."""
    out: Preds = {}
    for ref in refs:
        pred = preds.get(ref["pdf"], {})
        kinds, pages = ref.get("kinds", KINDS), ref.get("scored")
        out[ref["pdf"]] = {
            pg: [x for x in bs if x[0] in kinds] for pg, bs in pred.items() if pages is None or pg in pages
        }
    return out


def write_labelled(pdf_dir: Path) -> Path:
    """A temporary folder (pdfs/ + truth/) of ``pdf_dir``'s PDFs whose truth is their self-labels
    (``parsing.selflabel``): display equations of every page with a text layer; the other kinds unlabelled."""
    import shutil
    import tempfile

    from parsing.selflabel import label_pdf

    out = Path(tempfile.mkdtemp(prefix="scifolio-labelled-"))
    (out / "pdfs").mkdir()
    (out / "truth").mkdir()
    for f in sorted(pdf_dir.glob("*.pdf")):
        shutil.copy(f, out / "pdfs" / f.name)
        pages = {
            str(i): [{"kind": lb.kind, "bbox": list(lb.bbox)} for lb in labels if lb.kind == "equation"]
            for i, labels in label_pdf(f)
            if labels is not None
        }
        ref = {"pdf": f.name, "pages": pages, "kinds": ["equation"], "scored": sorted(pages)}
        (out / "truth" / f"{f.name}.json").write_text(json.dumps(ref))
    return out


# ---- runners: each returns (predictions, pages, seconds) -----------------------------------------------
def _add(preds: Preds, name: str, page: int, kind: str, bbox, score: float | None = None) -> None:
    if kind in KINDS:
        s = 1.0 if score is None else float(score)
        preds.setdefault(name, {}).setdefault(str(page), []).append((kind, [float(x) for x in bbox], s))


class Row:
    """One row's runner: ``open`` loads (and warms) it once, each ``run`` is one timed pass over the files."""

    def open(self, files: list[Path]) -> None:
        self.files = files

    def run(self, draw: Path | None) -> tuple[Preds, int, float]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class ScifolioRow(Row):
    """``Parser.iter_parse`` in its worker, warmed on the first file (worker start, models)."""

    def __init__(self, layout: str) -> None:
        self.layout = layout

    def open(self, files: list[Path]) -> None:
        from parsing import ParseConfig, Parser

        super().open(files)
        # Quality, not timeouts, is measured here: on a loaded shared machine the scan path (OCR) of the
        # image-only page can pass the default 60 s page timeout and the page would be scored as empty.
        self.cfg = ParseConfig(layout=self.layout, page_timeout_s=PAGE_TIMEOUT_S, doc_timeout_s=20 * PAGE_TIMEOUT_S)
        self.parser = Parser().__enter__()
        list(self.parser.iter_parse(files[0].read_bytes(), str(files[0]), self.cfg))

    def run(self, draw: Path | None) -> tuple[Preds, int, float]:
        from formats.records import Page

        preds: Preds = {}
        pages = 0
        t0 = time.perf_counter()
        for f in self.files:
            data = f.read_bytes()
            for r in self.parser.iter_parse(data, str(f), self.cfg):
                if isinstance(r, Page):
                    pages += 1
                    for b in r.blocks:
                        _add(preds, f.name, r.page_index, b.kind, b.bbox, b.score)
                    if draw is not None:
                        from parsing.visualize import draw_boxes

                        draw.mkdir(parents=True, exist_ok=True)
                        (draw / f"{f.stem[:40]}_p{r.page_index:03d}.png").write_bytes(draw_boxes(data, r, 100))
        return preds, pages, time.perf_counter() - t0

    def close(self) -> None:
        self.parser.__exit__(None, None, None)


class BackendRow(Row):
    """A wrapped backend bare, in this process, after one warm-up page."""

    def __init__(self, name: str) -> None:
        self.name = name

    def open(self, files: list[Path]) -> None:
        import pymupdf

        from parsing.backends import OcrBackend, make_backend

        super().open(files)
        # the scan path bare: rapid-layout's regions without our cut of equation regions at prose lines
        self.backend = OcrBackend(split_equations=False) if self.name == "rapidocr" else make_backend(self.name)
        self.backend.load()
        with pymupdf.open(files[0]) as doc:
            self.backend.parse(str(files[0]), doc, [0])

    def boxes(self, f: Path, doc) -> Iterator[tuple[int, str, tuple, float | None]]:
        """(page, kind, bbox, score) of every box the backend finds in one document."""
        for i, parsed in self.backend.parse(str(f), doc, list(range(doc.page_count))).items():
            for b in parsed.blocks:
                yield i, b.kind, b.bbox, b.score

    def run(self, draw: Path | None) -> tuple[Preds, int, float]:
        import pymupdf

        preds: Preds = {}
        pages = 0
        t0 = time.perf_counter()
        for f in self.files:
            with pymupdf.open(f) as doc:
                pages += doc.page_count
                for i, kind, bbox, sc in self.boxes(f, doc):
                    _add(preds, f.name, i, kind, bbox, sc)
        return preds, pages, time.perf_counter() - t0


class EqFinderRow(BackendRow):
    """``parsing.eqfinder`` on every page's pixels (the detector's render): display equations only."""

    def __init__(self) -> None:
        self.name = "eqfinder"

    def open(self, files: list[Path]) -> None:
        from parsing.eqfinder import detector, load

        self.files = files
        self.model, self.yolo = load(), detector()

    def boxes(self, f: Path, doc) -> Iterator[tuple[int, str, tuple, float | None]]:
        from parsing.eqfinder import find_on_page

        for page in doc:
            for box, sc in find_on_page(page, self.model, self.yolo):
                yield page.number, "equation", box, sc


RUNNERS = {
    "fused": lambda: ScifolioRow("fused"),
    "rules": lambda: ScifolioRow("fast"),
    "mineru": lambda: BackendRow("mineru"),
    "pymupdf": lambda: BackendRow("pymupdf"),
    "rapid-layout": lambda: BackendRow("rapidocr"),
    "yolo": lambda: BackendRow("yolo"),
    "eqfinder": EqFinderRow,
}


def _tree_cpu() -> float:
    """CPU seconds (user + system) used so far by this process and every live descendant: the parse worker,
    its helpers, MinerU's render processes. All rows' processes stay up between passes, idle but for the row
    that runs, so a pass's difference is that row's CPU."""
    import psutil

    total = 0.0
    me = psutil.Process()
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def run_rows(names: list[str], files: list[Path], draw: Path | None, rounds: int) -> dict[str, dict]:
    """Every row loaded at once, then ``rounds`` passes in which each row runs once, in turn: on a shared
    machine the load drifts, and rows timed in the same round see about the same load. A row's seconds are
    the median of its rounds (boxes: the first round's; every round gives the same)."""
    import statistics

    rows = {n: RUNNERS[n]() for n in names}
    try:
        for row in rows.values():
            row.open(files)
        out: dict[str, dict] = {}
        for k in range(rounds):
            for n, row in rows.items():
                cpu0 = _tree_cpu()
                preds, pages, secs = row.run(draw if k == 0 and n == "fused" else None)
                d = out.setdefault(n, {"preds": preds, "pages": pages, "rounds": [], "cpu_rounds": []})
                d["rounds"].append(secs)
                d["cpu_rounds"].append(_tree_cpu() - cpu0)
        for d in out.values():
            d["secs"] = statistics.median(d["rounds"])
            d["cpu"] = statistics.median(d["cpu_rounds"])
        return out
    finally:
        for row in rows.values():
            if hasattr(row, "files"):
                row.close()


# ---- fusion fitted leave-one-file-out ------------------------------------------------------------------
FIT_SOURCES = ("rules", "yolo", "pymupdf")
GRID_WEIGHT = (0.25, 0.5, 1.0, 2.0, 4.0)
"""Vote weight of the detector (and of PyMuPDF when it takes part) relative to the rules' 1.0."""
GRID_PYMUPDF = (0.0, 0.5, 1.0)
GRID_KEEP = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
GRID_BOX = ("best", "mean")


def fuse_preds(dumps: dict[str, Preds], sources: tuple[str, ...], params, files: list[str]) -> Preds:
    """Fused predictions for ``files`` from the rows' dumped boxes (``rules`` = the parser with --layout fast)."""
    from parsing.fusion import Proposal, fuse

    out: Preds = {}
    for name in files:
        pages = set().union(*(dumps[s].get(name, {}).keys() for s in sources))
        for page in pages:
            props = [Proposal(s, k, tuple(b), sc) for s in sources for k, b, sc in dumps[s].get(name, {}).get(page, [])]
            for f in fuse(props, params, sources):
                _add(out, name, int(page), f.kind, f.bbox, f.confidence)
    return out


def fit(refs: list[dict], dumps: dict[str, Preds], sources: tuple[str, ...]):
    """Per kind, the grid point with the best F1 of that kind on ``refs`` (ties: nearest to the prior
    ``parsing.fusion.DEFAULT``: weight 1, keep 0.4, box "best"; then the first in grid order)."""
    from parsing.fusion import DEFAULT_KEEP, FusionParams, KindParams

    files = [r["pdf"] for r in refs]
    chosen = {}
    labelled = set().union(*(r.get("kinds", KINDS) for r in refs))
    for kind in [k for k in KINDS if k in labelled]:  # a kind the truth does not label is not fitted
        best = None
        for wy in GRID_WEIGHT:
            for wp in GRID_PYMUPDF if "pymupdf" in sources else (0.0,):
                for box in GRID_BOX:
                    weights = {"rules": 1.0, "yolo": wy, "pymupdf": wp}
                    # one fusion per (weights, box) at keep 0: then every keep threshold is a filter
                    kp0 = KindParams(weights={k: v for k, v in weights.items() if k in sources}, keep=0.0, box=box)
                    fused = restrict(refs, fuse_preds(dumps, sources, FusionParams({kind: kp0}), files))
                    for keep in GRID_KEEP:
                        kept = {
                            n: {pg: [x for x in bs if x[2] >= keep] for pg, bs in pages.items()}
                            for n, pages in fused.items()
                        }
                        a, t, p = score(refs, kept)[kind]
                        f1 = prf(a, t, p)[2]
                        dist = abs(math.log(wy)) + wp + abs(keep - DEFAULT_KEEP) + (box != "best")
                        key = (f1, -dist)
                        if best is None or key > best[0]:
                            best = (key, KindParams(weights=kp0.weights, keep=keep, box=box))
        chosen[kind] = best[1]
    return FusionParams(chosen)


def lofo(refs: list[dict], dumps: dict[str, Preds], sources: tuple[str, ...]) -> tuple[Preds, dict[str, object]]:
    """Each file's fused boxes from parameters fitted on the other files only; and those parameters."""
    preds: Preds = {}
    per_file = {}
    for held in refs:
        train = [r for r in refs if r is not held]
        params = fit(train, dumps, sources)
        per_file[held["pdf"]] = params
        preds.update(fuse_preds(dumps, sources, params, [held["pdf"]]))
    return preds, per_file


def describe(params) -> str:
    parts = []
    for k, kp in params.kinds.items():
        w = ",".join(f"{s}={v:g}" for s, v in kp.weights.items() if v)
        parts.append(f"{k}: {w} keep={kp.keep:g} box={kp.box}")
    return "; ".join(parts)


def table(results: dict[str, tuple[dict[str, tuple[int, int, int]], int, float]]) -> str:
    names = list(results)
    lines = [f"{'kind':9s} " + " ".join(f"{n:>26s}" for n in names)]
    for k in (*KINDS, "micro"):
        cells = []
        for n in names:
            a, t, p = results[n][0][k]
            pr, rc, f1 = prf(a, t, p)
            cells.append(f"P{pr:.2f} R{rc:.2f} F1 {f1:.3f} {a:2d}/{t:<2d}/{p:<2d}")
        lines.append(f"{k:9s} " + " ".join(f"{c:>26s}" for c in cells))
    lines.append(f"{'pages/s':9s} " + " ".join(f"{r[1] / r[2]:>26.2f}" for r in results.values()))
    lines.append("(cells: precision, recall, F1, matched/reference/predicted)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "folder", type=Path, nargs="?", default=None, help="a folder with pdfs/ and truth/ (e.g. ../shared/devset)"
    )
    ap.add_argument(
        "--synthetic",
        type=int,
        default=0,
        metavar="N",
        help="instead of a folder: N generated pages (parsing.synthetic, seed --seed) and their scanned copies, "
        "scored apart",
    )
    ap.add_argument("--seed", type=int, default=0, help="seed of the synthetic pages")
    ap.add_argument("--no-scans", action="store_true", help="synthetic pages without their scanned copies")
    ap.add_argument("--only", default=",".join(ROWS), help=f"comma-separated rows to run (default: {','.join(ROWS)})")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="timed passes per row, the rows taking turns (pages/s: the median pass; boxes: the first)",
    )
    ap.add_argument("-v", "--verbose", action="store_true", help="per-file matched counts")
    ap.add_argument("--draw", type=Path, default=None, help="write scifolio's pages with boxes drawn here")
    ap.add_argument("--dump", type=Path, default=None, help="write every row's predicted boxes to this JSON file")
    ap.add_argument(
        "--load", type=Path, default=None, help="reuse the boxes of a --dump file for the rows it holds (no parsing)"
    )
    ap.add_argument(
        "--fit",
        action="store_true",
        help="fit the fusion leave-one-file-out from the rules/yolo(/pymupdf) rows and report it; print the fit on "
        "all files (what parsing/fusion.py's FITTED holds)",
    )
    ap.add_argument(
        "--self-label",
        type=Path,
        nargs="?",
        const=Path(),
        default=None,
        metavar="PDF_DIR",
        help="write self-labelled page images of PDF_DIR's PDFs to --out (parsing.selflabel); with FOLDER (or "
        "--synthetic N: its digital pages) score the labels against its reference boxes",
    )
    ap.add_argument("--out", type=Path, default=None, help="output folder of --self-label")
    ap.add_argument(
        "--labelled",
        action="store_true",
        help="FOLDER is a folder of PDFs without truth/: score (and --fit) against their self-labels "
        "(parsing.selflabel: display equations of the pages with a text layer; other kinds not scored)",
    )
    ap.add_argument(
        "--degraded",
        action="store_true",
        help="score degraded renders of FOLDER's PDFs instead (image-only pages: blur, noise, JPEG, "
        "parsing.selflabel.degraded_pdf, seed --seed, no skew so the reference boxes stay where they are)",
    )
    args = ap.parse_args(argv)
    if args.self_label is not None:
        return self_label(args)
    if args.synthetic:
        import tempfile

        args.folder = Path(tempfile.mkdtemp(prefix="scifolio-synthetic-"))
        write_synthetic(args.folder, args.synthetic, args.seed, scans=not args.no_scans)
    if args.folder is None:
        ap.error("give a folder or --synthetic N")
    if args.labelled:
        args.folder = write_labelled(args.folder)
    if args.degraded:
        args.folder = write_degraded(args.folder, args.seed)
    if not (args.folder / "truth").is_dir():
        print(f"skip: {args.folder}/truth not found (the development set is not part of the repository)")
        return 0
    refs = load_refs(args.folder)
    files = sorted((args.folder / "pdfs").glob("*.pdf"))
    wanted = {r["pdf"] for r in refs}
    files = [f for f in files if f.name in wanted]
    results = {}
    dumped = {}
    loaded = json.loads(args.load.read_text()) if args.load else {}
    names = args.only.split(",")
    ran = run_rows([n for n in names if n not in loaded], files, args.draw, args.rounds)
    for name in names:
        d = loaded[name] if name in loaded else ran[name]
        preds, pages, secs = restrict(refs, d["preds"]), d["pages"], d["secs"]
        dumped[name] = d
        if args.verbose:
            print(f"  {name}:")
        results[name] = (score(refs, preds, args.verbose), pages, secs)
    if args.dump is not None:
        args.dump.write_text(json.dumps(dumped))
    if args.fit:
        rows = {n: d["preds"] for n, d in dumped.items()}
        for sources in (("rules", "yolo"), ("rules", "yolo", "pymupdf")):
            if not all(s in rows for s in sources):
                continue
            name = "LOFO " + "+".join(sources)
            preds, per_file = lofo(refs, rows, sources)
            # pages/s of a fused parser: the sum of its parts' seconds (they run one after the other)
            secs = sum(dumped[s]["secs"] for s in sources)
            results[name] = (score(refs, restrict(refs, preds), args.verbose), dumped["rules"]["pages"], secs)
            for held, params in per_file.items():
                print(f"  {name}, fitted without {held}: {describe(params)}")
            print(f"  {'+'.join(sources)} fitted on all files: {describe(fit(refs, rows, sources))}")
            if sources == ("rules", "yolo"):  # the prior on the same boxes, beside the fit
                from parsing.fusion import DEFAULT

                prior = fuse_preds(rows, sources, DEFAULT, [r["pdf"] for r in refs])
                results["prior rules+yolo"] = (score(refs, restrict(refs, prior)), dumped["rules"]["pages"], secs)
    print(f"{len(files)} PDFs, {results[next(iter(results))][1]} pages, IoU >= 0.5")
    print(table(results))
    if args.rounds > 1:
        for n, d in ran.items():
            print(f"  {n} pages/s by round: " + " ".join(f"{d['pages'] / t:.2f}" for t in d["rounds"]))
    # CPU per page does not depend on what else the machine runs; on two idle cores a row's pages/s lies between
    # 1 / (CPU s/page) (no overlap) and 2 / (CPU s/page) (both cores busy all the time).
    print(
        "CPU s/page (this process and its children): "
        + ", ".join(f"{n} {d['cpu'] / d['pages']:.3f}" for n, d in ran.items())
    )
    if "fused" in results and "mineru" in results:
        ratio = (results["fused"][1] / results["fused"][2]) / (results["mineru"][1] / results["mineru"][2])
        line = f"fused / mineru pages/s: {ratio:.2f}x"
        if "fused" in ran and "mineru" in ran and args.rounds > 1:
            import statistics

            per = [b / a for a, b in zip(ran["fused"]["rounds"], ran["mineru"]["rounds"])]
            line += f" (median of the rounds' ratios {statistics.median(per):.2f}x)"
        print(line)
    if args.synthetic:
        for part in ("digital", "scanned"):
            sub = [r for r in refs if part in r["pdf"]]
            if not sub:
                continue
            res = {n: (score(sub, d["preds"]), d["pages"], d["secs"]) for n, d in dumped.items()}
            print(f"\n{part} copies only ({args.synthetic} pages; pages/s: all pages scored above together)")
            print(table(res))
    return 0


def self_label(args: argparse.Namespace) -> int:
    """``--self-label``: write the data set; score its labels where reference boxes exist."""
    import tempfile

    from parsing.selflabel import label_pdf, write_dataset

    if args.out is None:
        print("--self-label needs --out DIR")
        return 2
    truth = args.folder
    pdf_dir = args.self_label
    if args.synthetic:
        truth = Path(tempfile.mkdtemp(prefix="scifolio-synthetic-"))
        write_synthetic(truth, args.synthetic, args.seed, scans=False)
        pdf_dir = truth / "pdfs"
    pdfs = sorted(pdf_dir.glob("*.pdf"))
    t0 = time.perf_counter()
    counts = write_dataset(pdfs, args.out, seed=args.seed)
    print(f"{len(pdfs)} PDFs -> {args.out}: {json.dumps(counts)} ({time.perf_counter() - t0:.1f} s)")
    if truth is None or not (truth / "truth").is_dir():
        return 0
    refs = [r for r in load_refs(truth) if (pdf_dir / r["pdf"]).exists()]
    preds: Preds = {}
    labelled = []
    for ref in refs:
        pages = {}
        for i, labels in label_pdf(pdf_dir / ref["pdf"]):
            if labels is None:
                continue  # no text layer: nothing to label from, and nothing for a scan's reference to count
            pages[str(i)] = ref["pages"].get(str(i), [])
            for lb in labels:
                _add(preds, ref["pdf"], i, lb.kind, lb.bbox)
        labelled.append({"pdf": ref["pdf"], "pages": pages})
    res = score(labelled, preds, args.verbose)
    print(
        "labels vs reference boxes, pages with a text layer (figures: raster + 'Figure n' caption only; tables: none)"
    )
    for k in (*KINDS, "micro"):
        a, t, p = res[k]
        pr, rc, f1 = prf(a, t, p)
        print(f"  {k:9s} P{pr:.3f} R{rc:.3f} F1 {f1:.3f}  matched {a} of {t} reference, {p} labelled")
    return 0


def write_degraded(folder: Path, seed: int) -> Path:
    """A temporary copy of ``folder`` (pdfs/ + truth/) whose PDFs are degraded image-only renders."""
    import shutil
    import tempfile

    from parsing.selflabel import degraded_pdf

    out = Path(tempfile.mkdtemp(prefix="scifolio-degraded-"))
    (out / "pdfs").mkdir()
    shutil.copytree(folder / "truth", out / "truth")
    for k, f in enumerate(sorted((folder / "pdfs").glob("*.pdf"))):
        (out / "pdfs" / f.name).write_bytes(degraded_pdf(f.read_bytes(), seed=seed * 1000 + k))
    return out


def write_synthetic(folder: Path, n: int, seed: int, scans: bool = True) -> None:
    """``folder/pdfs`` + ``folder/truth`` in the development set's format: N generated pages in documents of
    up to 10 pages, and a rasterised (image-only) copy of each document."""
    from parsing.synthetic import scanned, synthetic_pdf

    (folder / "pdfs").mkdir(parents=True)
    (folder / "truth").mkdir()
    for d, start in enumerate(range(0, n, 10)):
        pdf, truth = synthetic_pdf(min(10, n - start), seed=seed * 1000 + d)
        pages = {str(i): [{"kind": t.kind, "bbox": list(t.bbox)} for t in ts] for i, ts in truth.items()}
        for part, data in (("digital", pdf), ("scanned", scanned(pdf)))[: 2 if scans else 1]:
            name = f"synthetic_{d:03d}_{part}.pdf"
            (folder / "pdfs" / name).write_bytes(data)
            (folder / "truth" / f"{name}.json").write_text(json.dumps({"pdf": name, "pages": pages}))


if __name__ == "__main__":
    sys.exit(main())
