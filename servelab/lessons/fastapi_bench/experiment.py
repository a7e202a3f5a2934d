"""What notebook 4 keeps beside its 16-sender run, beyond the Lab's loads (`LoadWatch`): /health
timed in a background thread, the machine and the server's own process sampled, and what was sampled
shown in words and plotted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType
from urllib.parse import urlsplit

import psutil
import requests

from servelab.lessons.fastapi_bench.views import usage_text
from servelab.measure.resources import ResourceSampler
from servelab.report import plots

# Where a URL names this machine, its server is one of this machine's processes.
THIS_MACHINE = {"127.0.0.1", "localhost", "::1"}


def listening_pids(url: str) -> list[int]:
    """The processes of this machine that listen on `url`'s port (a local server's), as psutil sees
    them; none where it sees no such process, or where `url` names another machine (in the Compose
    project, a service's own container)."""
    address = urlsplit(url)
    if address.hostname not in THIS_MACHINE:
        return []
    port = address.port
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
      where this one can see it: where `url` is on this machine (locally), not in the Compose
      project, where the server runs in another container (listening_pids);
    - `show_resources`, once the run is over: what the sampler saw.

    `time_health`: how one health check is timed (health_check_ms of `url` unless given)."""

    def __init__(
        self,
        url: str,
        idle_checks: int = 10,
        every_s: float = 0.1,
        time_health: Callable[[], float] | None = None,
    ) -> None:
        self.url = url
        self.idle_checks = idle_checks
        self.every_s = every_s
        self._time_health = time_health or (lambda: health_check_ms(url))
        self.sampler = ResourceSampler(interval_s=0.25, pids=listening_pids(url))
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

    def show_resources(self, during: str) -> None:
        """What the sampler saw over the run it was handed (`during`: that run's label): in words
        (usage_text, on the cores this process may use), then over time (plots.plot_resources)."""
        series = self.sampler.series()
        print(usage_text(series))
        plots.plot_resources(series, title=f"Resources during {during}")
