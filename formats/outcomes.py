"""What a dead letter means: a content failure (final, counts toward ``--max-error-rate``), an infrastructure
failure (retried in a fresh worker, never final), or an outcome of policy (a filter: never a failure).

One classification for documents and pages, used by the parser (``parsing/core.py``), the document builder
and the corpus job's manifest and exit status (``pipelines/``). Stdlib only.
"""

from __future__ import annotations

# Exceptions that say nothing about the document: memory, I/O and object stores, a missing or failing model
# or backend. The same document may well succeed on a rerun (after the fix), so they are never final.
_INFRA_TYPES: tuple[type[BaseException], ...] = (MemoryError, OSError, ConnectionError, TimeoutError)
_INFRA_NAMES = {"OutOfMemoryError", "BackendUnavailable", "DistBackendError", "RetryableError"}
_INFRA_MESSAGES = ("out of memory", "cuda error", "cudnn_status", "nccl")

INFRA_REASONS = frozenset({"worker_start", "infrastructure"})
"""Dead-letter reasons of the parser that are infrastructure failures (document ``open``/``worker_start``, a
page's ``parse``/``infrastructure``): the document is retried and never marked done with them."""

FILTER_STAGES = frozenset({"visual_gain", "dedup", "decontam"})
"""Stages whose dead letters remove content on purpose (visual gain below threshold, near-duplicates,
benchmark overlap): outcomes, reported apart, never failures."""

FILTER_REASONS = frozenset({"duplicate", "near_duplicate", "benchmark_overlap"})
"""Document-level reasons that are not failures: the content was kept under another id, or removed on purpose."""


def is_infrastructure_error(exc: BaseException) -> bool:
    """True for failures of the machine, a service or a model (retry later); False for content failures."""
    if isinstance(exc, _INFRA_TYPES) or any(t.__name__ in _INFRA_NAMES for t in type(exc).__mro__):
        return True
    message = str(exc).lower()
    return any(m in message for m in _INFRA_MESSAGES)


def is_filtered(stage: str, reason: str) -> bool:
    """A dead letter written by policy (a filter), not by a failure."""
    return stage in FILTER_STAGES or reason in FILTER_REASONS
