"""Timing shared by the Beam ``RunInference`` stage benchmarks (``embed_stage.py``, ``vg_stage.py``): CPU seconds of
this process, a job handler that logs its model load, and a pipeline run timed with that load subtracted (the
baselines load their model outside the timed region too)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def timed_handler(handler_cls: type, arg: object, log: Path):
    """``handler_cls(arg)``, appending "wall CPU" seconds of each ``load_model`` to ``log`` (the handler reaches the
    runner pickled, so a file, not a global)."""

    class Timed(handler_cls):
        def load_model(self):
            w, c = time.perf_counter(), cpu_s()
            model = super().load_model()
            with open(log, "a") as f:
                f.write(f"{time.perf_counter() - w} {cpu_s() - c}\n")
            return model

    return Timed(arg)


def run_without_load(pipeline, t0: float, c0: float, log: Path) -> tuple[float, float]:
    """Run ``pipeline`` (built after ``t0``/``c0`` were read) to the end; (wall s, CPU s) minus its one model load."""
    result = pipeline.run()
    result.wait_until_finish()
    wall, cpu = time.perf_counter() - t0, cpu_s() - c0
    timings = [tuple(map(float, line.split())) for line in log.read_text().splitlines()]
    if len(timings) != 1:
        raise RuntimeError(f"expected one model load in this process, saw {len(timings)}")
    return wall - timings[0][0], cpu - timings[0][1]
