"""Notebook 9's checks of the two limits in front of a model: the concurrency target against the
predict slots (`slots_need_room`, judged on the replica's own /metrics around each run:
`RunResult.service_stats`), a bounded queue that refuses (`bounded_queue_refuses`, every engine),
and FastAPI's slots that queue inside the process (`fastapi_queues_inside`).
"""

from __future__ import annotations

import math
import statistics
from itertools import pairwise

from servelab.lessons.concurrency_target.runs import busy_slots, mean_of
from servelab.lessons.expectations import (
    Estimate,
    Expectation,
    Figure,
    condition,
    figure,
    machine_hardware,
    measured,
    unless,
    unless_each,
)
from servelab.ray.watch import ServeSample
from servelab.results import RunResult


def _slots(run: RunResult, cap: int) -> Figure:
    return measured(f"busy slots, max_ongoing_requests {cap}", busy_slots(run))


def slots_need_room(
    runs: dict[int, RunResult], watched: dict[int, list[ServeSample]], predict_slots: int
) -> Expectation:
    """One replica with `predict_slots` predict slots (PREDICT_CONCURRENCY), the same clients, runs by its
    `max_ongoing_requests` (`runs`, and Serve's samples during each, `watched`). Waiting in front is at
    least one request queued on average; the wait moving into the replica is the queue in front
    shrinking while the replica's own wait for a slot grows. The first and last conditions are NOT
    CHECKED where the clients were no more than the lowest `max_ongoing_requests`: then Serve had room
    for every request, and nothing could wait in front."""
    caps = sorted(runs)
    low, high = caps[0], caps[-1]
    clients = runs[low].concurrency or 0
    room = f"{clients} client(s) for max_ongoing_requests {low}: Serve had room for every request, none waited in front"
    slots = {cap: _slots(runs[cap], cap) for cap in caps}
    front = {
        cap: measured(f"queued in front, max_ongoing_requests {cap} (mean)", mean_of(s.queued for s in watched[cap]))
        for cap in caps
    }
    cpu = mean_of(sample.cpu_percent for sample in watched[high])
    waits = {
        cap: figure(runs[cap], "service_stats.stage_mean_ms.slot_wait", f"slot wait in the replica, {cap}")
        for cap in (low, high)
    }
    rates = {cap: figure(runs[cap], "throughput_rps", f"max_ongoing_requests {cap}") for cap in (low, high)}
    # What the busy slots of the lowest are computed from, read from its run.
    parts = (
        figure(runs[low], "service_stats.stage_counts.inference", f"inferences, {low}"),
        figure(runs[low], "service_stats.stage_mean_ms.inference", f"inference, {low}"),
        figure(runs[low], "wall_s", f"seconds measured, {low}"),
    )
    growing = all(slots[a].value < slots[b].value for a, b in pairwise(caps))
    return Expectation(
        f"max_ongoing_requests below the predict slots ({predict_slots}) leaves predict slots idle "
        "while requests wait in front",
        (
            unless(
                clients > low,
                room,
                condition(
                    f"with max_ongoing_requests {low}, requests waited in Serve's queue while at most {low} of the "
                    f"{predict_slots} slots worked",
                    front[low].value >= 1 and slots[low].value <= low,
                    front[low],
                    slots[low],
                    *parts,
                ),
            ),
            condition(
                "the busy slots grow with max_ongoing_requests",
                growing,
                *slots.values(),
                detail=" -> ".join(f"{slots[cap].value:.2f}" for cap in caps),
            ),
            condition(
                f"with max_ongoing_requests {high}, more than one slot works on average",
                slots[high].value > 1,
                slots[high],
            ),
            unless(
                clients > low,
                room,
                condition(
                    f"from {low} to {high}, the wait moves from Serve's queue into the replica, and the throughput "
                    "grows",
                    front[high].value < front[low].value
                    and waits[high].value > waits[low].value
                    and rates[high].value > rates[low].value,
                    front[low],
                    front[high],
                    *waits.values(),
                    *rates.values(),
                ),
            ),
        ),
        reason="a request holds its place among the max_ongoing_requests from the moment Serve sends it until "
        "its answer is back, and spends only part of that time at the model (decoding, the passage through "
        f"Serve): with max_ongoing_requests {high} the replica's inference kept {slots[high].value:.2f} slots busy "
        f"on average, while the machine's CPU samples read {cpu:.0f}% (the clients, Serve's proxy and the replica "
        "share the cores: near 100%, a slot waits for a core rather than for a request)",
    )


def refusal_ms(run: RunResult | None) -> float:
    """The median time a refused request of `run` took to be refused; NaN where none was."""
    refused = [latency for _, latency, outcome in (run.timeline if run is not None else []) if outcome != "ok"]
    return statistics.median(refused) if refused else math.nan


