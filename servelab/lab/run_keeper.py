"""The keeper of a notebook's runs: it names, marks and saves each run as it ends, loads saved
runs back, and watches the lab's services for crashes between and during runs.

Every run is appended to `results/notebooks/<notebook>.jsonl` as it ends, so a crash, a kernel
restart or a closed tab loses nothing measured: `RunKeeper.saved_runs("10_cancellation")` (also
`Lab.saved_runs`) loads them back. A run is complete when it is kept: what a notebook asks the lab
to count over it (servelab.lab.run_accounts) is set on it first, and nothing is added after.

Locally, the stack's supervisor restarts a service that crashes (servelab.stack.supervision); in the
Compose project, Docker restarts a crashed Triton, whose container's start records it
(servelab.triton.container). The keeper says so in the notebook, waits for the service to come back
before the next run (`ready_to_measure`), and marks a run that a crash interrupted
(`result.interrupted_by`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from servelab import paths, service_exits
from servelab.report.summaries import shown_path, summary_line
from servelab.results import RunResult, append_result, load_appended
from servelab.service_exits import ServiceExit
from servelab.stack.supervision import POLL_S, LocalStack, answers

SAVED_RUNS_DIR = paths.RESULTS_DIR / "notebooks"
RESTART_WAIT_S = 300.0  # Triton with every model loads in about 10-60 s; a busy machine takes longer
COMPOSE_RESTART_RECORD_S = 10.0  # Docker restarts a crashed container at once; its start records it
Kept = TypeVar("Kept", bound=RunResult)  # a run kept by RunKeeper.keep: a RunResult or a SequenceRunResult


def saved_runs_file(notebook: str) -> Path:
    """Where the runs of `notebook` (its file name without .ipynb) are appended as they end."""
    return SAVED_RUNS_DIR / f"{notebook}.jsonl"


def wait_until_answering(health_urls: dict[str, str]) -> None:
    """Wait for the Compose services (name -> health URL), which may still be starting (a first
    Triton start loads every model), and say which does not answer."""
    deadline = time.monotonic() + RESTART_WAIT_S
    while silent := [name for name, url in health_urls.items() if not answers(url)]:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{', '.join(silent)} did not answer within {RESTART_WAIT_S:.0f} s. On the Docker host, "
                f"`docker compose ps` shows each service's state and `docker compose logs {silent[0]}` its log."
            )
        time.sleep(2)


@dataclass
class RunKeeper:
    notebook: str  # whose runs these are: the file they are saved to
    services: str  # where the lab's services are: "local" or "compose" (saved with each run)
    profile: str  # the profile's name (saved with each run)
    health_urls: dict[str, str]  # each service's health URL, by the name its exits are recorded under
    # The stacks this notebook started, watched for crashes (a private service's while it runs).
    stacks: list[LocalStack] = field(default_factory=list)
    # The exits recorded by the supervisor of `make up`, or by the Compose project's Triton container.
    shared_exits_file: Path | None = None
    results: list[RunResult] = field(default_factory=list)  # the notebook's runs, in the order kept
    # When the lab connected, which names the session its saved runs belong to.
    connected_at: datetime = field(default_factory=lambda: datetime.now().astimezone())
    _exits_told: set[tuple[str, float, str]] = field(default_factory=set, repr=False)
    _back_at: dict[tuple[str, float], float] = field(default_factory=dict, repr=False)

    @property
    def on_compose(self) -> bool:
        return self.services == "compose"

    @property
    def session(self) -> str:
        """This keeper's session, as its saved runs name it: when the lab connected, and its process."""
        return f"{self.connected_at.isoformat(timespec='seconds')} (pid {os.getpid()})"

    # ---- keeping runs ----------------------------------------------------------------------

    def keep(self, result: Kept, name: str, started: float) -> Kept:
        """Name the run, mark it if a service crashed while it ran (since `started`, a Unix time),
        save it, and print its summary. The run is complete: every figure counted over it is set
        before this one save (servelab.lab.run_accounts), and nothing is added to it after."""
        result.name = name
        ended = time.time()
        # A crash in the last moment of the run is seen at the supervisor's next look (POLL_S).
        deadline = time.monotonic() + 4 * POLL_S
        while not all(stack.checked_since(ended) for stack in self.stacks) and time.monotonic() < deadline:
            time.sleep(POLL_S / 5)
        crashes = [event for event in self.service_exits() if event.between(started, ended)]
        # In the Compose project a crash is recorded once Docker has restarted the container: give
        # a run with failed requests the time that takes before saying none interrupted it.
        deadline = time.monotonic() + COMPOSE_RESTART_RECORD_S
        while self.on_compose and result.error_count and not crashes and time.monotonic() < deadline:
            time.sleep(0.5)
            crashes = [event for event in self.service_exits() if event.between(started, ended)]
        result.interrupted_by = [event.describe() for event in crashes]
        self.results.append(result)
        print(summary_line(result))
        self.tell(crashes)
        self.save(result)
        return result

    def save(self, result: RunResult) -> None:
        """Append `result` to the notebook's saved runs, with this session's metadata."""
        metadata = {
            "notebook": self.notebook,
            "session": self.session,
            "services": self.services,
            "profile": self.profile,
        }
        try:
            append_result(saved_runs_file(self.notebook), result, metadata)
        except OSError as exc:  # the notebook goes on; the run is still in `results`
            print(f"Could not save this run to {shown_path(saved_runs_file(self.notebook))}: {exc}")

    def saved_this_session(self) -> list[RunResult]:
        """The runs this session saved, as read back from its file (what `lab.verdicts()` checks)."""
        saved = load_appended(saved_runs_file(self.notebook))
        return [run for run, metadata in saved if metadata["session"] == self.session]

    @staticmethod
    def saved_runs(notebook: str, session: str = "latest") -> list[RunResult]:
        """The runs a notebook saved (see `saved_runs_file`), oldest first: those of its latest
        session (the kernel that connected last), of every session ("all"), or of one session
        (as the saved metadata names it, `lab.keeper.session`)."""
        saved = load_appended(saved_runs_file(notebook))
        sessions = sorted({metadata["session"] for _, metadata in saved})
        if session not in ("latest", "all", *sessions):
            known = ", ".join(sessions) or "none yet"
            raise ValueError(
                f"no session {session!r} in {shown_path(saved_runs_file(notebook))}: "
                f"use 'latest', 'all' or one of {known}"
            )
        chosen = sessions[-1:] if session == "latest" else sessions if session == "all" else [session]
        runs = [result for result, metadata in saved if metadata["session"] in chosen]
        print(
            f"{len(runs)} saved run(s) of {notebook} from {', '.join(chosen) or 'no session'} "
            f"({len(sessions)} session(s) in {shown_path(saved_runs_file(notebook))})"
        )
        return runs

    # ---- crashed services ------------------------------------------------------------------

    @contextlib.contextmanager
    def watching(self, stack: LocalStack) -> Iterator[None]:
        """Watch `stack` (a service the notebook runs for a `with` block) for crashes, as the lab's."""
        self.stacks.append(stack)
        try:
            yield
        finally:
            self.stacks.remove(stack)

    def service_exits(self) -> list[ServiceExit]:
        """The unexpected exits of the lab's services since it connected, as the local stacks'
        supervisors recorded them, or, in the Compose project, the Triton container's start
        (the services Docker restarts otherwise are not watched)."""
        exits = [event for stack in self.stacks for event in stack.exits]
        if self.shared_exits_file is not None:
            exits += [self._restarted_by_docker(event) for event in service_exits.read(self.shared_exits_file)]
        since = self.connected_at.timestamp()
        return sorted((event for event in exits if event.exited_at >= since), key=lambda event: event.exited_at)

    def crashed_since(self, started: float, grace_s: float = 2.0) -> list[ServiceExit]:
        """The services that exited since `started`; a failure may be seen a moment before the
        supervisor (which looks twice a second) records the exit, so wait `grace_s` for it."""
        deadline = time.monotonic() + grace_s
        while not (crashes := [event for event in self.service_exits() if event.exited_at >= started]):
            if time.monotonic() > deadline:
                break
            time.sleep(0.25)
        return crashes

    def _restarted_by_docker(self, event: ServiceExit) -> ServiceExit:
        """A Compose service's exit is recorded as it restarts, and never updated: it is back once
        the service answers again, first seen here."""
        if not self.on_compose or event.outcome != service_exits.RESTARTING:
            return event
        key = (event.service, event.exited_at)
        if key not in self._back_at and answers(self.health_urls[event.service]):
            self._back_at[key] = time.time()
        if key in self._back_at:
            event.outcome, event.back_at = service_exits.BACK, self._back_at[key]
        return event

    def ready_to_measure(self) -> float:
        """Wait for the services (see `wait_for_services`); the time the next run starts."""
        self.wait_for_services()
        return time.time()

    def wait_for_services(self) -> None:
        """Say which services crashed since the last run, and wait for those being restarted."""
        self.tell(self.service_exits())
        deadline = time.monotonic() + RESTART_WAIT_S
        while restarting := [e.service for e in self.service_exits() if e.outcome == service_exits.RESTARTING]:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{', '.join(restarting)} did not come back within {RESTART_WAIT_S:.0f} s of its crash; "
                    "its log says why (`make up` prints where the logs are)."
                )
            time.sleep(0.5)
        if self.on_compose:
            # A Compose service records its restart only once Docker has started its container again:
            # until then, one that crashed a moment ago is silent with nothing recorded yet.
            wait_until_answering(self.health_urls)
        self.tell(self.service_exits())

    def tell(self, exits: list[ServiceExit]) -> None:
        """Print each crash once when noticed, and once more when its outcome is known."""
        for event in exits:
            key = (event.service, event.exited_at, event.outcome)
            if key not in self._exits_told:
                self._exits_told.add(key)
                print(f"NOTE: {event.describe()}.")
