"""Notebook 9's checks: requests and streams whose client has left; the appendix's check of
Triton 2.51's cancellation race; and the machinery of both, below the checks (`Experiment`, the
race probe), which takes the notebook's Lab as an argument (`LabLike`).

Every condition about what the server did for clients who left needs some to have left: where
none did in a run (nothing cancelled), it is NOT CHECKED, with that reason, rather than held on
0 >= 0 or failed on 0 < 0.

The requests (`runs` of the notebook): patient and impatient clients against one server, where
`cancelled` counts the requests whose client gave up and `wasted` (computed by the notebook) the
inferences the server ran beyond the answers the clients got: computed for nobody.

The streams: each engine is measured twice under the same load (servelab.loadgen.streams): patient clients
that read every step, impatient ones that leave after `leave_after_steps` of the `asked` steps;
once with cancellation off, once on. A run's `steps` hold what the server itself counted over it
(`for_gone_clients`: steps that ended after their client had left), its `cancelled` the streams
whose client left, its `patient_latency` the patient clients' time to their last step.
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
from servelab.lessons.expectations import (
    Condition,
    Expectation,
    Figure,
    condition,
    figure,
    measured,
    not_checked,
    unless,
)
from servelab.measure import service_stats
from servelab.profiles import Profile
from servelab.results import RunResult, StepCounts
from servelab.triton import stats as triton_stats
from servelab.triton.config import TritonConfig

# With cancellation on, what a client who left may still cost: the step running when it left, and
# one more while the news travels (the proxy's cancel to a Ray Serve replica, say).
STEPS_AFTER_LEAVING = 2


def _left(run: RunResult | None, case: str) -> Figure:
    return figure(run, "cancelled", f"cancelled, {case}")


def _if_some_left(left: Figure, case: str, judged: Condition) -> Condition:
    """`judged` where some client left in the run of `left`; else NOT CHECKED, saying so."""
    return unless(
        not left.value == 0, f"no client left {case}: there was nothing to cancel, so nothing to judge", judged
    )


def _computed_for_nobody(run: RunResult | None, wasted: float, case: str) -> Condition:
    """The run wasted at least half as many inferences as its clients cancelled."""
    left = _left(run, case)
    return _if_some_left(left, case, condition(
        f"{case}, wasted inferences are at least half the cancelled requests",
        wasted >= left.value / 2,
        measured(f"wasted inferences, {case}", wasted),
        left,
    ))  # fmt: skip


def waste_without_cancellation(off: RunResult, on: RunResult, wasted_off: float) -> Expectation:
    """FastAPI with abandoning off (`off`) against on (`on`), the same clients: with it off, the
    wasted inferences are at least half the cancelled requests; the patient clients' p95 is higher
    and the goodput lower than with it on. Each NOT CHECKED where no client left in a run it reads:
    then the two runs are the same setting, and differ by noise."""
    left_off, left_on = _left(off, "with abandoning off"), _left(on, "with abandoning on")
    both = measured("cancelled in the run with fewer", min(left_off.value, left_on.value))
    patient_off = figure(off, "patient_latency.p95_ms", "patient p95, off")
    patient_on = figure(on, "patient_latency.p95_ms", "patient p95, on")
    return Expectation(
        "without cancellation, the server computes answers nobody reads, and the patient clients pay",
        (
            _computed_for_nobody(off, wasted_off, "with abandoning off"),
            _if_some_left(
                both,
                "in one of the two runs",
                condition(
                    "the patient clients' p95 is higher with it off than on",
                    patient_off.value > patient_on.value,
                    patient_off,
                    patient_on,
                ),
            ),
            _if_some_left(
                both,
                "in one of the two runs",
                condition(
                    "the goodput is lower with it off than on",
                    off.throughput_rps < on.throughput_rps,
                    figure(off, "throughput_rps", "goodput, off"),
                    figure(on, "throughput_rps", "goodput, on"),
                ),
            ),
        ),  # fmt: skip
    )


def abandoning_cuts_the_waste(off: RunResult, on: RunResult, wasted_off: float, wasted_on: float) -> Expectation:
    """With abandoning on, the waste is under a quarter of the waste with it off, and the server
    (its /metrics over the run: `service_stats["abandoned_by_stage"]`) abandons at least half the
    cancelled requests before the model. NOT CHECKED where nothing was wasted with it off (no
    waste to cut), or no client left with it on."""
    abandoned = sum((on.service_stats or {}).get("abandoned_by_stage", {}).values()) if on.service_stats else math.nan
    waste_off = measured("wasted inferences, with abandoning off", wasted_off)
    left_on = _left(on, "with abandoning on")
    return Expectation(
        "with abandoning on, the waste falls to the inferences already running when their client left",
        (
            unless(
                not wasted_off == 0,
                "nothing was wasted with abandoning off: there was no waste to cut",
                condition(
                    "the waste is under a quarter of the waste with it off",
                    wasted_on < wasted_off / 4,
                    measured("wasted inferences, with abandoning on", wasted_on),
                    waste_off,
                ),
            ),
            _if_some_left(
                left_on,
                "with abandoning on",
                condition(
                    "the server abandons at least half the cancelled requests before the model",
                    abandoned >= left_on.value / 2,
                    measured("abandoned by the server", abandoned),
                    left_on,
                ),
            ),
        ),  # fmt: skip
    )


def triton_cancels_over_grpc(http: RunResult, grpc: RunResult, wasted_http: float, wasted_grpc: float) -> Expectation:
    """Triton over HTTP computes for clients who left (waste at least half the cancelled); over
    gRPC the cancels reach it: at least half the cancelled requests are never computed (failed
    before the model, or answered CANCELLED by it), and the waste is under a quarter of the
    cancelled. Each NOT CHECKED where no client left in its run."""
    left = _left(grpc, "gRPC")
    stats = grpc.triton_stats or {}
    return Expectation(
        "Triton over HTTP computes for clients who left; over gRPC the cancels reach it",
        (
            _computed_for_nobody(http, wasted_http, "over HTTP"),
            _if_some_left(
                left,
                "over gRPC",
                condition(
                    "over gRPC, at least half the cancelled requests are never computed",
                    stats.get("fail_count", math.nan) + stats.get("cancelled_by_model", math.nan) >= left.value / 2,
                    figure(grpc, "triton_stats.fail_count", "failed before the model, gRPC"),
                    figure(grpc, "triton_stats.cancelled_by_model", "answered CANCELLED by the model, gRPC"),
                    left,
                ),
            ),
            _if_some_left(
                left,
                "over gRPC",
                condition(
                    "over gRPC, the waste is under a quarter of the cancelled requests",
                    wasted_grpc < left.value / 4,
                    measured("wasted inferences, gRPC", wasted_grpc),
                    left,
                ),
            ),
        ),  # fmt: skip
    )


def ray_drops_gone_requests(ray: RunResult, wasted: float) -> Expectation:
    """Ray Serve's waste is under a quarter of the cancelled requests; NOT CHECKED where no
    client left."""
    left = _left(ray, "Ray Serve")
    return Expectation(
        "Ray Serve drops the requests of clients who left",
        (
            _if_some_left(
                left,
                "from Ray Serve",
                condition(
                    "its waste is under a quarter of the cancelled requests",
                    wasted < left.value / 4,
                    measured("wasted inferences, Ray Serve", wasted),
                    left,
                ),
            ),
        ),  # fmt: skip
    )


def stream_stops_at_the_next_step(engine: str, off: RunResult | None, on: RunResult | None) -> Expectation:
    """Three conditions, each judged on its own figures:

    1. cancellation off: the steps computed for clients who left are at least half of the steps
       they left behind (streams left x (asked - leave_after_steps)): the server went on for nobody;
    2. cancellation on: at most STEPS_AFTER_LEAVING steps per client who left;
    3. the patient clients get their last step sooner with it on (p50).

    Each NOT CHECKED where no client left in a run it reads.
    """
    wasted_off = figure(off, "steps.for_gone_clients", f"steps for clients who left, {engine}, off")
    left_off = figure(off, "cancelled", f"streams left, {engine}, off")
    asked = figure(off, "steps.asked", "steps asked per stream")
    seen = figure(off, "steps.leave_after_steps", "steps an impatient client read")
    wasted_on = figure(on, "steps.for_gone_clients", f"steps for clients who left, {engine}, on")
    left_on = figure(on, "cancelled", f"streams left, {engine}, on")
    patient_off = figure(off, "patient_latency.p50_ms", f"patient p50 to the last step, {engine}, off")
    patient_on = figure(on, "patient_latency.p50_ms", f"patient p50 to the last step, {engine}, on")
    left_behind = left_off.value * (asked.value - seen.value)
    answers = {name: len(run.latencies_ms) if run else 0 for name, run in (("off", off), ("on", on))}
    return Expectation(
        f"{engine}: a stream whose client left stops at the next step, and the patient clients gain",
        (
            _if_some_left(
                left_off,
                "with cancellation off",
                condition(
                    "with cancellation off, the steps computed for clients who left are at least half of the steps "
                    "they left behind",
                    wasted_off.value >= left_behind / 2,
                    wasted_off,
                    left_off,
                    asked,
                    seen,
                    detail=f"{wasted_off.value / left_off.value:.1f} per client who left" if left_off.value else "",
                ),
            ),
            _if_some_left(
                left_on,
                "with cancellation on",
                condition(
                    f"with it on, at most {STEPS_AFTER_LEAVING} steps per client who left",
                    wasted_on.value <= STEPS_AFTER_LEAVING * left_on.value,
                    wasted_on,
                    left_on,
                    detail=f"{wasted_on.value / left_on.value:.2f} per client who left" if left_on.value else "",
                ),
            ),
            _if_some_left(
                measured("streams left, in the run with fewer", min(left_off.value, left_on.value)),
                "in one of the two runs",
                condition(
                    "the patient clients get their last step sooner with it on (p50)",
                    patient_on.value < patient_off.value,
                    patient_on,
                    patient_off,
                    detail=f"{patient_on.value / patient_off.value:.2f}x" if patient_off.value else "",
                ),
            ),
        ),
        reason=(
            f"the patient clients completed {answers['off']} streams with cancellation off and {answers['on']} with "
            "it on: on a busy machine, the median of so few moves by more than the steps saved; and a server "
            "that reads a disconnect late (a busy event loop) computes more steps after it than it would alone"
        ),
    )


# ---- Triton's cancellation race (the appendix notebook, appendix_triton_crash) ------------------

# The steps of Triton's verbose log at which a cancellation is handled as its answer completes.
AS_THE_ANSWER_COMPLETES = ("COMPLETE", "FINISH")


@dataclass(frozen=True)
class RaceProbe:
    """What one deadline of the race probe saw: the requests its clients gave up (`cancelled`),
    the step at which the server handled each cancellation, read from its verbose log (`steps`:
    START, ISSUED, COMPLETE, FINISH; empty where there was no log to read), and the crash (or hang)
    that ended it, if any."""

    cancelled: int
    steps: dict[str, int] = field(default_factory=dict)
    crash: str | None = None

    @property
    def handled(self) -> int:
        return sum(self.steps.values())

    @property
    def near(self) -> int:
        """Cancellations handled as their answer completed."""
        return sum(self.steps.get(step, 0) for step in AS_THE_ANSWER_COMPLETES)

    @property
    def near_share(self) -> float:
        return self.near / self.handled if self.handled else math.nan

    @property
    def crashed(self) -> bool:
        return self.crash is not None


def _share_noise(one: RaceProbe, other: RaceProbe) -> float:
    """Twice the standard error of the difference of the two shares handled as the answer
    completed, were both drawn from the same share (their pooled one): how far apart two probes of
    one deadline may land by chance, with as few cancellations as these handled."""
    pooled = (one.near + other.near) / (one.handled + other.handled)
    return 2 * math.sqrt(pooled * (1 - pooled) * (1 / one.handled + 1 / other.handled))


def _no_cancellation(probes: dict[str, RaceProbe], logged: bool) -> str:
    """Why a deadline's probe says nothing of the race, or "" where each had cancellations (and,
    where `logged`, some the server's log shows handled)."""
    for deadline, probe in probes.items():
        if not probe.cancelled:
            return f"no client gave up {deadline} (0 cancelled): there was no cancellation to race"
        if logged and not probe.handled:
            return (
                f"the server's log shows none of the {probe.cancelled} cancellations {deadline} handled (no "
                "verbose log to read): a share of nothing says nothing"
            )
    return ""


