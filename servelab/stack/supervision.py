"""Start, supervise and stop the lab's services as real processes on 127.0.0.1.

Each service is a child process in its own process group, with its output in a log file. Start-up
waits until the service answers its readiness URL; shut-down (also on Ctrl-C or SIGTERM) stops
the whole group, so Triton's Python-backend stubs go too, and the ports are free again.

While the stack runs, a supervisor restarts a service that exits on its own (a crash, a kill -9),
with the same command and files (so Triton comes back with the model configs it was serving), up
to MAX_RESTARTS times in RESTART_WINDOW_S, as `restart: unless-stopped` does for the Docker
stacks. Each exit is logged with its cause and the last lines of the service's log, and recorded
in `restarts.jsonl` beside the logs, where the notebooks' Lab reads it (servelab.service_exits).

What runs is given as `ServiceSpec`s: the lab's own services are servelab.stack.catalogue's, on
the ports of servelab.stack.ports.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil
import requests

from servelab import paths, retries, service_exits
from servelab.stack.ports import Ports, port_is_free

log = logging.getLogger(__name__)


class StackError(RuntimeError):
    """A service could not start; the message says why and where its log is."""


class PortClash(StackError):
    """A service's port was taken, before it started or while it started: another process got
    there first."""


# How servers say their port was taken between the check and their own bind (uvicorn, Flask,
# Triton's HTTP and gRPC front ends, Ray).
_BIND_FAILED = ("address already in use", "failed to listen", "failed to bind")


@dataclass
class ServiceSpec:
    name: str
    command: list[str]
    cwd: Path
    ports: list[int]
    ready_url: str
    env: dict[str, str] = field(default_factory=dict)
    ready_timeout_s: float = 120.0
    # SIGTERM to the leader only, which stops its children itself (Ray's launcher must shut Ray
    # down while Ray's own processes still run); the group is killed after the grace period anyway.
    stop_leader_first: bool = False
    stop_grace_s: float = 10.0
    # Words in the start-up failure of a known transient (Ray's node slow to register on a busy
    # machine): such a start is tried once more, and logged as a retry.
    retry_start_on: str | None = None


def answers(url: str) -> bool:
    """The readiness probe: does `url` answer 200 right now?"""
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


class ManagedProcess:
    def __init__(self, spec: ServiceSpec, log_dir: Path) -> None:
        self.spec = spec
        self.log_path = log_dir / f"{spec.name}.log"
        self.process: subprocess.Popen | None = None

    @property
    def started_process(self) -> subprocess.Popen:
        """The service's process, once `start` has started it."""
        if self.process is None:
            raise StackError(f"{self.spec.name} has not been started")
        return self.process

    def start(self, after: str | None = None) -> None:
        """Start the service; `after` (a restart: what happened before) keeps the log, adding a line."""
        taken = [port for port in self.spec.ports if not port_is_free(port)]
        if taken:
            raise PortClash(
                f"{self.spec.name}: port {', '.join(map(str, taken))} on 127.0.0.1 is already in use. "
                f"Stop whatever holds it (`ss -ltnp | grep :{taken[0]}` shows it; an earlier `make up` "
                f"still running?) or move this service with SERVELAB_PORT_<NAME>=<port>."
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = self.log_path.open("ab" if after else "wb")
        if after:
            log_file.write(f"\n---- servelab: {self.spec.name} restarted after it {after} ----\n".encode())
            log_file.flush()
        log.info("starting %s: %s", self.spec.name, " ".join(self.spec.command))
        # Linux tells a child when the *thread* that started it ends: the main thread, or a
        # supervisor's, which runs until its stack stops.
        starter = threading.current_thread()
        long_lived = starter is threading.main_thread() or isinstance(starter, Supervisor)
        self.process = subprocess.Popen(
            self.spec.command,
            cwd=self.spec.cwd,
            env={**os.environ, **self.spec.env},
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group, so stop() reaches its children too
            preexec_fn=_terminate_with_parent if sys.platform == "linux" and long_lived else None,
        )
        log_file.close()

    def wait_ready(self, cancelled: threading.Event | None = None) -> None:
        """Return once the service answers its readiness URL (or `cancelled` is set)."""
        deadline = time.monotonic() + self.spec.ready_timeout_s
        while time.monotonic() < deadline:
            if cancelled is not None and cancelled.is_set():
                return
            if self.started_process.poll() is not None:
                tail = self.log_tail()
                failure = PortClash if any(words in tail.lower() for words in _BIND_FAILED) else StackError
                raise failure(
                    f"{self.spec.name} exited with code {self.started_process.returncode} before it was ready.\n"
                    f"Last lines of {self.log_path}:\n{tail}"
                )
            if answers(self.spec.ready_url):
                log.info("%s is ready at %s", self.spec.name, self.spec.ready_url)
                return
            time.sleep(0.25)
        raise StackError(
            f"{self.spec.name} was not ready at {self.spec.ready_url} after {self.spec.ready_timeout_s:.0f} s.\n"
            f"Last lines of {self.log_path}:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def pids(self) -> list[int]:
        """The service's process and its descendants (uvicorn's workers, Triton's stubs), those alive now."""
        try:
            leader = psutil.Process(self.started_process.pid)
            return [leader.pid, *(child.pid for child in leader.children(recursive=True))]
        except psutil.NoSuchProcess:
            return []

    def clear_group(self) -> None:
        """Kill what is left of an exited service's process group (Triton's backend stubs)."""
        _signal_group(self.started_process.pid, signal.SIGKILL)

    def stop(self) -> None:
        if self.process is None:
            return
        # Its descendants as they are now: once the leader exits, an orphan is no longer its child.
        family = []
        for pid in self.pids():
            with contextlib.suppress(psutil.NoSuchProcess):
                family.append(psutil.Process(pid))
        try:
            pgid = os.getpgid(self.process.pid)
        except ProcessLookupError:
            pgid = None
        if pgid is not None:
            if self.spec.stop_leader_first:
                with contextlib.suppress(ProcessLookupError):
                    self.process.send_signal(signal.SIGTERM)
            else:
                _signal_group(pgid, signal.SIGTERM)
            try:
                self.process.wait(timeout=self.spec.stop_grace_s)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0f s; killing it", self.spec.name, self.spec.stop_grace_s)
            # Children (Triton's backend stubs) may outlive the leader: clear the whole group.
            _signal_group(pgid, signal.SIGKILL)
        self.process.wait()
        # A SIGKILL is delivered, not done, when killpg returns: stopped means gone (or a zombie).
        deadline = time.monotonic() + self.spec.stop_grace_s
        while any(map(_still_running, family)) and time.monotonic() < deadline:
            time.sleep(0.05)
        log.info("stopped %s", self.spec.name)


def _still_running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h)


def _terminate_with_parent() -> None:
    """In the child, before it runs: receive SIGTERM when the process that started it dies. A
    notebook kernel is killed if its clean-up outlasts Jupyter's shutdown wait (stopping Triton
    alone can take 10 s); without this, its services would keep running, and their ports taken."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class LocalStack:
    """Start services in order, supervise them, stop them in reverse; a context manager that
    always cleans up. `exits` lists every unexpected exit the supervisor handled. Logs go to
    `log_dir` (default: the stack's, paths.LOG_DIR)."""

    def __init__(self, specs: Iterable[ServiceSpec], log_dir: Path | None = None) -> None:
        log_dir = log_dir or paths.LOG_DIR
        self.processes = [ManagedProcess(spec, log_dir) for spec in specs]
        self.events_path = log_dir / service_exits.EVENTS_FILE
        self.exits: list[service_exits.ServiceExit] = []
        self._supervisor: Supervisor | None = None

    def start(self) -> LocalStack:
        try:
            for managed in self.processes:
                managed.start()
            for managed in self.processes:
                try:
                    managed.wait_ready()
                except StackError as exc:
                    if not (managed.spec.retry_start_on and managed.spec.retry_start_on in str(exc)):
                        raise
                    retries.note(f"starting {managed.spec.name} once more", managed.spec.retry_start_on)
                    managed.stop()
                    # The first start's children can hold its ports a moment longer (Ray's metrics
                    # exporter did, on a busy machine): the second start waits for them, as a restart does.
                    _wait_for_ports(managed.spec.ports, threading.Event())
                    managed.start(after=f"did not start: {managed.spec.retry_start_on}")
                    managed.wait_ready()
        except BaseException:
            self.stop()
            raise
        self._supervisor = Supervisor(self)
        self._supervisor.start()
        return self

    def stop(self) -> None:
        if self._supervisor is not None:
            self._supervisor.stopping.set()
            self._supervisor.join()
            self._supervisor = None
        for managed in reversed(self.processes):
            managed.stop()

    def __enter__(self) -> LocalStack:
        # A stack already started (by start_on_free_ports) is stopped at the block's end just the same.
        return self if self._supervisor is not None else self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def pids(self) -> dict[str, int]:
        """The running services' process ids, by name."""
        return {managed.spec.name: managed.started_process.pid for managed in self.processes if managed.alive()}

    def checked_since(self, moment: float) -> bool:
        """Whether the supervisor has looked at every service since `moment` (a Unix time), so
        that an exit before it is in `exits`; True when nothing is supervised."""
        return self._supervisor is None or self._supervisor.checked_at >= moment

    def given_up(self) -> list[str]:
        """The services the supervisor stopped restarting: they stay down."""
        return [event.service for event in self.exits if event.outcome == service_exits.GIVEN_UP]


def start_on_free_ports(services: Callable[[Ports], list[ServiceSpec]], log_dir: Path) -> tuple[LocalStack, Ports]:
    """Start the services that `services(ports)` describes, on ports the OS says are free now.
    Nothing reserves them until each server binds its own (Ports.found_free), so another process can
    take one first: that clash is tried once more, on new ports (servelab.retries says so).
    Returns the running stack and its ports."""
    ports = Ports.found_free()
    specs = services(ports)
    try:
        return LocalStack(specs, log_dir=log_dir).start(), ports
    except PortClash as clash:
        retries.note(f"starting {', '.join(spec.name for spec in specs)} on new ports", clash)
    ports = Ports.found_free()
    return LocalStack(services(ports), log_dir=log_dir / "second-start").start(), ports


# At most this many restarts of one service within the window; then it stays down (a crash loop).
MAX_RESTARTS = 3
RESTART_WINDOW_S = 600.0
POLL_S = 0.5


class Supervisor(threading.Thread):
    """Restarts the services of a stack that exit on their own, and records each exit."""

    def __init__(self, stack: LocalStack) -> None:
        super().__init__(name="servelab-supervisor", daemon=True)
        self.stack = stack
        self.stopping = threading.Event()
        self.restarted_at: dict[str, list[float]] = {}
        self.checked_at = time.time()  # when it last found every service it looks after alive

    def run(self) -> None:
        while not self.stopping.wait(POLL_S):
            given_up = set(self.stack.given_up())
            checked_at = time.time()
            for managed in self.stack.processes:
                if not managed.alive() and managed.spec.name not in given_up and not self.stopping.is_set():
                    self._restart(managed)
            self.checked_at = checked_at

    def _restart(self, managed: ManagedProcess) -> None:
        name = managed.spec.name
        event = service_exits.ServiceExit(
            name, time.time(), service_exits.exit_cause(managed.started_process.returncode), managed.log_tail()
        )
        log.error("%s %s unexpectedly. Last lines of %s:\n%s", name, event.cause, managed.log_path, event.log_tail)
        self.stack.exits.append(event)
        self._record(event)
        managed.clear_group()
        while not self.stopping.is_set():
            recent = [at for at in self.restarted_at.get(name, []) if at > time.monotonic() - RESTART_WINDOW_S]
            if len(recent) >= MAX_RESTARTS:
                detail = (
                    f"it was restarted {len(recent)} times in the last {RESTART_WINDOW_S / 60:.0f} minutes. Its "
                    f"log is {managed.log_path}; once the cause is fixed, stop the lab and start it again"
                )
                log.error("%s stays down: %s", name, detail)
                self._settle(event, outcome=service_exits.GIVEN_UP, detail=detail)
                return
            self.restarted_at[name] = [*recent, time.monotonic()]
            try:
                _wait_for_ports(managed.spec.ports, self.stopping)
                managed.start(after=event.cause)
                managed.wait_ready(self.stopping)
                break
            except StackError as exc:
                if not self.stopping.is_set():
                    log.error("restarting %s failed: %s", name, exc)
                    managed.stop()  # what is left of the attempt, before the next
        if not self.stopping.is_set():
            log.warning("%s is back (restart %d) after it %s", name, len(self.restarted_at[name]), event.cause)
            self._settle(event, outcome=service_exits.BACK, back_at=time.time())

    def _settle(self, event: service_exits.ServiceExit, **outcome: Any) -> None:
        """Give `event` (already in the stack's `exits`) its outcome, recorded in the events file
        first: whoever sees the outcome in `exits` (given_up()) then finds its line there too."""
        self._record(replace(event, **outcome))
        for name, value in outcome.items():
            setattr(event, name, value)

    def _record(self, event: service_exits.ServiceExit) -> None:
        try:
            service_exits.record(self.stack.events_path, event)
        except OSError as exc:  # the stack keeps running; only readers in other processes miss it
            log.warning("could not record %s's exit in %s: %s", event.service, self.stack.events_path, exc)


def _wait_for_ports(ports: list[int], stopping: threading.Event, timeout_s: float = 30.0) -> None:
    """A crashed server's port can stay taken for a moment (a child still exiting)."""
    deadline = time.monotonic() + timeout_s
    while not all(port_is_free(port) for port in ports) and time.monotonic() < deadline:
        if stopping.wait(0.2):
            return
