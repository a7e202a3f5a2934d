"""Services that exited while the local stack ran: what its supervisor records, what Lab reads.

The supervisor (servelab.stack.supervision) appends a line to `restarts.jsonl`, in the stack's log folder,
when it notices that a service exited, and another when the service is back or given up on. The
file is how a notebook using the stack of `make up` (another process) learns of a crash: `read`
merges the two lines of each exit into one `ServiceExit`.
"""

from __future__ import annotations

import signal
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from servelab import jsonl

EVENTS_FILE = "restarts.jsonl"

RESTARTING, BACK, GIVEN_UP = "restarting", "back", "given up"


@dataclass
class ServiceExit:
    """One unexpected exit of a service, and what the supervisor did about it."""

    service: str
    exited_at: float  # Unix time the supervisor noticed the exit
    cause: str  # "killed by signal 11 (SIGSEGV)", "exited with code 1"
    log_tail: str  # the last lines of its log, where the reason usually is
    outcome: str = RESTARTING
    back_at: float | None = None  # Unix time it answered its readiness URL again
    detail: str = ""  # why it was given up on

    def between(self, start: float, end: float) -> bool:
        """Whether the service was down at some moment from `start` to `end` (Unix times)."""
        return self.exited_at <= end and (self.back_at is None or self.back_at >= start)

    def describe(self) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(self.exited_at))
        text = f"{self.service} {self.cause} at {when}"
        if self.outcome == BACK and self.back_at is not None:
            return f"{text}; restarted, back {self.back_at - self.exited_at:.0f} s later"
        if self.outcome == GIVEN_UP:
            return f"{text}; not restarted: {self.detail}"
        return f"{text}; being restarted"


def exit_cause(returncode: int) -> str:
    """A process's exit status in words (a negative code is the signal that killed it)."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        return f"was killed by signal {-returncode} ({name})"
    return f"exited with code {returncode}"


def record(path: Path, event: ServiceExit) -> None:
    """Append the exit's current state (the reader keeps the last state of each exit)."""
    jsonl.append(path, asdict(event))


def read(path: Path) -> list[ServiceExit]:
    """Every exit recorded in `path`, oldest first, each in its last recorded state."""
    known = {field.name for field in fields(ServiceExit)}
    exits: dict[tuple[str, float], ServiceExit] = {}
    for line in jsonl.read(path):
        event = ServiceExit(**{key: value for key, value in line.items() if key in known})
        exits[(event.service, event.exited_at)] = event
    return sorted(exits.values(), key=lambda event: event.exited_at)