def triton_cancellation_race(
    alone: RunResult,
    lesson: RaceProbe,
    at_s: RaceProbe,
    version: tuple[int, ...],
    fixed_in: tuple[int, ...],
    probe_s: float,
    cores: int,
) -> Expectation:
    """Triton's gRPC cancellation race (fixed in `fixed_in`), probed at two deadlines on a Triton
    of `version`: the lesson's (`lesson`: clients giving up while patient ones are queued ahead of
    them) and the service time (`at_s`: two clients alone, giving up after the latency of a
    request alone, `alone`'s median, as their answer is often being completed). Three conditions:

    1. at the service time, a larger share of the cancellations is handled as the answer completes
       (COMPLETE or FINISH) than at the lesson's deadline, by more than twice the standard error of
       the two shares (`_share_noise`); the wrong outcome: the deadlines reach the server at the same
       steps, so the probe's contrast, which the race needs, is not there;
    2. with the race (`version` < `fixed_in`), the server crashed or hung at the service time;
       with the fix, it did not; the wrong outcome: the race missed within `probe_s`, or a fixed
       release crashed all the same;
    3. it did not crash at the lesson's deadline; the wrong outcome: the lesson's own deadline
       crashes the server too.

    Each is NOT CHECKED where the deadlines it reads saw no cancellation (0 cancelled; for the
    shares, also none handled in the server's log): then the shares are meaningless, and no crash
    says nothing of the race."""
    has_race = tuple(version) < tuple(fixed_in)
    deadlines = {"at the service time": at_s, "at the lesson's deadline": lesson}
    shares = [
        measured(f"share as the answer completed, {deadline}", 100 * probe.near_share, "%")
        for deadline, probe in deadlines.items()
    ]
    handled = [measured(f"cancellations handled, {deadline}", probe.handled) for deadline, probe in deadlines.items()]
    noise = _share_noise(at_s, lesson) if at_s.handled and lesson.handled else math.nan
    difference = at_s.near_share - lesson.near_share

    def if_cancelled(probes: dict[str, RaceProbe], judged: Condition, logged: bool = False) -> Condition:
        why = _no_cancellation(probes, logged)
        return not_checked(judged.text, why, *judged.figures) if why else judged

    crashes = {deadline: measured(f"crashes {deadline}", probe.crashed) for deadline, probe in deadlines.items()}
    cancelled = {deadline: measured(f"cancelled {deadline}", probe.cancelled) for deadline, probe in deadlines.items()}
    return Expectation(
        f"Triton {'.'.join(map(str, version))}: cancellations handled as their answer completes "
        + ("race, and crash the server" if has_race else "no longer crash the server (the fix)"),
        (
            if_cancelled(
                deadlines,
                condition(
                    "at the service-time deadline, a larger share of cancellations is handled as the answer "
                    "completes, by more than twice the standard error of the two shares",
                    difference > noise,
                    *shares,
                    *handled,
                    detail=f"{100 * difference:+.1f} points, against {100 * noise:.1f} of noise",
                ),
                logged=True,
            ),
            if_cancelled(
                {"at the service time": at_s},
                condition(
                    "the server crashed (or hung) at the service-time deadline"
                    if has_race
                    else "it did not crash at the service time",
                    at_s.crashed == has_race,
                    crashes["at the service time"],
                    cancelled["at the service time"],
                    figure(alone, "latency.p50_ms", "a request alone: the service-time deadline"),
                ),
            ),
            if_cancelled(
                {"at the lesson's deadline": lesson},
                condition(
                    "it did not crash at the lesson's deadline",
                    not lesson.crashed,
                    crashes["at the lesson's deadline"],
                    cancelled["at the lesson's deadline"],
                ),
            ),
        ),
        reason=(
            "a hypothesis, not measured here: the race needs an answer to be completed inside the moment a "
            "cancellation waits for the server's gRPC thread, which depends on how busy this machine's "
            f"{cores} core(s) are, so within {probe_s:g} s it can miss, or hit the lesson's deadline too "
            f"({at_s.cancelled} and {lesson.cancelled} cancelled at the service time and the lesson's deadline)"
        ),
    )