def bounded_queue_refuses(
    engine: str,
    bounded: RunResult,
    unbounded: RunResult,
    queue_size: int,
    refusal: str | None = None,
    hardware: str | None = None,
) -> Expectation:
    """One rule for every engine's bounded queue (Ray Serve's `max_queued_requests`, Triton's
    `max_queue_size`), the same clients against a queue of `queue_size` and against no bound: it
    refuses (with `refusal`, the engine's, where given), fast (not after a wait), and holds the wait
    of the requests it lets in. The speed of a refusal and the answered p95 are NOT CHECKED where the
    bound refused nothing: then it never acted, and the two runs differ only by noise. The reason
    names `hardware` (by default the machine's), and where the bounded run counted Triton's
    statistics, the answered requests' time in its queue."""
    refused = figure(bounded, "error_count", f"refused, queue of {queue_size}")
    fast = measured("median time to a refusal", refusal_ms(bounded), "ms")
    answered_p50 = figure(bounded, "latency.p50_ms", f"answered p50, queue of {queue_size}")
    none = figure(unbounded, "error_count", "refused, unbounded")
    p95s = (
        figure(bounded, "latency.p95_ms", f"p95, queue of {queue_size}"),
        figure(unbounded, "latency.p95_ms", "p95, unbounded"),
    )
    errors = set(bounded.errors)
    stats = bounded.triton_stats
    waited = (
        f"; with the queue of {queue_size} an answered request waited {stats['avg_queue_us'] / 1000:.1f} ms in "
        f"{engine}'s queue on average for {stats['avg_compute_infer_us'] / 1000:.1f} ms of computing"
        if stats
        else ""
    )
    why = f"the queue of {queue_size} refused nothing: the bound never acted, so the two runs differ by noise alone"
    return Expectation(
        f"{engine}: a bounded queue refuses overload fast, and bounds the latency of the rest",
        (
            condition(
                f"with the queue of {queue_size}, requests are refused" + (f", all with {refusal}" if refusal else ""),
                refused.value > 0 and (refusal is None or errors == {refusal}),
                refused,
                detail=f"errors: {bounded.errors}",
            ),
            unless(
                refused.value > 0,
                why,
                condition(
                    f"a refusal takes under a quarter of an answer's median time with the queue of {queue_size}",
                    fast.value < answered_p50.value / 4,
                    fast,
                    answered_p50,
                ),
            ),
            condition("with no bound, nobody is refused", none.value == 0, none),
            unless(
                refused.value > 0,
                why,
                condition(
                    f"the answered p95 with the queue of {queue_size} is under half the unbounded one's",
                    p95s[0].value < p95s[1].value / 2,
                    *p95s,
                    detail=f"x{p95s[0].value / p95s[1].value:.2f}",
                ),
            ),
        ),
        reason=f"on {hardware or machine_hardware()}, the {bounded.concurrency} clients and their refusals share the "
        f"cores with {engine}, its queue and its model, which slows the answered requests too{waited}",
        estimate=Estimate.ratio(
            f"the answered p95 with the queue of {queue_size}, over the unbounded one's", p95s[0].value, p95s[1].value
        ),
    )


def fastapi_queues_inside(few: RunResult, many: RunResult, slots: int) -> Expectation:
    """FastAPI with `slots` predict slots and nothing in front of them, `few` then `many` clients. Each
    extra client waiting for the slots adds a service time, about 4x from 4 to 16 clients on one
    slot: 2.5x leaves room for the work outside the slot that overlaps, and is beyond any noise. The
    slot wait must grow by at least one inference time more than the inference: with nothing queued,
    the noise in either mean could decide a bare comparison. A wrong outcome: the extra clients'
    requests refused or waiting outside the process (the latency grows while the slot wait does not).
    Both growths are NOT CHECKED where `many` had no more clients than the slots."""
    errors = [figure(run, "error_count", f"errors, {run.concurrency} clients") for run in (few, many)]
    p50s = [figure(run, "latency.p50_ms", f"p50, {run.concurrency} clients") for run in (few, many)]
    waits = [
        figure(run, "service_stats.stage_mean_ms.slot_wait", f"slot wait, {run.concurrency} clients")
        for run in (few, many)
    ]
    infers = [
        figure(run, "service_stats.stage_mean_ms.inference", f"inference, {run.concurrency} clients")
        for run in (few, many)
    ]
    crowd = (many.concurrency or 0) > slots
    why = f"{many.concurrency} client(s) for {slots} predict slot(s): none had to wait for a slot"
    grown = waits[1].value - waits[0].value
    return Expectation(
        "FastAPI's predict slots queue requests inside the process and never refuse",
        (
            condition("nobody is refused", errors[0].value == 0 and errors[1].value == 0, *errors),
            *unless_each(
                crowd,
                why,
                condition(
                    f"the median latency grows at least 2.5x from {few.concurrency} to {many.concurrency} clients",
                    p50s[1].value >= 2.5 * p50s[0].value,
                    *p50s,
                    detail=f"{p50s[1].value / p50s[0].value:.1f}x",
                ),
                condition(
                    "the wait for the slot grows more than the inference, by at least one inference time",
                    grown > infers[1].value - infers[0].value + infers[1].value,
                    *waits,
                    *infers,
                    detail=f"slot wait +{grown:.1f} ms, inference {infers[1].value - infers[0].value:+.1f} ms",
                ),
            ),
        ),
        reason=f"the {many.concurrency} clients, the load generator and the service share the cores: "
        f"with {many.concurrency} clients an inference took {infers[1].value:.1f} ms against "
        f"{infers[0].value:.1f} ms with {few.concurrency}",
        estimate=Estimate.ratio(
            f"the median latency of {many.concurrency} clients over {few.concurrency}", p50s[1].value, p50s[0].value
        ),
    )
