"""Notebook 8's checks: Ray Serve's concurrency target (`max_ongoing_requests`), its autoscaler
(`target_ongoing_requests`) and its queue in front of the replicas.

They are judged on Serve's own accounts of itself, sampled every second by servelab.ray.watch
(replicas by state, requests inside the replicas and queued in front, time inside a replica), on
the clients' runs, and on the replica's own /metrics around a run (`RunResult.service_stats`: how
long its requests spent at the model and waiting for a predict slot).
"""

from __future__ import annotations

import math
import statistics
from itertools import pairwise
from typing import NamedTuple

from servelab.lessons.expectations import Expectation, Figure, condition, figure, measured, unless
from servelab.ray.watch import ServeSample, during, in_replica_mean_ms
from servelab.results import RunResult

# Serve's gauges are reported every second: a sample taken this soon after a step began may
# still describe the step before.
SETTLE_S = 1.5


class Step(NamedTuple):
    """One step of a step load, on the watcher's time axis."""

    start_s: float
    end_s: float
    clients: int
    run: RunResult


def _mean(values) -> float:
    values = list(values)
    return statistics.fmean(values) if values else math.nan


def _most(values) -> float:
    return float(max(values, default=math.nan))


def scales_on_the_target(
    samples: list[ServeSample], steps: list[Step], autoscaling: dict, max_ongoing: int
) -> Expectation:
    """A step load of (below the target, between the target and `max_ongoing`, above both, below
    the target again), against a deployment with `autoscaling` (its autoscaling_config):

    1. below the target, Serve runs `min_replicas`;
    2. in the second step, until a second replica runs, the requests per replica (inside it or
       queued in front) are above `target_ongoing_requests`;
    3. Serve adds that replica (starting or running) during the second step;
    4. until then, no replica held `max_ongoing` requests and none waited in front: the target
       triggered scaling, not the cap. Judged on the requests inside all the replicas together (Serve
       reports no per-replica count): under `max_ongoing`, no replica can hold that many. NOT
       CHECKED where the step has fewer clients than `max_ongoing`: they cannot fill a replica nor
       queue, so it holds by construction;
    5. once the load is back below the target, Serve removes it.
    """
    target, fewest = autoscaling["target_ongoing_requests"], autoscaling["min_replicas"]
    low, between, *_, last = steps
    at_start = [sample.running for sample in during(samples, low.start_s, low.end_s)]
    in_between = during(samples, between.start_s, between.end_s)
    added_at = next((sample.t_s for sample in in_between if sample.added > fewest), None)
    until_added = [sample for sample in in_between if added_at is None or sample.t_s <= added_at]
    one_running = [
        sample for sample in in_between if sample.t_s >= between.start_s + SETTLE_S and 0 < sample.running <= fewest
    ]
    load = measured(
        f"requests per replica, {between.clients} clients, before a second replica ran",
        _mean(sample.per_replica for sample in one_running),
    )
    added = measured(
        f"replicas running or starting, {between.clients} clients (most)", _most(s.added for s in in_between)
    )
    inside = measured(
        "requests inside the replicas, all together, until then (most)",
        _most(sample.ongoing for sample in until_added),
    )
    queued = measured("queued in front until then (most)", _most(sample.queued for sample in until_added))
    loaded = [sample.running for sample in samples if between.start_s <= sample.t_s <= last.start_s]
    at_end = during(samples, last.start_s, last.end_s)
    most = measured("replicas running under load (most)", _most(loaded))
    end = measured("replicas running at the end", at_end[-1].running if at_end else math.nan)
    when = (
        f"added {added_at - between.start_s:.0f} s into the step of {between.clients} clients"
        if added_at is not None
        else f"not added during the step of {between.clients} clients"
    )
    return Expectation(
        "Serve adds a replica when the requests per replica exceed target_ongoing_requests, before any "
        "replica is full, and removes it after",
        (
            condition(
                f"with {low.clients} client(s), below the target, {fewest} replica(s) serve",
                _most(at_start) == fewest,
                measured(f"replicas running, {low.clients} client(s) (most)", _most(at_start)),
            ),
            condition(
                f"with {between.clients} clients, the requests per replica were above the target until a "
                "second replica ran",
                load.value > target,
                load,
                measured("samples before it ran", len(one_running)),
                detail=f"target {target:g}",
            ),
            condition(
                f"with {between.clients} clients, Serve added a replica",
                added_at is not None,
                added,
                detail=when,
            ),
            unless(
                between.clients >= max_ongoing,
                f"{between.clients} clients cannot fill a replica that holds {max_ongoing} requests, nor queue "
                "in front of it: this holds by construction",
                condition(
                    f"until then, no replica held its max_ongoing_requests ({max_ongoing}) and nothing waited in "
                    "front: the target, not the cap, triggered scaling",
                    added_at is not None and inside.value < max_ongoing and queued.value < 1,
                    inside,
                    queued,
                    detail=when,
                ),
            ),
            condition(
                "after the load drops below the target again, Serve removes the replica it added",
                most.value > fewest and end.value <= fewest,
                most,
                end,
            ),
        ),
        reason=f"Serve's routers report their load every metrics_interval_s "
        f"({autoscaling.get('metrics_interval_s', 10):g} s here); Serve averages it over look_back_period_s "
        f"({autoscaling.get('look_back_period_s', 30):g} s), then waits upscale_delay_s "
        f"({autoscaling.get('upscale_delay_s', 30):g} s) or downscale_delay_s "
        f"({autoscaling.get('downscale_delay_s', 600):g} s), and a new replica then has to start: here the "
        f"second replica was {when}. A step shorter than all that ends before Serve acts "
        "(LAB_PROFILE=full runs longer steps).",
    )


