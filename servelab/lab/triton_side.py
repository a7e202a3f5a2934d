"""The lab's Triton (`lab.triton`): perf_analyzer runs, each kept by the run keeper
(servelab.lab.run_keeper), capacity and the rates scaled to it, and a Triton of the notebook's
own for one model (`private_triton`). Its served configs are a part of their own, which the
notebooks call directly (`lab.triton.configs.apply_config(...)`, servelab.lab.triton_configs).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from servelab import paths, retries
from servelab.lab.run_accounts import TritonAccount, counted
from servelab.lab.run_keeper import RunKeeper
from servelab.lab.triton_configs import ServedConfigs
from servelab.measure.processes import ProcessCpu, triton_instance_processes
from servelab.measure.resources import ResourceSampler
from servelab.profiles import Profile
from servelab.report.summaries import listed
from servelab.results import RunResult
from servelab.settings import settings
from servelab.stack.catalogue import triton_service
from servelab.stack.supervision import Ports, ServiceSpec, start_on_free_ports
from servelab.triton import perf_analyzer, typed_command
from servelab.triton import server as triton_local
from servelab.triton.config import TritonConfig

# Where a notebook's own services keep their staged files and logs while they run.
NOTEBOOK_STACK_DIR = paths.STACK_DIR / "notebook-stack"


class ServiceCrashed(RuntimeError):
    """A measurement failed because a service of the lab crashed under it; the message says which."""


# perf_analyzer's --stability-percentage in the lab's runs: three windows in a row agree within
# it. Its default, 10, is rarely met on a shared machine whose speed drifts between windows.
STABILITY = 50


@dataclass(frozen=True)
class Capacity:
    """What a model in one configuration can do, measured once (see TritonSide.capacity)."""

    model: str
    configuration: str
    alone: RunResult  # one client at a time
    saturated: RunResult  # enough clients to keep every instance busy

    @property
    def rps(self) -> float:
        return self.saturated.throughput_rps

    @property
    def service_time_s(self) -> float:
        """S = 1 / capacity: the server's time per request when it is never idle."""
        return 1 / self.rps

    @property
    def service_cv2(self) -> float:
        """How much a request's time varies: the squared coefficient of variation (variance /
        mean^2) of the latencies of requests alone. 0 is a constant service time (M/D/1)."""
        return (self.alone.latency.std_ms / self.alone.latency.mean_ms) ** 2

    def __str__(self) -> str:
        return (
            f"{self.model} ({self.configuration}): capacity {self.rps:.1f} req/s, so S = 1/capacity = "
            f"{self.service_time_s * 1000:.1f} ms; alone, a request takes {self.alone.latency.mean_ms:.1f} ms "
            f"on average, with a squared coefficient of variation of {self.service_cv2:.2f}"
        )


@dataclass(frozen=True)
class TritonAddresses:
    """Where a Triton server answers, and its log where this notebook can read it (else None)."""

    http: str  # host:port
    grpc: str
    log: Path | None


# The share of the measured capacity the highest scaled rate offers. Near saturation yet below
# it: at 90% an M/D/1 queue's mean wait is 4.5 service times, a queue for the batching checks to
# judge, while a rate at or above capacity grows the queue for as long as the run lasts, so that
# what its latency measures is the run's length.
TOP_LOAD = 0.9
# Significant figures the scaled rates are rounded to (more where that would make two alike).
RATE_DIGITS = 3


def rates_at_capacity(reference: list[float], capacity_rps: float, top_load: float = TOP_LOAD) -> list[float]:
    """`reference` rates scaled so that the highest is `top_load` of `capacity_rps`, each keeping its
    share of the highest; rounded to RATE_DIGITS significant figures of the highest, or to as many
    more decimals as keep distinct rates distinct and above zero (a slow CPU's rates are fractions
    of a request per second)."""
    if not reference or min(reference) <= 0 or capacity_rps <= 0:
        raise ValueError(f"Rates and a capacity must be positive: rates {reference}, capacity {capacity_rps}.")
    exact = [rate * top_load * capacity_rps / max(reference) for rate in reference]
    decimals = RATE_DIGITS - 1 - math.floor(math.log10(max(exact)))
    while len(set(rates := [round(rate, decimals) for rate in exact])) < len(set(reference)) or 0 in rates:
        decimals += 1
    return [float(rate) for rate in rates]


