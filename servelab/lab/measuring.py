"""What a notebook measures through its Lab (`lab.measurer`): the runs of the load generator
against a service at an address, each kept by the run keeper with what it counted over it
(servelab.lab.run_accounts), and a private FastAPI variant to measure. Lab passes the notebooks'
calls by flavor on: `lab.concurrent("onnx", 8)` is
`lab.measurer.concurrent(lab.fastapi_url("onnx"), 8, "fastapi_onnx")`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from servelab import loadgen, paths
from servelab.lab.run_accounts import Account, ResourcesAccount, ServiceAccount, counted
from servelab.lab.run_keeper import RunKeeper
from servelab.lab.triton_side import NOTEBOOK_STACK_DIR, TritonSide
from servelab.measure.resources import ResourceSampler
from servelab.polling import settled
from servelab.profiles import Profile
from servelab.results import RunResult, SequenceRunResult, StepCounts
from servelab.settings import settings
from servelab.stack.catalogue import fastapi_service
from servelab.stack.supervision import start_on_free_ports
from servelab.triton.models import ModelRepository

STREAMS_END_S = 60.0  # how long the streams a run left on the server may take to end
# A closed loop left to the profile's duration runs at least this long: it has no warm-up, and its
# first second or two (connections opening, a server's first requests) would be most of the quick
# profile's 2 s.
CLOSED_LOOP_MIN_S = 5.0


class ServiceURL(str):
    """A service's URL as this notebook reaches it (a str, for f-strings and requests), and
    `browser`: where a browser on the student's machine reaches the same service. Locally, the URL
    itself; in the Compose project, whose services this notebook reaches by their service names,
    the port compose.yaml publishes on the host's 127.0.0.1."""

    browser: str

    def __new__(cls, url: str, browser: str | None = None) -> ServiceURL:
        made = super().__new__(cls, url)
        made.browser = browser or url
        return made


