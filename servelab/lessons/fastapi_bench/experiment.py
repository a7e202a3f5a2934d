"""What notebook 4 runs beyond the Lab's loads: the four thread plans it serves
(`thread_plans`), and the watch it keeps beside the 16-sender run (`LoadWatch`: /health timed in a
background thread, the machine and the server's own process sampled).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType
from urllib.parse import urlsplit

import psutil
import requests

from servelab.lessons.fastapi_bench.checks_threads import plan_names
from servelab.measure.resources import ResourceSampler


def thread_plans(cores: int) -> dict[str, tuple[int | None, int | None]]:
    """The four plans notebook 4 serves on `cores` cores, by name: (inference slots, threads per
    inference), None keeping the service's default. The crowded plan has at least two slots, each
    with every core: more busy threads than cores, even on one core."""
    every_core, one_core, crowded, default = plan_names(cores)
    return {every_core: (1, cores), one_core: (cores, 1), crowded: (max(2, cores), cores), default: (None, None)}


def thread_plans_said(device: str, cores: int) -> str:
    """Where notebook 4 served its thread plans, or why it did not: on a GPU the plans only change
    how the CPU shares its other work, so their runs would spend the lease's minutes on three
    verdicts NOT CHECKED."""
    if device == "cpu":
        return f"\nThe model ran on the CPU; this process may use {cores} core(s)."
    return (
        f"The model runs on {device}: PyTorch's threads per inference only share the CPU's other work (HTTP, "
        f"JSON, decoding) there, too little to judge, so the {len(thread_plans(cores))} plans were not run (their "
        "checks would read NOT CHECKED). Run this notebook on a CPU-only machine to see them."
    )


def listening_pids(url: str) -> list[int]:
    """The processes of this machine that listen on `url`'s port (a local server's), as psutil sees
    them; none where it sees no such process."""
    port = urlsplit(url).port
    return sorted(
        {
            conn.pid
            for conn in psutil.net_connections("tcp")
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid
        }
    )


def health_check_ms(url: str) -> float:
    """How long the service at `url` takes to answer one GET /health, in ms."""
    started = time.perf_counter()
    requests.get(f"{url}/health", timeout=10).raise_for_status()
    return (time.perf_counter() - started) * 1000


class LoadWatch:
    """What notebook 4 watches beside a run under load, as a context manager around it:

    - /health, timed `idle_checks` times as the block starts (`idle_ms`), then every `every_s`
      seconds in a background thread until it ends (`loaded_ms`);
    - `sampler`, a ResourceSampler to hand the run, which also samples the server's own process
      where this one can see it: locally, not in the Compose project (`on_compose`), where the
      server runs in another container.

    `time_health`: how one health check is timed (health_check_ms of `url` unless given)."""

    def __init__(
        self,
        url: str,
        on_compose: bool,
        idle_checks: int = 10,
        every_s: float = 0.1,
        time_health: Callable[[], float] | None = None,
    ) -> None:
        self.url = url
        self.idle_checks = idle_checks
        self.every_s = every_s
        self._time_health = time_health or (lambda: health_check_ms(url))
        self.sampler = ResourceSampler(interval_s=0.25, pids=[] if on_compose else listening_pids(url))
        self.idle_ms: list[float] = []
        self.loaded_ms: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.loaded_ms.append(self._time_health())
            self._stop.wait(self.every_s)

    def __enter__(self) -> LoadWatch:
        self.idle_ms = [self._time_health() for _ in range(self.idle_checks)]
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, name="health-poller", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
