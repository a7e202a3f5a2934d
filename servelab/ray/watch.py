"""Watch a Ray Serve deployment over time, from Serve's own accounts of itself.

Every `interval_s` a thread records, for one deployment:
- its replicas by state (RUNNING, STARTING, STOPPING...), from Serve's REST API;
- from Ray's Prometheus metrics (reported every second by the lab's launcher): the requests
  running inside the replicas (`ray_serve_replica_processing_queries`), the requests waiting in
  front of them for a replica (`ray_serve_deployment_queued_queries`), and the running totals of
  the time requests spent inside a replica (`ray_serve_deployment_processing_latency_ms`, its sum
  and count, /health excluded), whose differences give the time in the replica per window;
- the machine's CPU use, in % of all its cores.

    with ServeWatcher(dashboard_url, metrics_url, "food11", "Food11", token_file) as watcher:
        ...run a load...
    watcher.samples
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import psutil
import requests
from prometheus_client.parser import text_string_to_metric_families

from servelab.ray import rest as ray_rest

ONGOING = "ray_serve_replica_processing_queries"
QUEUED = "ray_serve_deployment_queued_queries"
IN_REPLICA = "ray_serve_deployment_processing_latency_ms"
NOT_PREDICTIONS = {"/health", "/metrics"}


@dataclass(frozen=True)
class ServeSample:
    t_s: float  # seconds since the watcher started
    replicas: dict[str, int]  # state -> replicas
    ongoing: float  # requests running inside the replicas, all replicas together
    queued: float  # requests waiting in front of the replicas
    in_replica_ms_total: float  # running totals since the replicas started (see the module's docstring)
    in_replica_count_total: float
    cpu_percent: float

    @property
    def running(self) -> int:
        return self.replicas.get("RUNNING", 0)

    @property
    def added(self) -> int:
        """Replicas Serve runs or has decided to run (starting): all but those stopping."""
        return sum(count for state, count in self.replicas.items() if state != "STOPPING")

    @property
    def per_replica(self) -> float:
        """Requests per running replica, inside the replicas or queued in front of them (NaN when
        none runs): what Serve's autoscaler compares with `target_ongoing_requests`."""
        return (self.ongoing + self.queued) / self.running if self.running else math.nan


@dataclass
class ServeMetrics:
    ongoing: float = 0.0
    queued: float = 0.0
    in_replica_ms_total: float = 0.0
    in_replica_count_total: float = 0.0


def serve_metrics(text: str, application: str, deployment: str) -> ServeMetrics:
    """Serve's gauges and counters for one deployment, summed over replicas and routers."""
    found = ServeMetrics()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if labels.get("application") != application or labels.get("deployment") != deployment:
                continue
            if sample.name == ONGOING:
                found.ongoing += sample.value
            elif sample.name == QUEUED:
                found.queued += sample.value
            elif labels.get("route") in NOT_PREDICTIONS:
                continue
            elif sample.name == f"{IN_REPLICA}_sum":
                found.in_replica_ms_total += sample.value
            elif sample.name == f"{IN_REPLICA}_count":
                found.in_replica_count_total += sample.value
    return found


class ServeWatcher:
    def __init__(
        self,
        dashboard: str,
        metrics_url: str,
        application: str,
        deployment: str,
        token_file: Path = ray_rest.TOKEN_FILE,
        interval_s: float = 1.0,
    ) -> None:
        self.dashboard, self.metrics_url = dashboard, metrics_url
        self.application, self.deployment, self.token_file = application, deployment, token_file
        self.interval_s = interval_s
        self.samples: list[ServeSample] = []
        self.started = time.monotonic()  # the time axis's 0, set again when the watching starts
        self.failures: Counter[str] = Counter()  # polls that got no answer, by what went wrong
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="serve-watcher", daemon=True)

    def sample(self) -> ServeSample:
        replicas = ray_rest.replicas_by_state(self.dashboard, self.application, self.deployment, self.token_file)
        text = requests.get(self.metrics_url, timeout=5).text
        metrics = serve_metrics(text, self.application, self.deployment)
        return ServeSample(
            self.now_s(),
            replicas,
            metrics.ongoing,
            metrics.queued,
            metrics.in_replica_ms_total,
            metrics.in_replica_count_total,
            psutil.cpu_percent(interval=None),
        )

    def _run(self) -> None:
        psutil.cpu_percent(interval=None)  # the first call only starts the measurement
        while not self._stop.is_set():
            try:
                self.samples.append(self.sample())
            except (requests.RequestException, ray_rest.RayConfigError, ValueError) as exc:
                self.failures[type(exc).__name__] += 1
            self._stop.wait(self.interval_s)

    def now_s(self) -> float:
        """Now, on the watcher's time axis (what a load started now is offset by)."""
        return time.monotonic() - self.started

    def __enter__(self) -> ServeWatcher:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()


def during(samples: list[ServeSample], start_s: float, end_s: float) -> list[ServeSample]:
    """The samples taken between `start_s` and `end_s` on the watcher's time axis."""
    return [sample for sample in samples if start_s <= sample.t_s <= end_s]


def in_replica_mean_ms(samples: list[ServeSample], start_s: float, end_s: float) -> float:
    """The mean time a request spent inside a replica, over the requests Serve counted between
    the first and the last sample of the interval; NaN when it counted none."""
    inside = during(samples, start_s, end_s)
    if len(inside) < 2:
        return math.nan
    first, last = inside[0], inside[-1]
    served = last.in_replica_count_total - first.in_replica_count_total
    return (last.in_replica_ms_total - first.in_replica_ms_total) / served if served > 0 else math.nan
