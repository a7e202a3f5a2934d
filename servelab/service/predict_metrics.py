"""Prometheus metrics of a prediction service, served at /metrics.

What a request spent its time on, measured by the server itself: downloading the image (when
sent by URL), waiting for a predict slot, preprocessing, and inference (a /refine stream's photo
and steps are timed the same way, by the scheduler both go through); plus every /predict
request by outcome and HTTP status, and how many are in flight; and the steps of /refine streams,
those computed after their client had gone among them. The lab reads two scrapes, before
and after a run, and turns the difference into that run's figures (servelab/measure/service_stats.py).
An attribute is named for what it counts (`refine_steps_computed` is the counter `refine_steps`);
the functions that read the counts back are service_stats.refine_steps and triton_stats.refine_steps.

A service of several processes (servelab.service.launch) sets PROMETHEUS_MULTIPROC_DIR for all of
them: each process writes its figures there, and /metrics adds up every process's, those of a
process that died included; the gauges count the live processes only.
"""

from __future__ import annotations

import os
from collections import OrderedDict

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Client addresses a process remembers, to tell a new connection from a kept-alive one: more than
# a load's connections, few enough to stay small.
CLIENTS_REMEMBERED = 4096
# From 1 ms to 30 s: an inference on a GPU to a download that hits the time limit.
BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def outcome_of(status: int) -> str:
    if status < 400:
        return "predicted"
    if status == 499:
        return "abandoned"
    if status == 413:
        return "too_large"
    if status in (502, 504):
        return "upstream_failed"
    return "refused" if status < 500 else "failed"


class PredictMetrics:
    """The metrics of one service, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "predict_requests", "Requests to /predict, by outcome and HTTP status", ["outcome", "status"],
            registry=self.registry,
        )  # fmt: skip
        self.in_flight = Gauge(
            "predict_in_flight", "Requests to /predict being served now", registry=self.registry,
            multiprocess_mode="livesum",
        )  # fmt: skip

        def histogram(name: str, what: str) -> Histogram:
            return Histogram(name, what, buckets=BUCKETS_S, registry=self.registry)

        self.download_s = histogram("predict_download_seconds", "Downloading the image of a request sent by URL")
        self.slot_wait_s = histogram(
            "predict_slot_wait_seconds", "Waiting for a predict slot: for room to be decoded, then in the slots' queue"
        )
        self.preprocess_s = histogram("predict_preprocess_seconds", "Decoding and preprocessing the image")
        self.inference_s = histogram("predict_inference_seconds", "Running the model")
        self.abandoned = Counter(
            "predict_abandoned", "Requests abandoned because their client had gone, by the stage that noticed",
            ["stage"], registry=self.registry,
        )  # fmt: skip
        self.inferences_for_gone_clients = Counter(
            "predict_inferences_for_gone_clients", "Inferences whose client had gone by the time they finished",
            registry=self.registry,
        )  # fmt: skip
        # POST /refine (refine_api.py): a stream of steps, one inference each.
        self.refine_steps_computed = Counter(
            "refine_steps", "Steps of /refine streams computed", registry=self.registry
        )  # fmt: skip
        self.refine_steps_for_gone_clients = Counter(
            "refine_steps_for_gone_clients", "Steps of /refine streams that finished after their client had gone",
            registry=self.registry,
        )  # fmt: skip
        self.refine_streams = Counter(
            "refine_streams", "/refine streams by how they ended: completed, stopped (the client left), failed",
            ["outcome"], registry=self.registry,
        )  # fmt: skip
        self.refine_running = Gauge(
            "refine_running", "/refine streams whose steps are being computed now", registry=self.registry,
            multiprocess_mode="livesum",
        )  # fmt: skip

        self.ready = Gauge(
            "service_processes_ready", "Processes of the service that have started and serve", registry=self.registry,
            multiprocess_mode="livesum",
        )  # fmt: skip
        # Each process's own share (labelled with its pid; a live process's alone): the /predict
        # requests it answered, and the connections they came on (a client address it had not seen
        # lately). Processes that share one listening socket balance connections, not requests.
        self.requests_by_process = Gauge(
            "predict_requests_by_process", "/predict requests this process answered", ["process"],
            registry=self.registry, multiprocess_mode="livesum",
        )  # fmt: skip
        self.connections_by_process = Gauge(
            "predict_connections_by_process", "Connections this process took /predict requests on", ["process"],
            registry=self.registry, multiprocess_mode="livesum",
        )  # fmt: skip
        self._clients_seen: OrderedDict[tuple, None] = OrderedDict()  # the latest CLIENTS_REMEMBERED addresses

    def process_started(self) -> None:
        """This process serves: it is counted ready, and its own counts start at 0 (an idle process shows)."""
        self.ready.set(1)
        for gauge in (self.requests_by_process, self.connections_by_process):
            gauge.labels(str(os.getpid())).inc(0)

    def counted(self, client: tuple | None) -> None:
        """One /predict request answered by this process, from `client` (ASGI's (host, port))."""
        process = str(os.getpid())
        self.requests_by_process.labels(process).inc()
        if client is None:
            return
        if client in self._clients_seen:
            self._clients_seen.move_to_end(client)
            return
        self._clients_seen[client] = None
        if len(self._clients_seen) > CLIENTS_REMEMBERED:
            self._clients_seen.popitem(last=False)
        self.connections_by_process.labels(process).inc()

    def _read(self) -> CollectorRegistry:
        """What /metrics reads: this process's registry, or every process's figures of the service."""
        if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            return self.registry
        every_process = CollectorRegistry()
        multiprocess.MultiProcessCollector(every_process)
        return every_process

    def processes_ready(self) -> int:
        """How many of the service's processes serve now (this one alone: 1 once it has started)."""
        return int(self._read().get_sample_value("service_processes_ready") or 0)

    def exposition(self) -> tuple[bytes, str]:
        """The metrics as Prometheus reads them: this process's, or every process's of the service."""
        return generate_latest(self._read()), CONTENT_TYPE_LATEST

    def process_ended(self) -> None:
        """This process stops serving: its live gauges no longer count (its counts stay)."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            multiprocess.mark_process_dead(os.getpid())


class CountPredictRequests:
    """ASGI middleware: every /predict request counted by the status it got (refusals by the body
    limit and by validation included), and in flight while it is served."""

    def __init__(self, app: ASGIApp, metrics: PredictMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/predict":
            await self.app(scope, receive, send)
            return
        answered = 500  # what the client gets when the app fails before answering

        async def recording_send(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.start":
                answered = message["status"]
            await send(message)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, recording_send)
        finally:
            self.metrics.in_flight.dec()
            self.metrics.requests.labels(outcome_of(answered), str(answered)).inc()
            client = scope.get("client")
            self.metrics.counted(tuple(client) if client else None)