# ---- the notebooks' machinery: the loads, and what each server did under them ------------------


class LabLike(Protocol):
    """What the machinery below uses of the notebooks' Lab (servelab.lab.facade.Lab, which this
    layer does not import)."""

    triton: Any  # servelab.lab.triton_side.TritonSide
    triton_http: str | None
    triton_grpc: str | None
    profile: Profile

    @property
    def on_compose(self) -> bool: ...

    def hardware(self) -> str: ...

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

    def wait_for_services(self) -> None: ...


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


def stream_rows(streams: dict[tuple[str, str], RunResult]) -> list[str]:
    """The streams' table, a line each: per engine and setting, the streams whose client left,
    the steps computed and those for clients who left (in all, and per client who left), and the
    patient clients' p50 / p95 to their last step."""
    rows = [
        f"{'engine':>9} | {'cancellation':>12} | {'streams left':>12} | {'steps computed':>14} | "
        f"{'for clients who left':>20} | {'per client who left':>19} | patient p50 / p95 to the last step"
    ]
    engines = dict.fromkeys(engine for engine, _ in streams)
    for engine, setting in [(engine, setting) for engine in engines for setting in ("off", "on")]:
        if (run := streams.get((engine, setting))) is None:
            continue
        steps = run.steps or {}
        per_client = steps["for_gone_clients"] / run.cancelled if run.cancelled else math.nan
        patient = run.patient_latency
        p50, p95 = (patient.p50_ms, patient.p95_ms) if patient else (math.nan, math.nan)
        rows.append(
            f"{engine:>9} | {setting:>12} | {run.cancelled:>12} | {steps['computed']:>14} | "
            f"{steps['for_gone_clients']:>20} | {per_client:>19.2f} | "
            f"{p50:.0f} / {p95:.0f} ms ({len(run.latencies_ms)} streams)"
        )
    return rows


