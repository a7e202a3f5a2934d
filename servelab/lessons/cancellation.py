"""Notebook 9's checks on streamed work: a stream whose client has left stops at the next step.

Each engine is measured twice under the same load (servelab.loadgen.streams): patient clients
that read every step, impatient ones that leave after `leave_after_steps` of the `asked` steps;
once with cancellation off, once on. A run's `steps` hold what the server itself counted over it
(`for_gone_clients`: steps that ended after their client had left), its `cancelled` the streams
whose client left, its `patient_latency` the patient clients' time to their last step.
"""

from __future__ import annotations

from servelab.lessons.expectations import Expectation, condition, figure
from servelab.results import RunResult

# With cancellation on, what a client who left may still cost: the step running when it left, and
# one more while the news travels (the proxy's cancel to a Ray Serve replica, say).
STEPS_AFTER_LEAVING = 2


def stream_stops_at_the_next_step(engine: str, off: RunResult | None, on: RunResult | None) -> Expectation:
    """Three conditions, each judged on its own figures:

    1. cancellation off: the steps computed for clients who left are at least half of the steps
       they left behind (streams left x (asked - leave_after_steps)): the server went on for nobody;
    2. cancellation on: at most STEPS_AFTER_LEAVING steps per client who left;
    3. the patient clients get their last step sooner with it on (p50).
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
            condition(
                f"with it on, at most {STEPS_AFTER_LEAVING} steps per client who left",
                wasted_on.value <= STEPS_AFTER_LEAVING * left_on.value,
                wasted_on,
                left_on,
                detail=f"{wasted_on.value / left_on.value:.2f} per client who left" if left_on.value else "",
            ),
            condition(
                "the patient clients get their last step sooner with it on (p50)",
                patient_on.value < patient_off.value,
                patient_on,
                patient_off,
                detail=f"{patient_on.value / patient_off.value:.2f}x" if patient_off.value else "",
            ),
        ),
        reason=(
            f"the patient clients completed {answers['off']} streams with cancellation off and {answers['on']} with "
            "it on: on a busy machine, the median of so few moves by more than the steps saved; and a server "
            "that reads a disconnect late (a busy event loop) computes more steps after it than it would alone"
        ),
    )
