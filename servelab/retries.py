"""Every retry the lab's tooling makes goes through `note`, so that none passes unseen.

A retry keeps a busy machine from failing a run for nothing (a port taken a moment before a server
bound it, Ray's node slow to register, perf_analyzer finding no stable window), but a retry that
happens every time hides a regression. Each is logged as a WARNING of the `servelab.retry` logger,
with what was tried again and why; the test suite lists them all at its end (tests/lab_servers.py),
the notebooks' included: a notebook's kernel is another process, so it also appends each line to
the file SERVELAB_RETRIES_FILE names, which the suite sets for it.
"""

from __future__ import annotations

import logging

from servelab.settings import settings

log = logging.getLogger("servelab.retry")
MARK = "RETRY"


def note(what: str, why: object) -> None:
    """Say that `what` is tried again, because of `why` (an exception or words)."""
    line = f"{MARK} {what}, after: {str(why).strip().splitlines()[0] if str(why).strip() else why}"
    log.warning("%s", line)
    if record := settings().retries_file:
        with record.open("a") as file:
            file.write(line + "\n")
