"""The visual-gain scorer as Beam's ``ModelHandler``: the corpus job scores pages through ``RunInference``.

Elements are ``PendingDocument``s (a parsed document waiting for its page filter). ``load_model`` loads the VLM
once per worker; Beam's ``BatchElements`` groups documents up to ``VisualGainConfig.batch_size`` pages per
batch (a longer document is a batch of its own); ``run_inference`` scores each document of the batch with one
``VisualGainScorer.run_batch`` over its pages, which packs their rows into forward calls of at most
``batch_size`` rows. A document is the unit of scoring, as it was inside the old DoFn, so every page gets the
same forward calls and bit-identical scores, and a failure belongs to one document: an infrastructure failure
(out of memory, a failing model) is retried with the job's ``RetryPolicy`` and, if it persists, comes out as a
``ScoringOutcome`` with ``infrastructure=True`` (the document is left retryable); any other error comes out
as the document's content failure. Beam-free stage code stays in ``visual_gain/`` and ``pipelines/jobs/stages``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from apache_beam.metrics import Metrics
from apache_beam.ml.inference.base import ModelHandler, PredictionResult

from formats.records import Page
from pipelines.assembly.build import PendingDocument, RetryPolicy, is_infrastructure_error

log = logging.getLogger(__name__)
NAMESPACE = "scifolio"


@dataclass
class ScoringOutcome:
    """What ``run_inference`` gives a document: its scored pages, or why it has none."""

    pages: list[Page] | None
    error: str | None = None
    traceback: str | None = None
    infrastructure: bool = False
    attempts: int = 1


def n_pages(doc: PendingDocument) -> int:
    """A document's weight in Beam's batching (at least 1, so BatchElements always makes progress)."""
    return max(1, len(doc.pages))


class VisualGainScoring(ModelHandler):
    """``ModelHandler[PendingDocument, PredictionResult(doc, ScoringOutcome), LoadedVLM]`` over
    ``visual_gain.scorer.VisualGainScorer`` (its ``load()`` / ``run_batch`` are the handler's load and run)."""

    def __init__(self, slot: Any, retry: RetryPolicy | None = None):
        """``slot``: ``pipelines.jobs.stages.VisualGainSlot`` (its ``scorer`` is the ``VisualGainConfig``)."""
        super().__init__()
        self.config = slot.scorer
        self.retry = retry or RetryPolicy()

    def _scorer(self) -> Any:
        from visual_gain.scorer import VisualGainScorer

        return VisualGainScorer(self.config)

    def load_model(self) -> Any:
        return self._scorer().load()  # LoadedVLM: a plain object, so Beam's Shared can hold a weak reference

    def run_inference(
        self, batch: Sequence[PendingDocument], model: Any, inference_args: dict[str, Any] | None = None
    ) -> Iterable[PredictionResult]:
        scorer = self._scorer()
        return [PredictionResult(doc, self._score(scorer, doc, model)) for doc in batch]

    def _score(self, scorer: Any, doc: PendingDocument, model: Any) -> ScoringOutcome:
        import traceback

        for attempt in range(1, self.retry.attempts + 1):
            try:
                return ScoringOutcome(scorer.run_batch(doc.pages, model), attempts=attempt)
            except Exception as e:
                infra = is_infrastructure_error(e)
                if infra and attempt < self.retry.attempts:
                    log.warning("%s: scoring attempt %d/%d failed: %r", doc.source, attempt, self.retry.attempts, e)
                    Metrics.counter(NAMESPACE, "visual_gain_retries").inc()
                    time.sleep(self.retry.backoff_s * 2 ** (attempt - 1))
                    continue
                tb = "".join(traceback.format_exception(e, limit=8))[-4000:]
                return ScoringOutcome(None, repr(e), tb, infrastructure=infra, attempts=attempt)
        raise AssertionError("unreachable")

    def batch_elements_kwargs(self) -> dict[str, Any]:
        size = self.config.batch_size
        return {"min_batch_size": size, "max_batch_size": size, "element_size_fn": n_pages}

    def get_num_bytes(self, batch: Sequence[PendingDocument]) -> int:
        # Beam's default pickles the whole batch (every crop and render) just to count bytes for a metric.
        return sum(len(c.png) for doc in batch for p in doc.pages for c in p.crops)

    def get_metrics_namespace(self) -> str:
        return "RunInference.visual_gain"

    def share_model_across_processes(self) -> bool:
        return False
