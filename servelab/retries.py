"""Every retry the lab's tooling makes goes through `note`, so that none passes unseen.

A retry keeps a busy machine from failing a run for nothing (a port taken a moment before a server
bound it, Ray's node slow to register, perf_analyzer finding no stable window), but a retry that
happens every time hides a regression. Each is logged as a WARNING of the `servelab.retry` logger,
with what was tried again and why; the test suite lists them all at its end (tests/conftest.py),
notebooks' included, whose log lines it reads from their output.
"""

from __future__ import annotations

import logging

log = logging.getLogger("servelab.retry")
MARK = "RETRY"


def note(what: str, why: object) -> None:
    """Say that `what` is tried again, because of `why` (an exception or words)."""
    log.warning("%s %s, after: %s", MARK, what, str(why).strip().splitlines()[0] if str(why).strip() else why)
