"""What notebook 10 and its appendix run: notebook 10's loads, one engine at a time, and what each
server did under them (`Experiment`); the appendix's race probe (`probe_server`,
`cancellation_probe`). Both take the notebook's Lab as an argument (`LabLike`).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from servelab import retries
from servelab.lessons.cancellation.race_checks import RaceProbe
from servelab.lessons.cancellation.views import plot_goodput_and_waste, plot_streams, stream_rows
from servelab.measure import service_stats
from servelab.profiles import Profile
from servelab.results import RunResult, StepCounts
from servelab.triton import stats as triton_stats
from servelab.triton.config import TritonConfig


class StreamRunner(Protocol):
    """What the machinery below uses of the Lab's measurer (servelab.lab.measuring.Measurer)."""

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
    ) -> RunResult: ...

    def closed_loop(
        self,
        address: str,
        concurrency: int,
        duration_s: float,
        name: str,
        kind: str = "fastapi",
        model: str | None = None,
        backoff_s: float = 0.0,
        impatient: int = 0,
        patience_s: float | None = None,
        service_stats: bool = False,
        triton_stats: bool = False,
    ) -> RunResult: ...


class LabLike(Protocol):
    """What the machinery below uses of the notebooks' Lab (servelab.lab.facade.Lab, which this
    layer does not import)."""

    triton: Any  # servelab.lab.triton_side.TritonSide
    measurer: StreamRunner
    keeper: Any  # servelab.lab.run_keeper.RunKeeper: `wait_for_services`
    triton_http: str | None
    triton_grpc: str | None
    profile: Profile

    @property
    def on_compose(self) -> bool: ...

    def hardware(self) -> str: ...


def pacing(alone_ms: float, impatient: int) -> tuple[float, float]:
    """(patience, back-off) in seconds for an engine whose request alone takes `alone_ms` (s): an
    impatient client gives up after s, and the next arrives after the back-off, so that each of the
    `impatient` senders sends one request per 2 s x `impatient`; together, one per 2 s, half of
    what one slot serves."""
    patience_s = alone_ms / 1000
    return patience_s, 2 * impatient * patience_s - patience_s


def wasted_inferences(inferences: float, answered: int) -> float:
    """The inferences a server ran beyond the answers its clients received: computed for nobody
    (never below 0; NaN where the server's count could not be read)."""
    return math.nan if math.isnan(inferences) else max(inferences - answered, 0)


def inferences_computed(triton_stats: dict) -> float:
    """The inferences Triton computed over a run: its successes less the requests its model
    answered CANCELLED, which its statistics count as successes though nothing was computed."""
    return triton_stats["success_count"] - triton_stats["cancelled_by_model"]