def queue_in_front(samples: list[ServeSample], steps: list[Step], max_ongoing: int) -> Expectation:
    """The first step (one client) against the step with the most clients: with the most clients,
    Serve's queue holds requests, and at least half the share of a request's time that the
    replicas' cap predicts (1 - replicas x `max_ongoing` / clients) is spent outside the replica;
    with one client that time outside (Serve's proxy only) is under a quarter of the other's."""
    first = steps[0]
    high = max(steps, key=lambda step: step.clients)
    inside = during(samples, high.start_s, high.end_s)
    replicas = _most(sample.running for sample in inside)
    queued = measured(f"queued in front, {high.clients} clients (mean)", _mean(s.queued for s in inside))
    held, cpu = _mean(s.ongoing for s in inside), _mean(s.cpu_percent for s in inside)
    latency_high = figure(high.run, "latency.mean_ms", f"client latency, {high.clients} clients")
    latency_first = figure(first.run, "latency.mean_ms", f"client latency, {first.clients} client(s)")
    in_high = measured(
        f"time in the replica, {high.clients} clients", in_replica_mean_ms(samples, high.start_s, high.end_s), "ms"
    )
    in_first = measured(
        f"time in the replica, {first.clients} client(s)",
        in_replica_mean_ms(samples, first.start_s, first.end_s),
        "ms",
    )
    share = 1 - in_high.value / latency_high.value
    expected = max(0.0, 1 - replicas * max_ongoing / high.clients)
    outside_high, outside_first = latency_high.value - in_high.value, latency_first.value - in_first.value
    return Expectation(
        "requests beyond the concurrency target wait in front of the replicas",
        (
            condition(
                f"with {high.clients} clients, Serve's queue in front held requests",
                queued.value > 0.5,
                queued,
            ),
            condition(
                f"with {high.clients} clients, at least half the expected share of a request's time is spent "
                "outside the replica",
                share >= expected / 2,
                latency_high,
                in_high,
                detail=f"outside {share:.0%}, expected about {expected:.0%} = 1 - {replicas:g} x {max_ongoing} "
                f"/ {high.clients}",
            ),
            condition(
                f"with {first.clients} client(s), the time outside the replica (Serve's proxy only) is under a "
                f"quarter of that with {high.clients}",
                outside_first < outside_high / 4,
                latency_first,
                in_first,
                latency_high,
                in_high,
                detail=f"outside {outside_first:.1f} ms against {outside_high:.1f} ms",
            ),
        ),
        reason=f"with {high.clients} clients, Serve's gauges counted {held:.1f} requests inside the replicas and "
        f"{queued.value:.1f} queued on average: the other {high.clients - held - queued.value:.1f} were in neither, "
        f"in Serve's proxy before its queue or in the clients, while the CPU samples read {cpu:.0f}%; and the "
        f"gauges are snapshots, {len(inside)} of them in this step",
    )


