"""What the notebooks use: one lab, wherever its services are.

    from servelab.lab import Lab
    lab = Lab.connect()

LAB_SERVICES says where the lab's services are (servelab.settings, servelab.environment):
- `local` (the default): the lab's services as processes on 127.0.0.1, CPU only. A stack already
  started with `make up` is used; otherwise the notebook starts one and stops it when its kernel exits.
- `compose`: the services of the Compose project (compose.yaml), reached by their service names
  from its Jupyter container, on the GPU node or on any Docker host. A config edit is adapted to
  the hardware of the server that runs it, as its container's start recorded it.

LAB_PROFILE chooses how long each measurement runs (servelab.profiles): `full` (the default) or
`quick` (CI; every experiment still runs, with short windows).

Lab finds or starts the services (servelab.lab.connecting), describes them and records the
verdicts; the notebooks call its parts (servelab.lab's docstring lists them) through it or directly
(`lab.triton.configs.apply_config(...)`). Its run keeper (`lab.keeper`) saves each run to
`results/notebooks/<notebook>.jsonl` as it ends, so a crash, a kernel restart or a closed tab loses
nothing measured (`Lab.saved_runs("10_cancellation")` loads them back); a run that a crash
interrupted is marked (`result.interrupted_by`) and a verdict that reads it is NOT CHECKED.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import NoReturn

from servelab import node_build, paths
from servelab.environment import current_services
from servelab.lab import connecting, ui
from servelab.lab import ray_side as lab_ray
from servelab.lab import your_turn as student_steps
from servelab.lab.measuring import Measurer, ServiceURL
from servelab.lab.run_keeper import RunKeeper, saved_runs_file
from servelab.lab.triton_configs import ServedConfigs
from servelab.lab.triton_side import NOTEBOOK_STACK_DIR, TritonSide
from servelab.lessons.expectations import (
    NOT_ASKED,
    Condition,
    Expectation,
    ExpectationLog,
    LabFault,
    Prediction,
    machine_cores,
    machine_hardware,
    verdict_problems,
)
from servelab.measure.resources import ResourceSampler
from servelab.profiles import Profile, profile
from servelab.report import tables
from servelab.report.summaries import shown_path
from servelab.results import RunResult
from servelab.service.hardware import Hardware
from servelab.settings import settings
from servelab.stack.catalogue import gourmetgram_service
from servelab.stack.supervision import LocalStack, Ports, answers, start_on_free_ports
from servelab.triton.models import ModelRepository
from servelab.triton.server import LOCAL_TRITON


@dataclass
class Lab:
    """The notebooks' lab: its services' addresses, and its parts (`keeper`, `triton`, `measurer`),
    made once from those addresses when the Lab is made (`Lab.connect()`)."""

    services: str  # where the lab's services are: "local" or "compose" (LAB_SERVICES)
    profile: Profile
    fastapi_urls: dict[str, str]  # flavor ("pt"/"onnx") -> http://host:port
    triton_http: str | None  # host:port; None when this notebook runs without Triton
    triton_grpc: str | None
    repository: Path | None  # the model repository the running Triton loads
    source: Path = paths.MODELS_STAGING_DIR  # the models as shipped
    image_host_url: str | None = None  # the image host (object store stand-in), http://host:port
    triton_metrics_url: str | None = None  # Triton's Prometheus metrics, http://host:port/metrics
    triton_server: Hardware = LOCAL_TRITON  # what the Triton server has: configs are adapted to it
    expectations: ExpectationLog = field(default_factory=ExpectationLog)
    # What the run keeper is given: whose runs these are (the file they are saved to), the stacks
    # this notebook started, and the exits recorded by the supervisor of `make up` (or by the
    # Compose project's Triton container) when this notebook uses that stack.
    notebook: InitVar[str] = "unnamed"
    stacks: InitVar[list[LocalStack] | None] = None
    shared_exits_file: InitVar[Path | None] = None
    keeper: RunKeeper = field(init=False, repr=False)
    triton: TritonSide = field(init=False, repr=False)
    measurer: Measurer = field(init=False, repr=False)
    _ray_serve: lab_ray.RayServe | None = field(default=None, repr=False)

    def __post_init__(self, notebook: str, stacks: list[LocalStack] | None, shared_exits_file: Path | None) -> None:
        self.keeper = RunKeeper(
            notebook, self.services, self.profile.name, self._health_urls(), stacks or [], shared_exits_file
        )
        configs = ServedConfigs(self.triton_http, self.repository, self.triton_server, self.models)
        self.triton = TritonSide(self.keeper, configs, self.profile, self.triton_grpc, self.triton_metrics_url)
        self.measurer = Measurer(self.keeper, self.triton, self.profile, self.models, self.image_host_url)

    # ---- connecting ------------------------------------------------------------------------

    @classmethod
    def connect(cls, notebook: str = "unnamed", triton: bool = True) -> Lab:
        """Connect to the lab's services; locally, `triton=False` starts FastAPI only (faster).
        `notebook` (the notebook's file name without .ipynb) names the file its runs are saved to.
        Every model Triton serves with an earlier notebook's edit is put back as shipped."""
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
        chosen = profile(settings().profile)
        services = current_services()
        if services == "chameleon":
            raise RuntimeError(
                "This is Chameleon's Jupyter server, where notebooks 1 and 2 set up the node: the lab's services "
                "run on the node. Open this notebook in the node's Jupyter container (notebook 2 prints its address)."
            )
        on_compose = services == "compose"
        lab = cls(**(connecting.compose if on_compose else connecting.local)(chosen, notebook, triton))
        print(lab.describe())
        if lab.triton_http and lab.repository is not None:
            lab.triton.configs.restore_shipped_configs()  # never an earlier notebook's edit (notebook 6's 8 instances)
        return lab

    def _health_urls(self) -> dict[str, str]:
        return connecting.health_urls(self.fastapi_urls, self.image_host_url, self.triton_http)

    @property
    def on_compose(self) -> bool:
        return self.services == "compose"

    def describe(self) -> str:
        where = (
            "the Compose project's services, from its Jupyter container"
            if self.on_compose
            else "the lab's services as processes on this machine, CPU only"
        )
        lines = [
            f"Services: {self.services} -- {where}; profile: {self.profile.name}",
            *(f"  FastAPI ({flavor}): {url}" for flavor, url in self.fastapi_urls.items()),
        ]
        if self.triton_http:
            server = f"; its server has {self.triton_server.describe()}" if self.on_compose else ""
            lines.append(f"  Triton: HTTP {self.triton_http}, gRPC {self.triton_grpc}{server}")
        if self.image_host_url:
            lines.append(f"  Image host (an object store with an emulated network latency): {self.image_host_url}")
        lines.append(
            f"Each run is saved as it ends to {shown_path(saved_runs_file(self.keeper.notebook))}; after a crash "
            f'or a restart of this kernel, Lab.saved_runs("{self.keeper.notebook}") loads them back.'
        )
        return "\n".join(lines)

    @property
    def cores(self) -> int:
        """The CPU cores this notebook's process may use (in the Compose project: the Jupyter container's)."""
        return machine_cores()

    @staticmethod
    def hardware() -> str:
        """What the models run on, in words, for the reasons the notebooks give: read, not assumed."""
        return machine_hardware()

    @staticmethod
    def your_turn() -> NoReturn:
        """Where the student's copy of a notebook waits for an answer: stop, saying what to type."""
        student_steps.stop(student_steps.running_cell())

    def stop(self) -> None:
        """Stop what this notebook started (nothing else: not `make up`'s services, nor the Compose project's)."""
        if self._ray_serve is not None:
            self._ray_serve.release()
        for stack in self.keeper.stacks:
            stack.stop()
        self.keeper.stacks.clear()

    def ray_serve(self) -> lab_ray.RayServe:
        """The lab's Ray Serve (servelab.lab.ray_side), to edit, redeploy and watch; locally, started
        on first use when `make up` does not run one."""
        if self._ray_serve is None:
            if self.on_compose:  # on the node its image may still be building (servelab.node_build)
                health = f"{settings().compose('ray_serve_url')}/health"
                node_build.wait_for_service("ray_serve", lambda: answers(health), paths.REPO_ROOT)
            self._ray_serve = (
                lab_ray.compose()
                if self.on_compose
                else lab_ray.local(self.keeper.stacks, NOTEBOOK_STACK_DIR / f"ray-{os.getpid()}")
            )
        return self._ray_serve

    # ---- requests and runs (lab.measurer) ----------------------------------------------------

    @property
    def models(self) -> ModelRepository:
        return ModelRepository(self.source)

    @staticmethod
    def sample_image() -> bytes:
        return paths.SAMPLE_IMAGE.read_bytes()

    def fastapi_url(self, flavor: str) -> ServiceURL:
        """The URL of the FastAPI service of `flavor`, with where a browser reaches it (its `browser`)."""
        if flavor not in self.fastapi_urls:
            raise ValueError(f"There is no FastAPI service {flavor!r}: the lab's are {', '.join(self.fastapi_urls)}.")
        url = self.fastapi_urls[flavor]
        if not self.on_compose:
            return ServiceURL(url)
        return ServiceURL(url, f"http://127.0.0.1:{settings().ports()[f'fastapi_{flavor}']}")

    def image_url(self, name: str = "soup.jpg", latency_ms: float | None = None) -> str:
        """The URL of a sample photo on the image host; `latency_ms` overrides its emulated latency."""
        if not self.image_host_url:
            raise RuntimeError(
                "This lab has no image host. Locally, `make up` (or Lab.connect() with no stack running) starts "
                "one; the Compose project has the image_host service."
            )
        query = "" if latency_ms is None else f"?latency_ms={latency_ms:g}"
        return f"{self.image_host_url}/images/{name}{query}"

    def sequential(self, flavor: str, url: str | None = None, name: str | None = None) -> RunResult:
        """One request at a time against the `flavor` service, or the one at `url` (Measurer.sequential)."""
        return self.measurer.sequential(url or self.fastapi_url(flavor), name or f"fastapi_{flavor}")

    def concurrent(
        self,
        flavor: str,
        concurrency: int,
        url: str | None = None,
        name: str | None = None,
        image_url: str | None = None,
        resources: ResourceSampler | None = None,
    ) -> RunResult:
        """`concurrency` senders against the `flavor` service, or the one at `url` (Measurer.concurrent)."""
        base, kept_as = url or self.fastapi_url(flavor), name or f"fastapi_{flavor}"
        return self.measurer.concurrent(base, concurrency, kept_as, image_url, resources)

    def burst(
        self, flavor: str, requests: int, url: str | None = None, name: str | None = None, image_url: str | None = None
    ) -> RunResult:
        """`requests` requests at once against the `flavor` service, or the one at `url` (Measurer.burst)."""
        return self.measurer.burst(url or self.fastapi_url(flavor), requests, name or f"fastapi_{flavor}", image_url)

    # ---- the runs (lab.keeper) -------------------------------------------------------------

    @property
    def results(self) -> list[RunResult]:
        """This notebook's runs, in the order they were kept."""
        return self.keeper.results

    @staticmethod
    def saved_runs(notebook: str, session: str = "latest") -> list[RunResult]:
        """The runs a notebook saved, oldest first: see RunKeeper.saved_runs."""
        return RunKeeper.saved_runs(notebook, session)

    def table(self, results: list[RunResult] | None = None) -> str:
        table = tables.results_table(results if results is not None else self.results)
        print(table)
        return table

    def breakdown(self, results: Mapping[str, RunResult | None]) -> str:
        """Print where the time went (Triton's breakdown) for named perf_analyzer runs."""
        table = tables.breakdown_table(results)
        print(table)
        return table

    # ---- lesson checks ---------------------------------------------------------------------

    def expect(
        self,
        claim: str,
        *conditions: Condition,
        reason: str = "",
        must_hold: bool = False,
        predicted: Prediction = NOT_ASKED,
    ) -> Expectation:
        """Record what the lesson expected, as the conditions it states, each judged on this run's
        figures (servelab.lessons.expectations.condition); `reason` says why it may not hold here.
        `must_hold`: a claim about what the lab's software does, not about speed, which `verdicts`
        reports as a fault of the lab where it did not hold. `predicted`: the student's prediction,
        written before the run (True/False: it holds; or words; None: left empty), shown beside the verdict.
        A prediction in a form the check cannot judge raises a PredictionError saying which form to
        type, and nothing of it is recorded (servelab.lessons.predictions)."""
        return self.expectations.record(claim, conditions, reason, must_hold, predicted)

    def record(self, expectation: Expectation, predicted: Prediction = NOT_ASKED) -> Expectation:
        """Record an expectation a lesson's check built and judged (servelab.lessons), as `expect`
        does, with the student's prediction beside it: a number where the check measures one (its
        `estimate`), shown with the measured number and the error; None where it was left empty. One
        in a form the check cannot judge is refused, as in `expect`."""
        return self.expectations.record(
            expectation.claim,
            expectation.conditions,
            expectation.reason,
            expectation.must_hold,
            predicted,
            expectation.estimate,
        )

    def verdicts(self) -> str:
        """Every expectation of this notebook and its outcome, with each condition's; then the
        check that this session's saved runs are the runs of its table, every field equal, that
        each verdict says what those saved runs say, and that every claim about the lab's software
        held (servelab.lessons.expectations.verdict_problems): a LabFault naming every problem
        where one did not."""
        summary = self.expectations.summary()
        print(summary)
        if problems := verdict_problems(self.expectations, self.results, self.keeper.saved_this_session()):
            raise LabFault(
                f"{self.keeper.notebook}: {len(problems)} problem(s) with its verdicts, each a fault of the lab "
                "(its checks or its software), not a measurement to interpret:\n"
                + "\n".join(f"- {problem}" for problem in problems)
            )
        return summary

    # ---- the web UI -----------------------------------------------------------------------

    def ui(self, backend: str) -> ui.GourmetGram:
        """A GourmetGram in front of `backend`, started for this notebook (locally, or in the Compose
        project's Jupyter container, where a browser reaches the project's own `gourmetgram`
        instead): its URL, printed, with its `upload`."""
        urls = {"fastapi_pt": self.fastapi_urls["pt"], "fastapi_onnx": self.fastapi_urls["onnx"]}
        if self.triton_http:
            urls["triton"] = self.triton_http
        if self.on_compose:
            urls["ray_serve"] = settings().compose("ray_serve_url")
        stack, ports = start_on_free_ports(
            lambda ports: [gourmetgram_service(ports.gourmetgram, backend, Ports.configured(), urls=urls)],
            NOTEBOOK_STACK_DIR / "ui-logs",
        )
        self.keeper.stacks.append(stack)
        atexit.register(stack.stop)
        started = ui.GourmetGram(f"http://127.0.0.1:{ports.gourmetgram}")
        browser = (
            f" (inside the Jupyter container; in your browser, the Compose project's own, in front of fastapi_pt: "
            f"http://127.0.0.1:{settings().port_gourmetgram}/)"
            if self.on_compose
            else ""
        )
        print(f"GourmetGram in front of {backend}: {started}{browser}")
        return started
