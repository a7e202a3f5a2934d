"""Notebook 10's checks: requests and streams whose client has left, each a function of the runs.

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

import math

from servelab.lessons.expectations import (
    Condition,
    Estimate,
    Expectation,
    Figure,
    condition,
    figure,
    measured,
    unless,
    unless_each,
)
from servelab.results import RunResult

# With cancellation on, what a client who left may still cost: the step running when it left, and
# one more while the news travels (the proxy's cancel to a Ray Serve replica, say).
STEPS_AFTER_LEAVING = 2


def _left(run: RunResult | None, case: str) -> Figure:
    return figure(run, "cancelled", f"cancelled, {case}")


def _if_some_left(left: Figure, case: str, *judged: Condition) -> tuple[Condition, ...]:
    """`judged` where some client left in the run of `left`; else NOT CHECKED, saying so."""
    why = f"no client left {case}: there was nothing to cancel, so nothing to judge"
    return unless_each(not left.value == 0, why, *judged)


def _wasted_share(wasted: float, left: Figure, case: str) -> Estimate:
    """The wasted inferences as a percentage of the cancelled requests: the number a student predicts."""
    share = 100 * wasted / left.value if left.value else math.nan
    return Estimate(f"the wasted inferences {case}, as a share of the cancelled requests", share, "%")


def _computed_for_nobody(run: RunResult | None, wasted: float, case: str) -> tuple[Condition, ...]:
    """The run wasted at least half as many inferences as its clients cancelled."""
    left = _left(run, case)
    return _if_some_left(
        left,
        case,
        condition(
            f"{case}, wasted inferences are at least half the cancelled requests",
            wasted >= left.value / 2,
            measured(f"wasted inferences, {case}", wasted),
            left,
        ),
    )


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
            *_computed_for_nobody(off, wasted_off, "with abandoning off"),
            *_if_some_left(
                both,
                "in one of the two runs",
                condition(
                    "the patient clients' p95 is higher with it off than on",
                    patient_off.value > patient_on.value,
                    patient_off,
                    patient_on,
                ),
                condition(
                    "the goodput is lower with it off than on",
                    off.throughput_rps < on.throughput_rps,
                    figure(off, "throughput_rps", "goodput, off"),
                    figure(on, "throughput_rps", "goodput, on"),
                ),
            ),
        ),
        estimate=_wasted_share(wasted_off, left_off, "with abandoning off"),
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
            *_if_some_left(
                left_on,
                "with abandoning on",
                condition(
                    "the server abandons at least half the cancelled requests before the model",
                    abandoned >= left_on.value / 2,
                    measured("abandoned by the server", abandoned),
                    left_on,
                ),
            ),
        ),
        estimate=Estimate(
            "the waste with abandoning on, as a share of the waste with it off",
            100 * wasted_on / wasted_off if wasted_off else math.nan,
            "%",
        ),
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
            *_computed_for_nobody(http, wasted_http, "over HTTP"),
            *_if_some_left(
                left,
                "over gRPC",
                condition(
                    "over gRPC, at least half the cancelled requests are never computed",
                    stats.get("fail_count", math.nan) + stats.get("cancelled_by_model", math.nan) >= left.value / 2,
                    figure(grpc, "triton_stats.fail_count", "failed before the model, gRPC"),
                    figure(grpc, "triton_stats.cancelled_by_model", "answered CANCELLED by the model, gRPC"),
                    left,
                ),
                condition(
                    "over gRPC, the waste is under a quarter of the cancelled requests",
                    wasted_grpc < left.value / 4,
                    measured("wasted inferences, gRPC", wasted_grpc),
                    left,
                ),
            ),
        ),
        estimate=_wasted_share(wasted_grpc, left, "over gRPC"),
    )


def ray_drops_gone_requests(ray: RunResult, wasted: float) -> Expectation:
    """Ray Serve's waste is under a quarter of the cancelled requests; NOT CHECKED where no
    client left."""
    left = _left(ray, "Ray Serve")
    return Expectation(
        "Ray Serve drops the requests of clients who left",
        (
            *_if_some_left(
                left,
                "from Ray Serve",
                condition(
                    "its waste is under a quarter of the cancelled requests",
                    wasted < left.value / 4,
                    measured("wasted inferences, Ray Serve", wasted),
                    left,
                ),
            ),
        ),
        estimate=_wasted_share(wasted, left, "by Ray Serve"),
    )


def stream_stops_at_the_next_step(engine: str, off: RunResult | None, on: RunResult | None) -> Expectation:
    """Cancellation off: the steps computed for clients who left are at least half of those they left
    behind (streams left x (asked - leave_after_steps)); on: at most STEPS_AFTER_LEAVING per client
    who left; and the patient clients' p50 to their last step is lower with it on. Each NOT CHECKED
    where no client left in a run it reads."""
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
            *_if_some_left(
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
            *_if_some_left(
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
            *_if_some_left(
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
        estimate=Estimate(
            f"the steps {engine} computed per client who left, cancellation off",
            wasted_off.value / left_off.value if left_off.value else math.nan,
            "steps",
        ),
    )