def busy_slots(run: RunResult) -> float:
    """The predict slots at work on average during `run`: the replica's own inference time over
    the run (its /metrics, `service_stats`) divided by the run's measured seconds."""
    if run.service_stats is None:
        raise ValueError(f"{run.label}: the service's /metrics were not read over this run (service_stats)")
    count = run.service_stats["stage_counts"]["inference"]
    return 0.0 if count == 0 else count * run.service_stats["stage_mean_ms"]["inference"] / 1000 / run.wall_s


def _slots(run: RunResult, cap: int) -> Figure:
    return measured(f"busy slots, max_ongoing_requests {cap}", busy_slots(run))


def slots_need_room(
    runs: dict[int, RunResult], watched: dict[int, list[ServeSample]], predict_slots: int
) -> Expectation:
    """One replica with `predict_slots` predict slots (PREDICT_CONCURRENCY), the same clients, runs by its
    `max_ongoing_requests` (`runs`, and Serve's samples during each, `watched`):

    1. with the lowest, below `predict_slots`, requests wait in Serve's queue (at least one
       on average) while no more than that many slots work: the others stay idle;
    2. the busy slots grow with every step of `max_ongoing_requests`;
    3. with the highest, more than one slot works on average;
    4. from the lowest to the highest, the wait moves from Serve's queue into the replica: the queue
       in front shrinks and the replica's own wait for a slot grows; and the throughput grows.

    1 and 4 are NOT CHECKED where the clients were no more than the lowest `max_ongoing_requests`:
    then Serve had room for every request, and nothing could wait in front.
    """
    caps = sorted(runs)
    low, high = caps[0], caps[-1]
    clients = runs[low].concurrency or 0
    room = f"{clients} client(s) for max_ongoing_requests {low}: Serve had room for every request, none waited in front"
    slots = {cap: _slots(runs[cap], cap) for cap in caps}
    front = {
        cap: measured(f"queued in front, max_ongoing_requests {cap} (mean)", _mean(s.queued for s in watched[cap]))
        for cap in caps
    }
    cpu = _mean(sample.cpu_percent for sample in watched[high])
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
    engine: str, bounded: RunResult, unbounded: RunResult, queue_size: int, refusal: str | None, reason: str
) -> Expectation:
    """One rule for every engine's bounded queue (Ray Serve's `max_queued_requests`, Triton's
    `max_queue_size`), the same clients against a queue of `queue_size` and against no bound:

    1. with the bound, requests are refused (all with `refusal`, the engine's refusal, where given);
    2. a refusal takes under a quarter of an answer's median time under the same bound: refused
       fast, not after a wait;
    3. with no bound, nobody is refused;
    4. the answered p95 with the bound is under half the unbounded one's: the bound holds the wait
       of the requests it lets in.

    2 and 4 are NOT CHECKED where the bound refused nothing: then it never acted, and the two runs
    differ only by noise."""
    refused = figure(bounded, "error_count", f"refused, queue of {queue_size}")
    fast = measured("median time to a refusal", refusal_ms(bounded), "ms")
    answered_p50 = figure(bounded, "latency.p50_ms", f"answered p50, queue of {queue_size}")
    none = figure(unbounded, "error_count", "refused, unbounded")
    p95s = (figure(bounded, "latency.p95_ms", f"p95, queue of {queue_size}"),
            figure(unbounded, "latency.p95_ms", "p95, unbounded"))  # fmt: skip
    errors = set(bounded.errors)
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
        ),  # fmt: skip
        reason=reason,
    )