@dataclass
class TritonSide:
    """The lab's Triton: perf_analyzer runs kept by `keeper`, capacity, and the served configs (`configs`)."""

    keeper: RunKeeper  # keeps each run, and says when the server is ready to measure
    configs: ServedConfigs  # its address, repository, hardware and models, and what it serves
    profile: Profile  # its perf_analyzer measurement window
    grpc: str | None = None  # the lab's Triton over gRPC, host:port
    metrics_url: str | None = None  # its Prometheus metrics, http://host:port/metrics
    _capacities: dict[tuple[str, str], Capacity] = field(default_factory=dict, repr=False)

    # ---- runs -----------------------------------------------------------------------------------

    def account(self, model: str) -> TritonAccount:
        """What counts Triton's statistics of `model` over a run, the requests it answered CANCELLED, and
        the time the model spent in each of its own stages (where it reports them)."""
        return TritonAccount(self.configs.address, model, self.log(), self.metrics_url)

    def run_perf_analyzer(
        self,
        model: str,
        started: float,
        concurrency: int | None = 1,
        batch_size: int = 1,
        rate: float | None = None,
        distribution: str = "constant",
        **options,
    ) -> RunResult:
        """One perf_analyzer run; a failure because Triton crashed under it (the supervisor saw it
        exit after `started`) is a ServiceCrashed, which says so."""
        model_input = self.configs.models.get(model).perf_analyzer_input(paths.SAMPLE_IMAGE.read_bytes(), paths.LAB_DIR)
        try:
            return perf_analyzer.run(
                self.configs.address,
                model,
                concurrency=None if rate else concurrency,
                request_rate=rate,
                request_distribution=distribution,
                batch_size=batch_size,
                measurement_interval_ms=self.profile.perf_window_ms,
                stability_percentage=STABILITY,
                max_trials=5,
                timeout_s=600,
                **{**model_input, **options},
            ).results[0]
        except perf_analyzer.PerfAnalyzerError as failed:
            if isinstance(failed, perf_analyzer.NoStableMeasurement):
                raise
            if not (crashes := self.keeper.crashed_since(started)):
                raise
            raise ServiceCrashed(f"perf_analyzer failed because {crashes[0].describe()}") from failed

    def perf(self, model: str, attempts: int = 2, triton_stats: bool = False, **load) -> RunResult | None:
        """perf_analyzer against Triton, with this profile's measurement windows; `load` goes to
        `run_perf_analyzer` (concurrency, rate, batch_size, ...; perf_analyzer's options such as
        shape=[...] or sequence_length override the model's defaults). Tried up to `attempts` times
        while perf_analyzer finds no stable measurement or Triton crashed under it (locally, the stack
        restarts it; the next attempt waits for it); None (said in the output) when no attempt gave a
        number: a notebook's other runs go on. Any other failure raises. The result's name gives the
        model's configuration (instances, dynamic batching), so runs under different
        configurations stay apart. The machine is sampled during the run (`result.resources`),
        with the CPU of each of the model's instance processes where this machine runs them; with
        `triton_stats`, Triton's statistics of `model` over the run are in `result.triton_stats`."""
        accounts = [self.account(model)] if triton_stats else []
        for attempt in range(1, attempts + 1):
            started = self.keeper.ready_to_measure()
            try:
                result = counted(functools.partial(self._sampled_perf_analyzer, model, started, **load), accounts)
                break
            except (perf_analyzer.NoStableMeasurement, ServiceCrashed) as failed:
                why = failed.meaning if isinstance(failed, perf_analyzer.NoStableMeasurement) else str(failed)
                print(f"{model} {load}: {why} (attempt {attempt} of {attempts}).")
                if attempt < attempts:
                    retries.note(f"perf_analyzer against {model} {load}", why)
        else:
            print(f"{model} {load}: perf_analyzer gave up every time, so this run has no result.")
            return None
        return self.keeper.keep(result, f"{result.name}, {self.configuration(model)}", started)

    def perf_typed(self, line: str) -> list[RunResult]:
        """A perf_analyzer command line as a student types it (`run_typed`), for a notebook's cell: a
        line the lab will not run, or perf_analyzer's own failure, is printed with what to change,
        and gives no run, so the cell needs no error handling of its own. Where the answers must run
        (LAB_ANSWERS_MUST_RUN, the tests' setting), the failure is raised instead: a broken answer fails
        its notebook in CI. Windows that never agreed are measured once more first, as the lab's own
        runs are (`perf`)."""
        try:
            try:
                return self.run_typed(line)
            except perf_analyzer.NoStableMeasurement as unsettled:
                print(f"perf_analyzer: {unsettled.meaning}; measuring once more.")
                retries.note(f"the typed line {line!r}", unsettled.meaning)
                return self.run_typed(line)
        except typed_command.TypedCommandError as refused:
            said = f"Not run: {refused}"
            failure: Exception = refused
        except perf_analyzer.PerfAnalyzerError as failed:  # an option it does not know, no stable measurement...
            said = f"perf_analyzer gave no number; change the line and run the cell again:\n{failed}"
            failure = failed
        except subprocess.TimeoutExpired as late:
            said = f"perf_analyzer ran past {late.timeout:g} s and was stopped: ask for fewer requests or windows."
            failure = late
        if settings().answers_must_run:
            raise RuntimeError(f"The answer typed gave no run (LAB_ANSWERS_MUST_RUN is on): {said}") from failure
        print(said)
        return []

    def run_typed(self, line: str) -> list[RunResult]:
        """A perf_analyzer command line as typed (servelab.triton.typed_command): run against the
        lab's Triton, with the model's input data (the sample photo) and the lab's stability
        percentage (STABILITY) where the line gives none, its output printed as perf_analyzer wrote
        it, and each load level of its report kept as a run. A line the lab will not run raises
        TypedCommandError saying what to change; perf_analyzer's own failure raises with its message."""
        models = self.configs.models
        sequence_models = [model.name for model in models if model.stateful]
        typed = typed_command.parse(line, models.names(), sequence_models)
        if self.configs.http is None or (typed.protocol == "grpc" and self.grpc is None):
            raise RuntimeError(f"This notebook has no Triton over {typed.protocol}: connect with Lab.connect().")
        if not {"--input-data", "--shape"} & {word.partition("=")[0] for word in typed.arguments}:
            data = models.get(typed.model).perf_analyzer_input(paths.SAMPLE_IMAGE.read_bytes(), paths.LAB_DIR)
            if "input_data" in data:
                given = [*typed.arguments, "--input-data", str(data["input_data"])]
                typed = dataclasses.replace(typed, arguments=given)
        typed_options = {word.partition("=")[0] for word in typed.arguments}
        if not {"-s", "--stability-percentage"} & typed_options:
            typed = dataclasses.replace(typed, arguments=[*typed.arguments, "--stability-percentage", f"{STABILITY:g}"])
            print(
                f"The lab added --stability-percentage {STABILITY:g}, as in its own runs: perf_analyzer's default, "
                "10, is rarely met on a shared machine (type your own to set it)."
            )
        started = self.keeper.ready_to_measure()
        measured = typed_command.run(typed, self.configs.http, self.grpc or "", timeout_s=600)
        print(measured.stdout)
        return [self.keeper.keep(result, result.name, started) for result in measured.results]

    def _sampled_perf_analyzer(self, model: str, started: float, **load) -> RunResult:
        """`run_perf_analyzer`, with the machine sampled during the run and the CPU of each of the
        model's instance processes where this machine runs them (`result.resources`)."""
        instances = self.instance_processes(model)  # after a restart, new processes
        with ResourceSampler(pids=instances.values()) as sampler, ProcessCpu(instances) as per_instance:
            result = self.run_perf_analyzer(model, started, **load)
        result.resources = {**sampler.series(), "processes": per_instance.percent}
        return result

    def configuration(self, model: str) -> str:
        """The served configuration in a few words: "4 instances, dynamic batching"."""
        count = self.configs.served_instances(model)
        batching = ", dynamic batching" if "dynamic_batching" in self.configs.served_config(model) else ""
        return f"{count} instance{'s' if count != 1 else ''}{batching}"

    def log(self) -> Path | None:
        """Triton's log file, where the models log too. Locally, the stack's; in the Compose project,
        the copy the Triton container writes beside its repository, in the volume this container
        mounts (None until there is one)."""
        if self.keeper.on_compose:
            repository = self.configs.repository
            assert repository is not None, "the Compose project's Triton loads the shared volume's repository"
            copy = repository.parent / "triton.log"
            return copy if copy.is_file() else None
        for stack in self.keeper.stacks:
            for process in stack.processes:
                if process.spec.name == "triton":
                    return process.log_path
        return paths.LOG_DIR / "triton.log"  # the stack of `make up`

    def instance_processes(self, model: str) -> dict[str, int]:
        """The processes of `model`'s instances (name -> pid), where this notebook can see them: on
        this machine locally; in the Compose project they run in the Triton container, out of sight.
        Only a Python-backend model's instances are processes (locally, the ONNX models run in the
        Python backend too), which are what this finds; another backend's are threads of Triton's
        own process: none."""
        if self.keeper.on_compose or self.configs.repository is None:
            return {}
        return triton_instance_processes(self.configs.repository, model)

    def capacity(self, model: str) -> Capacity:
        """What `model`, as served now, can do: measured once per configuration, then reused, so
        that rate scaling, queueing models and text all use the same figure.

        One client at a time gives the latency of a request alone and how much it varies; enough
        clients to keep every instance busy give the capacity (requests per second), whose
        inverse is the service time S the queueing models use. Both are measured with
        perf_analyzer, the tool of the open-loop runs they are compared with: the client shares
        the machine with the server, and another client would load it differently.
        """
        configuration = self.configuration(model)
        if (model, configuration) not in self._capacities:
            alone = self.perf(model, concurrency=1)
            saturated = self.perf(model, concurrency=4 * self.configs.served_instances(model))
            if alone is None or saturated is None:
                raise RuntimeError(f"No stable capacity measurement of {model}: run this cell again.")
            self._capacities[(model, configuration)] = Capacity(model, configuration, alone, saturated)
        capacity = self._capacities[(model, configuration)]
        print(capacity)
        return capacity

    def scale_rates(self, reference: list[float], capacity: Capacity) -> list[float]:
        """`reference`, the request rates of an experiment written for one machine (the original
        lab's: one ONNX instance on one P100, GPU 0), as the same shares of `capacity`, the capacity measured in this
        run, the highest at TOP_LOAD of it: the experiment keeps its shape (light load to near
        saturation) on a CPU and on any GPU. Prints what it did, from the run's own figures."""
        rates = rates_at_capacity(reference, capacity.rps)
        as_written = [rate / capacity.rps for rate in reference]
        written, scaled = listed([f"{rate:g}" for rate in reference]), listed([f"{rate:g}" for rate in rates])
        shares = listed([f"{rate / capacity.rps:.0%}" for rate in rates])
        print(
            f"The rates {written} req/s were written for the original lab's one ONNX instance on one P100. "
            f"Here {capacity.model} ({capacity.configuration}) runs on {self.configs.served_on(capacity.model)} "
            f"of a Triton server with {self.configs.server.describe()}, and its capacity measured in this run is "
            f"{capacity.rps:.1f} req/s: as written, the rates would offer {min(as_written):.0%} to "
            f"{max(as_written):.0%} of it. Scaled to keep their shares of the highest, with the highest at "
            f"{TOP_LOAD:.0%} of that capacity, they are {scaled} "
            f"req/s ({shares} of it)."
        )
        return rates

    @contextlib.contextmanager
    def private_triton(self, model: str, config: TritonConfig) -> Iterator[TritonAddresses]:
        """A Triton of this notebook's own serving `model` alone, with `config` (adapted to this
        machine as the lab's is), on free ports, for the `with` block. Its stack's supervisor
        restarts it after a crash, and a run against it is marked as the lab's are. Local services
        only: the Compose project's Jupyter container has no Triton to start."""
        if self.keeper.on_compose:
            raise RuntimeError(
                "A private Triton runs with local services only (LAB_SERVICES=local): the Jupyter container "
                "has no Triton."
            )
        work = NOTEBOOK_STACK_DIR / f"private-triton-{os.getpid()}"

        def services(ports: Ports) -> list[ServiceSpec]:
            spec = dataclasses.replace(triton_service(ports.triton, work_dir=work, load=[model]), name="private_triton")
            served = triton_local.served_config(self.configs.models.get(model), config, work / "models" / model)
            (work / "models" / model / "config.pbtxt").write_text(served.text)
            return [spec]

        print(f"Starting a Triton of this notebook's own, serving {model} alone...")
        stack, ports = start_on_free_ports(services, work / "logs")
        with stack, self.keeper.watching(stack):  # its crashes are seen like those of the lab's services
            yield TritonAddresses(
                f"127.0.0.1:{ports.triton_http}", f"127.0.0.1:{ports.triton_grpc}", stack.processes[0].log_path
            )
        shutil.rmtree(work, ignore_errors=True)