@dataclass
class Experiment:
    """Notebook 9's loads, one engine at a time, and what each server did under them.

    Requests: `patient` clients wait for every answer; `impatient` ones give up after the engine's
    latency for a request alone (measured first, for `alone_s`) and come back after a back-off
    (`pacing`), for the profile's duration (at least 8 s). Each run is kept in `runs`, and its
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
        self.duration_s = max(self.lab.profile.duration_s, 8)
        self.stream_s = max(self.lab.profile.duration_s, 3)
        print(f"The models run on {self.lab.hardware()}.")

    # -- requests --

    def _paced(self, name: str, address: str, kind: str = "fastapi", model: str | None = None) -> tuple[float, float]:
        alone = self.lab.closed_loop(address, 1, self.alone_s, name=f"{name}, 1 client", kind=kind, model=model)
        patience_s, backoff_s = pacing(alone.latency.p50_ms, self.impatient)
        print(f"{name}: a request alone {alone.latency.p50_ms:.1f} ms; patience {1000 * patience_s:.0f} ms")
        return patience_s, backoff_s

    def _load(self, name: str, address: str, pace: tuple[float, float], **options: Any) -> RunResult:
        return self.lab.closed_loop(
            address, self.patient + self.impatient, self.duration_s, name=name, impatient=self.impatient,
            patience_s=pace[0], backoff_s=pace[1], **options,
        )  # fmt: skip

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
        self.lab.triton.apply_config(model, config)
        try:
            yield
        finally:
            self.lab.triton.restore_config(model)

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

        run = self.lab.streams(
            address, self.stream_patient + self.stream_impatient, self.steps, self.stream_s,
            f"{engine} /refine, cancellation {setting}", counter, kind=kind, model=model,
            impatient=self.stream_impatient, leave_after_steps=self.leave_after,
        )  # fmt: skip
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
        import matplotlib.pyplot as plt

        print("\n".join(stream_rows(self.streams)))
        engines = list(dict.fromkeys(engine for engine, _ in self.streams))
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.5))
        width = 0.38
        for offset, setting, color in ((-width / 2, "off", "tab:red"), (width / 2, "on", "tab:green")):
            at = [index + offset for index in range(len(engines))]
            runs = [self.streams[engine, setting] for engine in engines]
            left.bar(at, [(run.steps or {})["for_gone_clients"] for run in runs], width, color=color, label=setting)
            right.bar(at, [getattr(run.patient_latency, "p50_ms", math.nan) for run in runs], width, color=color,
                      label=setting)  # fmt: skip
        for axis, title in (
            (left, "steps computed for clients who left"),
            (right, "patient p50 to the last step (ms)"),
        ):
            axis.set_xticks(range(len(engines)), engines)
            axis.set_title(title)
            axis.legend(title="cancellation")
        fig.suptitle(
            f"{self.stream_patient} patient + {self.stream_impatient} impatient clients, {self.steps} steps, "
            f"leaving after {self.leave_after}"
        )
        fig.tight_layout()
        plt.show()

    def show_goodput_and_waste(self) -> None:
        """Each request run's goodput and its wasted inferences per second, side by side."""
        import matplotlib.pyplot as plt

        names = list(self.runs)
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
        left.barh(names, [self.runs[name].throughput_rps for name in names], color="tab:green")
        left.set_xlabel("goodput (answers to clients still waiting, req/s)")
        right.barh(names, [self.wasted[name] / self.runs[name].wall_s for name in names], color="tab:red")
        right.set_xlabel("wasted inferences per second (computed for nobody)")
        left.invert_yaxis()
        fig.suptitle(f"{self.patient} patient + {self.impatient} impatient clients, {self.lab.hardware()}")
        fig.tight_layout()
        plt.show()


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
    lab.triton.apply_config(model, config)
    try:
        yield ProbeTarget(lab.triton_http, lab.triton_grpc, lab.triton.log())
    finally:
        lab.triton.restore_config(model)


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
    lab.triton.log_verbosity(1, triton.http)
    cancelled, crash, begun = 0, None, time.monotonic()
    while crash is None and time.monotonic() - begun < probe_s:
        run = lab.closed_loop(
            triton.grpc, clients, PROBE_RUN_S, name=name, kind="triton-grpc", model=model,
            impatient=impatient, patience_s=pace[0], backoff_s=pace[1],
        )  # fmt: skip
        cancelled += run.cancelled
        crash = run.interrupted_by[0] if run.interrupted_by else None
    lab.wait_for_services()
    try:
        lab.triton.log_verbosity(0, triton.http)  # a server restarted after a crash is back at 0 already
    except TimeoutError:
        crash = crash or "hung: it stopped answering"
    steps = triton_stats.cancellation_steps(triton_stats.log_since(triton.log, log_start)) if triton.log else {}
    return RaceProbe(cancelled, steps, crash)


def probe_rows(probes: dict[str, RaceProbe]) -> list[str]:
    """The race probe's table, a line per deadline: cancellations, the steps at which the server
    handled them, the share handled as the answer completed, and the crash."""
    rows = [
        f"{'deadline':>22} | {'cancelled':>9} | {'handled at each step':<40} | {'as the answer completed':>23} | crash"
    ]
    for deadline, probe in probes.items():
        steps = ", ".join(f"{step} {count}" for step, count in sorted(probe.steps.items())) or "no log to read"
        rows.append(
            f"{deadline:>22} | {probe.cancelled:>9} | {steps:<40} | {100 * probe.near_share:>22.1f}% |"
            f" {probe.crash or 'none'}"
        )
    return rows