@dataclass
class Measurer:
    """The Lab's measured runs (see the module's docstring)."""

    keeper: RunKeeper  # waits for the services before each run, and keeps it
    triton: TritonSide  # the lab's Triton: its addresses, and its statistics over a run
    profile: Profile  # how long each run lasts
    models: ModelRepository  # the models as shipped: what a request to each carries
    image_host_url: str | None  # the image host a private FastAPI variant may fetch photos from

    @contextlib.contextmanager
    def fastapi_variant(
        self, flavor: str, slots: int | None = None, threads: int | None = None, **variables: str
    ) -> Iterator[str]:
        """A private FastAPI service of `flavor` with `slots` inference slots (PREDICT_CONCURRENCY)
        and `threads` threads per inference (INFERENCE_THREADS); None keeps the default; other
        settings as environment variables, by name (IMAGE_DOWNLOAD_PLACEMENT="inside_slot"). It runs on
        127.0.0.1 of the machine this notebook runs on (locally, or in the Compose project's
        Jupyter container, next to the GPU on the node), for the `with` block:
        `with lab.measurer.fastapi_variant("pt", 2, 1) as url:`.
        It fetches images by URL from this lab's image host. It runs in one process unless
        WEB_CONCURRENCY says otherwise: a variant is an experiment on what one process does."""
        env = {"WEB_CONCURRENCY": "1"} | {
            name: str(value)
            for name, value in (("PREDICT_CONCURRENCY", slots), ("INFERENCE_THREADS", threads))
            if value is not None
        }
        env |= variables
        if self.image_host_url:
            env.setdefault("IMAGE_URL_ALLOWED_HOSTS", self.image_host_url.split("://", 1)[1])
        work = NOTEBOOK_STACK_DIR / f"variant-{os.getpid()}"
        stack, ports = start_on_free_ports(
            lambda ports: [fastapi_service(flavor, ports.fastapi_pt, env=env)], work / "logs"
        )
        with stack, self.keeper.watching(stack):  # watched for crashes like the others, while it runs
            yield f"http://127.0.0.1:{ports.fastapi_pt}"

    def sequential(self, url: str, name: str) -> RunResult:
        """One request at a time, as many as the profile says: the latency without queueing.
        Against the FastAPI service at `url`, recorded as `name`. The service's own account of the
        run (its /metrics) is in `result.service_stats`."""
        load = loadgen.Load(1, self.profile.sequential_requests, warmup_requests=3)
        return self._counted_fastapi_run(url, name, load)

    def concurrent(
        self,
        url: str,
        concurrency: int,
        name: str,
        image_url: str | None = None,
        resources: ResourceSampler | None = None,
    ) -> RunResult:
        """`concurrency` senders for the profile's duration, against the FastAPI service at `url`,
        recorded as `name`, sending the photo itself or, with `image_url`, its URL. The service's own
        account of the run (its /metrics) is in `result.service_stats`; with `resources`, a
        ResourceSampler run over the load, the machine's in `result.resources`."""
        load = loadgen.Load(concurrency, duration_s=self.profile.duration_s, warmup_s=self.profile.warmup_s)
        return self._counted_fastapi_run(url, name, load, image_url, resources)

    def burst(self, url: str, requests: int, name: str, image_url: str | None = None) -> RunResult:
        """`requests` requests sent at once, one per sender, after an unmeasured burst of as many
        (which warms every slot): against the FastAPI service at `url`, recorded as `name`, sending
        the photo or, with `image_url`, its URL. The service's own account of the measured burst
        (its /metrics) is in `result.service_stats`."""
        load = loadgen.Load(requests, requests, warmup_requests=requests)
        return self._counted_fastapi_run(url, name, load, image_url)

    def _counted_fastapi_run(
        self,
        url: str,
        name: str,
        load: loadgen.Load,
        image_url: str | None = None,
        resources: ResourceSampler | None = None,
    ) -> RunResult:
        """A closed-loop run of `load` against a FastAPI service, with the service's /metrics
        counted over it, and the machine sampled by `resources`."""
        accounts = [ServiceAccount(url), *([ResourcesAccount(resources)] if resources else [])]
        started = self.keeper.ready_to_measure()
        endpoint = self._endpoint("fastapi", url, image_url=image_url)
        measure = functools.partial(loadgen.closed_loop, endpoint, load, progress=settings().progress)
        return self.keeper.keep(counted(measure, accounts, after_warmup=True), name, started)

    def _endpoint(
        self, kind: str, address: str, model: str | None = None, image_url: str | None = None
    ) -> loadgen.Endpoint:
        """Where a run of this lab sends the sample photo (or `image_url`): its models are this lab's."""
        image = paths.SAMPLE_IMAGE.read_bytes()
        return loadgen.Endpoint(kind, address, model, image, models=self.models, image_url=image_url)

    def closed_loop(
        self,
        address: str,
        concurrency: int,
        duration_s: float | None = None,
        name: str | None = None,
        kind: str = "fastapi",
        model: str | None = None,
        backoff_s: float = 0.0,
        impatient: int = 0,
        patience_s: float | None = None,
        service_stats: bool = False,
        triton_stats: bool = False,
    ) -> RunResult:
        """`concurrency` senders for `duration_s` seconds with no warm-up (its timeline starts when
        it is called: a step of a longer load), against the service at `address` of `kind`
        ("fastapi": any service with the FastAPI contract; "triton-http"/"triton-grpc": `model`),
        recorded as `name` (by default the address and the senders). By default it runs for the
        profile's duration, at least CLOSED_LOOP_MIN_S.
        With `backoff_s`, a sender waits that long after a failed request (a refusal); `impatient`
        of the senders give up on a request after `patience_s` and cancel it. The server's own
        account of the run: with `service_stats`, the /metrics of the service at `address`
        (`result.service_stats`); with `triton_stats`, the lab's Triton's statistics of `model`
        (`result.triton_stats`, see servelab.lab.run_accounts)."""
        if service_stats and kind != "fastapi":
            raise ValueError(
                "service_stats=True reads the /metrics of a service with the FastAPI contract (kind='fastapi')"
            )
        accounts: list[Account] = [ServiceAccount(address)] if service_stats else []
        if triton_stats:
            if model is None:
                raise ValueError("triton_stats=True counts Triton's statistics of `model`: name the model")
            accounts.append(self.triton.account(model))
        endpoint = self._endpoint(kind, address, model)
        if duration_s is None:
            duration_s = max(self.profile.duration_s, CLOSED_LOOP_MIN_S)
        load = loadgen.Load(
            concurrency, duration_s=duration_s, backoff_s=backoff_s, impatient=impatient, patience_s=patience_s
        )
        started = self.keeper.ready_to_measure()
        measure = functools.partial(loadgen.closed_loop, endpoint, load, progress=settings().progress)
        return self.keeper.keep(counted(measure, accounts), name or f"{address}, {concurrency} client(s)", started)

    def streams(
        self,
        address: str,
        concurrency: int,
        steps: int,
        duration_s: float,
        name: str,
        server_steps: Callable[[], StepCounts],
        kind: str = "fastapi",
        model: str | None = None,
        impatient: int = 0,
        leave_after_steps: int | None = None,
        patience_s: float | None = None,
        backoff_s: float = 0.0,
    ) -> RunResult:
        """`concurrency` clients streaming `steps`-step refinements (servelab.loadgen.streams) for
        `duration_s` seconds against the service at `address` of `kind` ("fastapi": POST /refine;
        "triton-grpc": the decoupled `model`), recorded as `name`; `impatient` of them leave after `leave_after_steps`
        steps or `patience_s` seconds, and wait `backoff_s` before their next stream. `server_steps`
        reads the server's own step counters: before the run, and after it once the streams it left
        running have ended, their difference is the run's `steps["computed"]` and
        `steps["for_gone_clients"]`."""
        endpoint = self._endpoint(kind, address, model)
        load = loadgen.Load(
            concurrency, duration_s=duration_s, backoff_s=backoff_s, impatient=impatient, patience_s=patience_s
        )
        started = self.keeper.ready_to_measure()
        before = server_steps()
        result = loadgen.stream_loop(endpoint, load, steps, leave_after_steps, progress=settings().progress)
        # Steps of streams whose client left may still be computed: with cancellation off, all of them.
        deadline = time.monotonic() + STREAMS_END_S
        while (after := server_steps()).running > before.running and time.monotonic() < deadline:
            if any(event.between(started, time.time()) for event in self.keeper.service_exits()):
                break  # a crash cut streams short: they never end, and the run is marked
            time.sleep(0.1)
        if after.running > before.running:
            result.notes.append(f"{after.running - before.running} stream(s) had not ended on the server when read")
        else:
            after = settled(server_steps)  # a server counts a step, or logs a stream's end, just after it
        assert result.steps is not None, "a streamed run's result has its steps"
        result.steps |= {
            "computed": after.computed - before.computed,
            "for_gone_clients": after.for_gone_clients - before.for_gone_clients,
        }
        return self.keeper.keep(result, name, started)

    def sequences(
        self,
        model: str,
        concurrency: int,
        length: int,
        name: str,
        kind: str = "triton-grpc",
        triton_stats: bool = False,
        sequences: int | None = None,
        duration_s: float | None = None,
        frame_interval_s: float | None = None,
        warmup_sequences: int = 0,
    ) -> SequenceRunResult:
        """`concurrency` live sequences of `length` frames each (the sample photo as every frame)
        against the stateful Triton `model` over `kind` ("triton-grpc" or "triton-http"), recorded
        as `name`, until
        `sequences` have started or `duration_s` has passed, a frame every `frame_interval_s` (see
        loadgen.SequenceLoad), after `warmup_sequences` unmeasured. With `triton_stats`, Triton's
        statistics of `model` over the run are in `result.triton_stats`."""
        address = self.triton.grpc if kind == "triton-grpc" else self.triton.configs.http
        if address is None:
            raise RuntimeError("This lab runs without Triton: connect with Lab.connect() (Triton is on by default).")
        endpoint = self._endpoint(kind, address, model)
        load = loadgen.SequenceLoad(concurrency, length, sequences, duration_s, frame_interval_s, warmup_sequences)
        accounts = [self.triton.account(model)] if triton_stats else []
        started = self.keeper.ready_to_measure()
        measure = functools.partial(loadgen.sequence_loop, endpoint, load, progress=settings().progress)
        return self.keeper.keep(counted(measure, accounts, after_warmup=True), name, started)