@dataclass
class Experiment:
    """Notebook 10's loads, one engine at a time, and what each server did under them.

    Requests: `patient` clients wait for every answer; `impatient` ones give up after the engine's
    latency for a request alone (measured first, for `alone_s`) and come back after a back-off
    (`pacing`), for the profile's duration (at least 6 s). Each run is kept in `runs`, and its
    inferences computed for nobody in `wasted`, by run name.
    Streams: `stream_patient` clients read every one of `steps` steps, `stream_impatient` leave
    after `leave_after` steps and start again, for the profile's duration (at least 3 s); each run
    in `streams`, by (engine, "off" or "on")."""

    lab: LabLike
    patient: int = 4
    impatient: int = 4
    stream_patient: int = 2
    stream_impatient: int = 2
    steps: int = 8
    leave_after: int = 2
    alone_s: float = 3.0
    refine_model: str = "food_refine"
    runs: dict[str, RunResult] = field(default_factory=dict)
    wasted: dict[str, float] = field(default_factory=dict)
    streams: dict[tuple[str, str], RunResult] = field(default_factory=dict)
    _log_start: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # 6 s of impatient clients cancel a hundred and fifty requests or more (240 in 8 s measured at
        # load 10); at 4 s the gRPC waste share missed its mark in one quick run of three (110 of 203):
        # the quick profile's 2 s would give a few dozen.
        self.duration_s = max(self.lab.profile.duration_s, 6)
        self.alone_s = min(self.alone_s, self.lab.profile.duration_s)  # a p50 for pacing: 2 s is ~100 requests
        self.stream_s = max(self.lab.profile.duration_s, 3)
        print(f"The models run on {self.lab.hardware()}.")

    # -- requests --

    def _paced(self, name: str, address: str, kind: str = "fastapi", model: str | None = None) -> tuple[float, float]:
        alone = self.lab.measurer.closed_loop(
            address, 1, self.alone_s, name=f"{name}, 1 client", kind=kind, model=model
        )
        patience_s, backoff_s = pacing(alone.latency.p50_ms, self.impatient)
        print(f"{name}: a request alone {alone.latency.p50_ms:.1f} ms; patience {1000 * patience_s:.0f} ms")
        return patience_s, backoff_s

    def _load(self, name: str, address: str, pace: tuple[float, float], **options: Any) -> RunResult:
        return self.lab.measurer.closed_loop(
            address,
            self.patient + self.impatient,
            self.duration_s,
            name=name,
            impatient=self.impatient,
            patience_s=pace[0],
            backoff_s=pace[1],
            **options,
        )

    def _account(self, name: str, result: RunResult, inferences: float) -> None:
        self.runs[name] = result
        answered = len(result.latencies_ms)
        self.wasted[name] = wasted_inferences(inferences, answered)
        patient = result.patient_latency.p95_ms if result.patient_latency else math.nan
        print(
            f"  {result.cancelled} cancelled by their clients, {answered} answered; the server ran {inferences:.0f}"
            f" inferences: {self.wasted[name]:.0f} for nobody. Patient clients' p95: {patient:.0f} ms"
        )

    def requests(self, name: str, url: str) -> RunResult:
        """The load against the FastAPI service or Ray Serve at `url`, kept as `name`; the
        inferences it ran from its /metrics (for Ray Serve's one replica, the deployment's)."""
        result = self._load(name, url, self._paced(name, url), service_stats=True)
        stats = result.service_stats or {}
        self._account(name, result, stats["stage_counts"].get("inference", 0) if stats else math.nan)
        print(f"  abandoned by the server, by stage: {stats.get('abandoned_by_stage') or 'none'}")
        return result

    def triton_requests(self, protocol: str, model: str) -> RunResult:
        """The load against the lab's Triton over `protocol` ("http" or "grpc"), kept as
        "triton/<model>, <protocol>", with Triton's statistics over it and the requests its model
        answered CANCELLED (from its log: NaN where there is none to read). Measured once more
        if Triton crashed under it (the 2.51 race: notebooks/appendix_triton_crash)."""
        kind, address = f"triton-{protocol}", self.lab.triton_http if protocol == "http" else self.lab.triton_grpc
        assert address is not None, "this notebook connected with Triton"
        name = f"triton/{model}, {protocol}"
        pace = self._paced(name, address, kind, model)
        for attempt in (1, 2):
            result = self._load(name, address, pace, kind=kind, model=model, triton_stats=True)
            if result.clean or attempt == 2:
                break
            print("  Triton crashed during this run (see the appendix): measuring it once more.")
            retries.note(f"the run {name!r}", "Triton crashed under it")  # listed at the end of the test suite too
        stats = result.triton_stats or {}
        self._account(name, result, inferences_computed(stats))
        print(
            f"  Triton failed {stats['fail_count']} cancelled requests before the model; the model answered"
            f" {stats['cancelled_by_model']:.0f} CANCELLED instead of computing them"
        )
        return result

    @contextlib.contextmanager
    def triton_config(self, model: str, config: TritonConfig) -> Iterator[None]:
        """The lab's Triton serves `model` with `config` for the `with` block (the edit is shown as
        a diff), then as shipped again."""
        self.lab.triton.configs.apply_config(model, config)
        try:
            yield
        finally:
            self.lab.triton.configs.restore_config(model)

    # -- streams --

    def _refine_steps_logged(self) -> StepCounts:
        """food_refine's steps since the first Triton stream, from its log lines (NaN: no log)."""
        log: Path | None = self.lab.triton.log()
        if log is None or self._log_start is None:
            return StepCounts(math.nan, math.nan, 0)  # type: ignore[arg-type]
        return triton_stats.refine_steps(triton_stats.log_since(log, self._log_start), self.refine_model)

    def stream(self, engine: str, setting: str, url: str | None = None) -> RunResult:
        """The streamed load, kept as "<engine> /refine, cancellation <setting>": against `url`'s
        POST /refine (FastAPI, Ray Serve), counted by its /metrics; for engine "Triton", against the
        lab's Triton over gRPC (`refine_model`), counted from the model's log lines."""
        if engine == "Triton":
            if self._log_start is None:
                log = self.lab.triton.log()
                self._log_start = log.stat().st_size if log else 0
            assert self.lab.triton_grpc is not None, "this notebook connected with Triton"
            address, kind, model, counter = (
                self.lab.triton_grpc,
                "triton-grpc",
                self.refine_model,
                self._refine_steps_logged,
            )
        else:
            assert url is not None, f"{engine}: the service's URL"
            address, kind, model = url, "fastapi", None

            def counter() -> StepCounts:
                return service_stats.refine_steps(address)

        run = self.lab.measurer.streams(
            address,
            self.stream_patient + self.stream_impatient,
            self.steps,
            self.stream_s,
            f"{engine} /refine, cancellation {setting}",
            counter,
            kind=kind,
            model=model,
            impatient=self.stream_impatient,
            leave_after_steps=self.leave_after,
        )
        self.streams[engine, setting] = run
        steps = run.steps or {}
        print(
            f"  {run.cancelled} streams left after {self.leave_after} steps, {len(run.latencies_ms)} read to the "
            f"last; the server computed {steps['computed']} steps, {steps['for_gone_clients']} for clients who had left"
        )
        if not run.clean:
            print("  A service crashed during this run (its table row says which): its figures are NOT CHECKED.")
        return run

    # -- what the student reads --

    def show_streams(self) -> None:
        """The streams' table (`stream_rows`), then steps computed for clients who left and the
        patient clients' p50, by engine, cancellation off and on."""
        print("\n".join(stream_rows(self.streams)))
        plot_streams(
            self.streams,
            f"{self.stream_patient} patient + {self.stream_impatient} impatient clients, {self.steps} steps, "
            f"leaving after {self.leave_after}",
        )

    def show_goodput_and_waste(self) -> None:
        """Each request run's goodput and its wasted inferences per second, side by side."""
        title = f"{self.patient} patient + {self.impatient} impatient clients, {self.lab.hardware()}"
        plot_goodput_and_waste(self.runs, self.wasted, title)


