"""What a FastAPI service (or GourmetGram) says it did: its Prometheus metrics, read before and after
a run, as servelab.triton.stats does for Triton.

A service's /metrics counters are cumulative since it started. Two scrapes and their difference
give, for the requests of one run: how many there were by HTTP status, the mean time of each
stage the service measures (download, waiting for a predict slot, preprocessing, inference), the
requests abandoned, and inferences run, for clients who had gone; what each of its processes
answered, and on how many connections; and the /refine streams' steps, those computed after their
client had gone among them.
The counters cover every client, so a run measures only its own requests when nothing else is
sending to that service at the same time.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

from servelab.polling import settled
from servelab.results import StepCounts

# The stages a FastAPI service times (the metrics part of its app.py), by their histogram's name.
STAGES = {
    "download": "predict_download_seconds",
    "slot_wait": "predict_slot_wait_seconds",
    "preprocess": "predict_preprocess_seconds",
    "inference": "predict_inference_seconds",
}

# Each process's own counts (the same), by their gauge's name.
PER_PROCESS = {"predict_requests_by_process": "requests", "predict_connections_by_process": "connections"}


class ServiceStatsError(RuntimeError):
    """The metrics could not be read."""


Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]  # (sample name, labels) -> value


def scrape(url: str, timeout_s: float = 10.0) -> Scrape:
    """Every sample of `url`/metrics (url: the service's base URL)."""
    try:
        response = requests.get(f"{url.rstrip('/')}/metrics", timeout=timeout_s)
        response.raise_for_status()
    except requests.RequestException as exc:
        raise ServiceStatsError(f"Could not read {url}/metrics: {exc}") from exc
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


@dataclass
class ServiceDelta:
    """What happened between two scrapes of one service."""

    url: str
    requests_by_status: dict[str, int] = field(default_factory=dict)  # HTTP status -> /predict requests
    stage_counts: dict[str, int] = field(default_factory=dict)  # stage -> requests that went through it
    stage_mean_ms: dict[str, float] = field(default_factory=dict)  # stage -> mean time (NaN: none)
    abandoned_by_stage: dict[str, int] = field(default_factory=dict)  # stage -> requests whose client had gone
    inferences_for_gone_clients: int = 0  # inferences that finished after their client had gone
    refine_steps: int = 0  # steps of /refine streams computed
    refine_steps_for_gone_clients: int = 0  # of them, those that finished after their client had gone
    refine_streams_by_outcome: dict[str, int] = field(default_factory=dict)  # completed, stopped, failed -> streams
    # Each live process of the service (by pid): the /predict requests it answered and the connections
    # they came on (opened since `connections_since`, before a warm-up that opens them), as the
    # process counted them itself (an idle process among them, with 0).
    by_process: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def inferences(self) -> int:
        return self.stage_counts.get("inference", 0)

    @property
    def requests(self) -> int:
        return sum(self.requests_by_status.values())

    def mean_ms(self, stage: str) -> float:
        if stage not in STAGES:
            raise KeyError(f"no stage {stage!r}: the service times {', '.join(STAGES)}")
        return self.stage_mean_ms.get(stage, math.nan)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def diff(url: str, before: Scrape, after: Scrape, connections_since: Scrape | None = None) -> ServiceDelta:
    """What happened between `before` and `after`; each process's connections counted from
    `connections_since` where given (a scrape before a run's warm-up, which opens them)."""

    def moved(name: str, labels: tuple = (), since: Scrape = before) -> float:
        return after.get((name, labels), 0.0) - since.get((name, labels), 0.0)

    delta = ServiceDelta(url)
    for (name, labels), _ in after.items():
        if name == "predict_requests_total" and (count := round(moved(name, labels))):
            delta.requests_by_status[dict(labels)["status"]] = count
        if name == "predict_abandoned_total" and (count := round(moved(name, labels))):
            delta.abandoned_by_stage[dict(labels)["stage"]] = count
        if name == "refine_streams_total" and (count := round(moved(name, labels))):
            delta.refine_streams_by_outcome[dict(labels)["outcome"]] = count
        if name in PER_PROCESS:
            counts = delta.by_process.setdefault(dict(labels)["process"], {"requests": 0, "connections": 0})
            since = (
                connections_since if connections_since is not None and PER_PROCESS[name] == "connections" else before
            )
            counts[PER_PROCESS[name]] = round(moved(name, labels, since))
    delta.inferences_for_gone_clients = round(moved("predict_inferences_for_gone_clients_total"))
    delta.refine_steps = round(moved("refine_steps_total"))
    delta.refine_steps_for_gone_clients = round(moved("refine_steps_for_gone_clients_total"))
    for stage, histogram in STAGES.items():
        count = round(moved(f"{histogram}_count"))
        delta.stage_counts[stage] = count
        delta.stage_mean_ms[stage] = 1000 * moved(f"{histogram}_sum") / count if count else math.nan
    return delta


def refine_steps(url: str) -> StepCounts:
    """The service's own count of /refine steps so far (servelab.results.StepCounts)."""
    now = scrape(url)
    return StepCounts(
        computed=round(now.get(("refine_steps_total", ()), 0.0)),
        for_gone_clients=round(now.get(("refine_steps_for_gone_clients_total", ()), 0.0)),
        running=round(now.get(("refine_running", ()), 0.0)),
    )


@dataclass
class Snapshots:
    """A service's metrics scraped before and after a block of code; `delta` is set when the block
    ends without an error."""

    url: str
    before: Scrape
    after: Scrape | None = None
    delta: ServiceDelta | None = None


@contextmanager
def counted_over(url: str) -> Iterator[Snapshots]:
    """The service's counters scraped before and after the `with` block, and their difference
    (it sends nothing itself: the block's requests are what it counts):

    with service_stats.counted_over("http://127.0.0.1:8101") as stats:
        run_load()
    print(stats.delta.mean_ms("slot_wait"))
    """
    snapshots = Snapshots(url, before=scrape(url))
    # No scrape after an error in the block: reading the service again could hide that error.
    yield snapshots
    snapshots.after = settled(lambda: scrape(url))
    snapshots.delta = diff(url, snapshots.before, snapshots.after)
