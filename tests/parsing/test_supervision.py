"""The parent's supervision of the parse worker, as pure functions (``parsing.api``): deadlines, blame, deaths.

No worker runs here; ``test_timeout.py`` and ``tests/pipelines/test_hostile.py`` run the same rules for real.
"""

from __future__ import annotations

import pytest

from parsing.api import FINISH_GRACE_S, Failure, Job, _Attempt, blame, exit_failure, next_deadline
from parsing.worker import HELPER_DIED

PAGE_S = 10.0
INF = float("inf")
G = FINISH_GRACE_S


@pytest.mark.parametrize(
    "kind, payload, deadline, doc_deadline, expected",
    [
        ("ready", None, 5.0, INF, 100 + PAGE_S),  # opening the file: one page timeout
        ("probe", 3, 5.0, INF, 100 + PAGE_S),  # reading one page's content on the worker's thread
        ("doc", None, 5.0, INF, 100 + PAGE_S + G),  # the finishers probe under their own page timeout
        ("window", [0, 1, 2], 5.0, INF, 100 + 3 * PAGE_S),  # a backend window: a page timeout per page
        ("page", None, 500.0, INF, 500.0),  # progress never shortens a longer deadline
        ("page", None, 5.0, INF, 100 + PAGE_S + G),  # ... and extends a shorter one
        ("progress", None, 5.0, INF, 100 + PAGE_S + G),
        ("finishing", [4], 5.0, INF, 100 + PAGE_S + G),
        ("window", [0, 1, 2], 5.0, 110.0, 110.0),  # never past the document's deadline
        ("error", "tb", 7.0, INF, 7.0),  # other messages leave it
    ],
)
def test_next_deadline(kind, payload, deadline, doc_deadline, expected):
    assert next_deadline(kind, payload, 100.0, deadline, doc_deadline, PAGE_S) == pytest.approx(expected)


HANG = Failure("timeout", "page exceeded", death=False)
CRASH = Failure("crash", "Traceback ...", death=False)
KILLED = Failure("worker_killed", "worker killed (signal 9, SIGKILL)", death=True)


@pytest.mark.parametrize(
    "job, window, probing, done, failure, drops, retry",
    [
        # the page being read alone is the culprit; the rest of the job goes on
        (Job(None, 4), [], 2, {0, 1}, HANG, [2], [Job([3], 4)]),
        # a window failed: which page is unknown, so each is retried alone, then the rest
        (Job(None, 2), [0, 1], None, set(), HANG, [], [Job([0], 1), Job([1], 1), Job([2, 3], 2)]),
        # a page alone that hangs or crashes is quarantined at once
        (Job([1], 1), [1], None, set(), HANG, [1], []),
        (Job([1], 1), [1], None, set(), CRASH, [1], []),
        # stalled between windows: the next page is blamed, never a loop
        (Job(None, 2), [], None, {0, 1}, HANG, [2], [Job([3], 2)]),
        # a death: the window's pages are retried alone, marked as retries
        (Job(None, 2), [0, 1], None, set(), KILLED, [], [Job([0], 1, True), Job([1], 1, True), Job([2, 3], 2)]),
        # a death on one page: one more try alone on a fresh worker ...
        (Job(None, 4), [], 2, {0, 1}, KILLED, [], [Job([2], 1, True), Job([3], 4)]),
        (Job([5], 1), [5], None, set(), KILLED, [], [Job([5], 1, True)]),
        # ... and a second death on it alone quarantines it
        (Job([5], 1, True), [5], None, set(), KILLED, [5], []),
        # nothing left: nothing to do
        (Job([5], 1), [5], None, {5}, HANG, [], []),
    ],
)
def test_blame(job, window, probing, done, failure, drops, retry):
    attempt = _Attempt(deadline=0.0, ready=True, window=window, probing=probing)
    assert blame(job, attempt, done, 4, failure) == (drops, retry)


@pytest.mark.parametrize(
    "returncode, reason, death, detail",
    [
        (-9, "worker_killed", True, "worker killed (signal 9, SIGKILL)"),
        (-11, "worker_killed", True, "worker killed (signal 11, SIGSEGV)"),
        (HELPER_DIED, "worker_killed", True, "a helper process of the parse worker died: log"),
        (1, "crash", False, "log"),
        (None, "crash", False, "log"),
    ],
)
def test_exit_failure(returncode, reason, death, detail):
    assert exit_failure(returncode, "log") == Failure(reason, detail, death)