# ---- the race probe's machinery (the appendix notebook) -----------------------------------------


class ProbeTarget(NamedTuple):
    """The Triton a probe runs against: its addresses (host:port) and its log (None: none to read)."""

    http: str
    grpc: str
    log: Path | None


@contextlib.contextmanager
def probe_server(lab: LabLike, model: str, config: TritonConfig) -> Iterator[ProbeTarget]:
    """A Triton serving `model` with `config` for the `with` block: locally a private one serving
    the model alone, so that the lab's server is never crashed on purpose; in the Compose project
    the project's own, configured alike and restored after (Docker restarts it if it crashes)."""
    if not lab.on_compose:
        with lab.triton.private_triton(model, config) as own:
            yield ProbeTarget(own.http, own.grpc, own.log)
        return
    assert lab.triton_http is not None and lab.triton_grpc is not None, "the Compose project runs Triton"
    lab.triton.configs.apply_config(model, config)
    try:
        yield ProbeTarget(lab.triton_http, lab.triton_grpc, lab.triton.log())
    finally:
        lab.triton.configs.restore_config(model)


PROBE_RUN_S = 2.0  # one run of a probe: a crash ends the probe at the end of its run


def cancellation_probe(
    lab: LabLike,
    triton: ProbeTarget,
    model: str,
    name: str,
    clients: int,
    impatient: int,
    pace: tuple[float, float],
    probe_s: float,
) -> RaceProbe:
    """`clients` gRPC clients, `impatient` of them giving up at `pace` (patience, back-off), against
    `triton` with its verbose log on, in runs of PROBE_RUN_S until it crashes or `probe_s` pass: the
    cancellations, the steps at which the server handled them (from its log), and the crash, or the
    hang (the same race can deadlock the server instead: it stops answering)."""
    log_start = triton.log.stat().st_size if triton.log else 0
    lab.triton.configs.log_verbosity(1, triton.http)
    cancelled, crash, begun = 0, None, time.monotonic()
    while crash is None and time.monotonic() - begun < probe_s:
        run = lab.measurer.closed_loop(
            triton.grpc,
            clients,
            PROBE_RUN_S,
            name=name,
            kind="triton-grpc",
            model=model,
            impatient=impatient,
            patience_s=pace[0],
            backoff_s=pace[1],
        )
        cancelled += run.cancelled
        crash = run.interrupted_by[0] if run.interrupted_by else None
    lab.keeper.wait_for_services()
    try:
        lab.triton.configs.log_verbosity(0, triton.http)  # a server restarted after a crash is back at 0 already
    except TimeoutError:
        crash = crash or "hung: it stopped answering"
    steps = triton_stats.cancellation_steps(triton_stats.log_since(triton.log, log_start)) if triton.log else {}
    return RaceProbe(cancelled, steps, crash)
