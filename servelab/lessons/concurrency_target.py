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


class StepLoad(NamedTuple):
    """A step load against an autoscaling deployment: Serve's samples, the steps, and the
    deployment's autoscaling_config."""

    samples: list[ServeSample]
    steps: list[Step]
    autoscaling: dict


def _mean(values) -> float:
    values = list(values)
    return statistics.fmean(values) if values else math.nan


def _most(values) -> float:
    return float(max(values, default=math.nan))


def step_view(samples: list[ServeSample], step: Step) -> dict[str, float]:
    """One step seen from both sides: Serve's samples during it (replicas, requests inside the
    replicas and per replica, queued in front, CPU, time in a replica) and the client's latency."""
    inside = during(samples, step.start_s, step.end_s)
    return {
        "replicas (max)": _most(sample.running for sample in inside) if inside else 0.0,
        "in replicas (mean)": _mean(sample.ongoing for sample in inside),
        "per replica (mean)": _mean(sample.per_replica for sample in inside if sample.running),
        "queued (mean)": _mean(sample.queued for sample in inside),
        "CPU % (mean)": _mean(sample.cpu_percent for sample in inside),
        "in replica ms": in_replica_mean_ms(samples, step.start_s, step.end_s),
        "client ms": step.run.latency.mean_ms,
    }


def step_table(load: StepLoad) -> str:
    """A step load's table: one row per step (`step_view`)."""
    views = [step_view(load.samples, step) for step in load.steps]
    lines = [f"{'step':<28}" + "".join(f"{name:>20}" for name in views[0])]
    for step, view in zip(load.steps, views, strict=True):
        label = f"{step.clients} client(s), {step.start_s:.0f}-{step.end_s:.0f} s"
        lines.append(f"{label:<28}" + "".join(f"{value:20.1f}" for value in view.values()))
    return "\n".join(lines)


def scales_on_the_target(load: StepLoad) -> Expectation:
    """A step load of (below the target, between the target and the replicas' cap, above both,
    below the target again), against a deployment with `load.autoscaling` (its
    autoscaling_config): Serve's autoscaler follows the requests per replica.

    1. below the target, Serve runs `min_replicas`;
    2. in the second step, until a second replica runs, the requests per replica (inside it or
       queued in front) are above `target_ongoing_requests`;
    3. once the load is back below the target, Serve removes the replica it added.

    When Serve added that replica, and how full the replica was then, is `scaling_rules`'s to judge.
    """
    samples, autoscaling = load.samples, load.autoscaling
    target, fewest = autoscaling["target_ongoing_requests"], autoscaling["min_replicas"]
    low, between, *_, last = load.steps
    at_start = [sample.running for sample in during(samples, low.start_s, low.end_s)]
    in_between = during(samples, between.start_s, between.end_s)
    one_running = [
        sample for sample in in_between if sample.t_s >= between.start_s + SETTLE_S and 0 < sample.running <= fewest
    ]
    per_replica = measured(
        f"requests per replica, {between.clients} clients, before a second replica ran",
        _mean(sample.per_replica for sample in one_running),
    )
    loaded = [sample.running for sample in samples if between.start_s <= sample.t_s <= last.start_s]
    at_end = during(samples, last.start_s, last.end_s)
    most = measured("replicas running under load (most)", _most(loaded))
    end = measured("replicas running at the end", at_end[-1].running if at_end else math.nan)
    return Expectation(
        "Serve's autoscaler follows the requests per replica: above target_ongoing_requests it adds a "
        "replica, and it removes it once the load is back below",
        (
            condition(
                f"with {low.clients} client(s), below the target, {fewest} replica(s) serve",
                _most(at_start) == fewest,
                measured(f"replicas running, {low.clients} client(s) (most)", _most(at_start)),
            ),
            condition(
                f"with {between.clients} clients, the requests per replica were above the target until a "
                "second replica ran",
                per_replica.value > target,
                per_replica,
                measured("samples before it ran", len(one_running)),
                detail=f"target {target:g}",
            ),
            condition(
                "after the load drops below the target again, Serve removes the replica it added",
                most.value > fewest and end.value <= fewest,
                most,
                end,
            ),
        ),
        reason=_delays(autoscaling) + " A step shorter than all that ends before Serve acts "
        "(LAB_PROFILE=full runs longer steps).",
    )


def _delays(autoscaling: dict) -> str:
    return (
        f"Serve's routers report their load every metrics_interval_s "
        f"({autoscaling.get('metrics_interval_s', 10):g} s here); Serve averages it over look_back_period_s "
        f"({autoscaling.get('look_back_period_s', 30):g} s), then waits upscale_delay_s "
        f"({autoscaling.get('upscale_delay_s', 30):g} s) or downscale_delay_s "
        f"({autoscaling.get('downscale_delay_s', 600):g} s), and a new replica then has to start."
    )


class _Addition(NamedTuple):
    """When Serve first decided on a replica beyond `min_replicas` in one step load (one starting
    counts: that is its decision), and Serve's samples of that step until then."""

    target: float
    fewest: int  # min_replicas
    step: Step | None  # the step during which Serve added the replica; None: it never did
    at_s: float  # when (NaN: never)
    before: list[ServeSample]  # Serve's samples of that step until then, once SETTLE_S had passed
    crowded: str  # why the first step already ran more than `fewest` replicas; "" where it did not

    @property
    def why_not(self) -> str:
        """Why there is no addition to time ("": there is one)."""
        if self.crowded or self.step is not None:
            return self.crowded
        return f"with target {self.target:g}, Serve added no replica: no addition to time"

    @property
    def when(self) -> str:
        if self.step is None:
            return "never added"
        return f"added {self.at_s - self.step.start_s:.0f} s into the step of {self.step.clients} clients"

    def figures(self) -> tuple[Figure, ...]:
        name = f"target {self.target:g}"
        return (
            measured(f"{name}: clients when Serve added a replica", self.step.clients if self.step else math.nan),
            measured(f"{name}: requests inside the replicas until then (most)", _most(s.ongoing for s in self.before)),
            measured(f"{name}: queued in front until then (mean)", _mean(s.queued for s in self.before)),
        )


def _addition(load: StepLoad) -> _Addition:
    target, fewest, first = load.autoscaling["target_ongoing_requests"], load.autoscaling["min_replicas"], load.steps[0]
    at_first = int(_most(s.added for s in during(load.samples, first.start_s + SETTLE_S, first.end_s)))
    watched = during(load.samples, first.start_s + SETTLE_S, load.steps[-1].end_s)
    at = next((sample.t_s for sample in watched if sample.added > fewest), None)
    step = None if at is None else [step for step in load.steps if step.start_s <= at][-1]
    crowded = (
        f"with target {target:g}, {max(at_first, fewest + 1)} replicas ran or started already during the first step "
        f"({first.clients} client(s)): no addition to time"
        if at_first > fewest or step is first
        else ""
    )
    if at is None or step is None:
        return _Addition(target, fewest, None, math.nan, [], crowded)
    return _Addition(target, fewest, step, at, during(load.samples, step.start_s + SETTLE_S, at), crowded)


def scaling_rules(below: StepLoad, at_cap: StepLoad, max_ongoing: int) -> Expectation:
    """Two rules for when to add a replica, measured on step loads against the same deployment
    (each replica holds at most `max_ongoing` requests, its cap):

    1. `below`: target_ongoing_requests under the cap, Ray Serve's practice. Serve adds a replica
       before any replica is full: until it decided (a replica starting), the replicas held fewer
       than their cap (the most any sample read) and nothing waited in front (under half a request
       on average: a gauge's snapshot can catch a request while the router assigns it);
    2. `at_cap`: target_ongoing_requests equal to the cap, the rule of Baseten's concurrency target
       (one number caps a replica and, once every replica has reached it, triggers scaling). With
       more clients than the replicas hold, Serve adds a replica;
    3. and only once the replicas were full: more clients than the replicas hold, and requests
       waited in front (at least one on average, not a snapshot's passing one), which Serve's router
       does only while every replica holds its cap. The most any sample read inside is shown beside
       them, not judged: two gauges sampled once a second can miss the moment a replica is at its
       cap while requests move between the router and it (measured: 3 of 4 inside, with 4.5 queued).

    "Until it decided" is Serve's samples of the step during which it decided, once SETTLE_S had
    passed. A wrong outcome for 1 is a replica added only with the step above the cap; for 3, one
    added with the clients below the cap, as with the lower target. Each is NOT CHECKED where its
    premise did not arise: more replicas than `min_replicas` ran already in the first step (no
    addition to time), Serve added none (for 1, `scales_on_the_target` judges the load that should
    have), or no step of `at_cap` had more clients than its replicas hold (nothing could fill them).
    """
    low, high = _addition(below), _addition(at_cap)
    full = high.fewest * max_ongoing  # what the replicas hold before Serve adds one
    most_clients = max(step.clients for step in at_cap.steps)
    low_clients, low_inside, low_queued = low.figures()
    high_clients, high_inside, high_queued = high.figures()
    added = measured(
        f"target {high.target:g}: replicas running or starting (most)", _most(s.added for s in at_cap.samples)
    )
    cpu = _mean(s.cpu_percent for s in [*below.samples, *at_cap.samples])
    return Expectation(
        f"with target_ongoing_requests below max_ongoing_requests ({max_ongoing}), Ray Serve's practice, a replica "
        "is added before any replica is full; with the target equal to it, Baseten's rule, only once the replicas "
        "are full and requests wait in front",
        (
            unless(
                not low.why_not,
                low.why_not,
                condition(
                    f"target {low.target:g}, below the cap {max_ongoing}: until Serve added a replica, the replicas "
                    "held fewer requests than their cap and nothing waited in front",
                    low_inside.value < low.fewest * max_ongoing and low_queued.value < 0.5,
                    low_clients,
                    low_inside,
                    low_queued,
                    detail=low.when,
                ),
            ),
            unless(
                most_clients > full and not high.crowded,
                high.crowded
                if high.crowded
                else f"no step had more than {most_clients} clients, for {high.fewest} replica(s) of {max_ongoing}: "
                "nothing could fill them",
                condition(
                    f"target {high.target:g}, equal to the cap: with {most_clients} clients, more than the replicas "
                    "hold, Serve added a replica",
                    high.step is not None,
                    added,
                    detail=high.when,
                ),
            ),
            unless(
                not high.why_not,
                high.why_not,
                condition(
                    f"target {high.target:g}, equal to the cap: Serve added it only once the replicas were full and "
                    "requests waited in front",
                    high_clients.value > full and high_queued.value >= 1,
                    high_clients,
                    high_inside,
                    high_queued,
                    detail=high.when,
                ),
            ),
        ),
        reason=f"{_delays(at_cap.autoscaling)} With target {low.target:g} the replica was {low.when}, with target "
        f"{high.target:g} {high.when}; the gauges are snapshots taken every second, while the CPU samples read "
        f"{cpu:.0f}% on average (the clients, Serve's proxy and the replicas share the cores).",
    )


def queue_in_front(load: StepLoad, max_ongoing: int) -> Expectation:
    """The first step (one client) against the step with the most clients: with the most clients,
    Serve's queue holds requests, and at least half the share of a request's time that the
    replicas' cap predicts (1 - replicas x `max_ongoing` / clients) is spent outside the replica;
    with one client that time outside (Serve's proxy only) is under a quarter of the other's.
    Plausible wrong outcome: requests that wait inside the replica instead (a cap above the target).
    All NOT CHECKED where the most clients fit in the replicas (no more than replicas x
    `max_ongoing`): then no request had to wait in front."""
    samples, steps = load.samples, load.steps
    first = steps[0]
    high = max(steps, key=lambda step: step.clients)
    inside = during(samples, high.start_s, high.end_s)
    replicas = _most(sample.running for sample in inside)
    room = (
        f"{high.clients} clients, {replicas:g} replica(s) of {max_ongoing} requests each: every request found room "
        "in a replica"
    )
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
            unless(
                not high.clients <= replicas * max_ongoing,
                room,
                condition(
                    f"with {high.clients} clients, Serve's queue in front held requests",
                    queued.value > 0.5,
                    queued,
                ),
            ),
            unless(
                not high.clients <= replicas * max_ongoing,
                room,
                condition(
                    f"with {high.clients} clients, at least half the expected share of a request's time is spent "
                    "outside the replica",
                    share >= expected / 2,
                    latency_high,
                    in_high,
                    detail=f"outside {share:.0%}, expected about {expected:.0%} = 1 - {replicas:g} x {max_ongoing} "
                    f"/ {high.clients}",
                ),
            ),
            unless(
                not high.clients <= replicas * max_ongoing,
                room,
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


def slot_table(runs: dict[int, RunResult], watched: dict[int, list[ServeSample]]) -> str:
    """`slots_need_room`'s runs as a table, one row per `max_ongoing_requests`: throughput, busy
    slots, requests queued in front (Serve's samples, `watched`), and the replica's own times: the
    wait for a slot, the time in the replica, the time at the model."""
    lines = [f"{'max_ongoing_requests':>22}{'req/s':>8}{'busy slots':>12}{'queued in front':>17}{'slot wait ms':>14}"
             f"{'in replica ms':>15}{'at the model ms':>17}"]  # fmt: skip
    for cap, run in runs.items():
        stages = (run.service_stats or {}).get("stage_mean_ms", {})
        lines.append(
            f"{cap:>22}{run.throughput_rps:>8.1f}{busy_slots(run):>12.2f}"
            f"{_mean(sample.queued for sample in watched[cap]):>17.2f}{stages.get('slot_wait', math.nan):>14.1f}"
            f"{in_replica_mean_ms(watched[cap], 0, math.inf):>15.1f}{stages.get('inference', math.nan):>17.1f}"
        )
    return "\n".join(lines)


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


def gpu_replicas_add_capacity(by_replicas: dict[int, RunResult], gpus: int, cores: int) -> Expectation:
    """The same clients against 1 and 2 replicas, each with a GPU of its own (no autoscaling): the
    second replica serves at least 1.3x what one does. The margin: a second GPU doubles the compute
    at best, and the runs' noise on a shared machine is some 10%, so 1.3x is a gain no noise makes.
    A wrong outcome: about 1x, the GPUs not the limit. NOT CHECKED where Ray has fewer than two GPUs
    (two replicas then share one, each reserving part of it: no second GPU was added), or a run is
    missing."""
    one, two = (figure(by_replicas.get(n), "throughput_rps", f"{n} replica(s)") for n in (1, 2))
    gain = two.value / one.value if one.value else math.nan
    return Expectation(
        "each GPU replica adds capacity",
        (
            unless(
                gpus >= 2,
                f"this Ray has {gpus} GPU(s), which the two replicas share: a second replica adds no GPU",
                condition(
                    "two replicas serve at least 1.3x what one does", gain >= 1.3, one, two, detail=f"{gain:.2f}x"
                ),  # fmt: skip
            ),
        ),
        reason="the replicas' GPUs may not be the limit: the CPU work around them (decoding, Serve's proxy, "
        f"the load generator) shares {cores} cores",
    )


def replicas_stop_at_full_cores(
    by_replicas: dict[int, RunResult], cpu_percent: dict[int, float], cores: int
) -> Expectation:
    """On a CPU-only machine, the same clients against 1, 2 and 3 replicas (`cpu_percent`: the
    machine's CPU use during each run, in % of all cores):

    1. with two replicas, the CPU samples read at least 95% (the cores are full; 95, not 100: the
       samples are means over a run, which starts and ends with the cores less busy);
    2. the third replica's gain over two stays within what the cores have left, 100% / (CPU % with
       two), give or take 15% (the runs' noise on a shared machine, which a bare comparison would
       let decide).

    A wrong outcome: a third replica that adds 1.5x while two already filled the cores (each
    replica counted as a machine of its own). A condition whose run is missing (no third replica
    ran) is NOT CHECKED, with the replicas that ran.
    """
    throughputs = {n: figure(by_replicas.get(n), "throughput_rps", f"{n} replica(s)") for n in (2, 3)}
    cpu = {n: measured(f"CPU % with {n} replicas", cpu_percent.get(n, math.nan), "%") for n in (2, 3)}
    ran = ", ".join(str(n) for n in sorted(by_replicas)) or "none"
    gain = throughputs[3].value / throughputs[2].value if throughputs[2].value else math.nan
    room = 100 / cpu[2].value if cpu[2].value else math.inf
    return Expectation(
        "on a CPU-only machine, replicas stop adding capacity once the cores are full",
        (
            unless(
                2 in by_replicas,
                f"no run with two replicas (replicas run: {ran})",
                condition("with two replicas, the CPU samples read at least 95%", cpu[2].value >= 95, cpu[2]),
            ),
            unless(
                2 in by_replicas and 3 in by_replicas,
                f"no run with two and three replicas to compare (replicas run: {ran})",
                condition(
                    "the third replica's gain stays within 100% / (CPU % with two), +15%",
                    gain <= 1.15 * room,
                    throughputs[2],
                    throughputs[3],
                    cpu[2],
                    detail=f"gain {gain:.2f}x, room for {room:.2f}x",
                ),
            ),
        ),
        reason=f"the CPU samples are the whole machine's ({cores} cores): if Serve's proxy or the load generator "
        "spends less CPU per request when fewer requests wait in front, that shows up as capacity",
    )


def replicas_add_capacity(
    by_replicas: dict[int, RunResult], cpu_percent: dict[int, float], gpus: int, cores: int
) -> Expectation:
    """Replicas add capacity only while the machine has room for them: with GPUs,
    `gpu_replicas_add_capacity`; on a CPU-only machine, `replicas_stop_at_full_cores`."""
    if gpus:
        return gpu_replicas_add_capacity(by_replicas, gpus, cores)
    return replicas_stop_at_full_cores(by_replicas, cpu_percent, cores)


def spread_over_nodes(report: dict, requests: int) -> Expectation:
    """A two-node Ray cluster on this machine (`report`: servelab.ray.cluster's JSON), a deployment
    of two replicas at most one per node, and `requests` requests through the head node's proxy.
    A claim about what the lab's software does, not about speed: it must hold.

    1. the cluster has two nodes;
    2. every node is on 127.0.0.1 (Ray kept on loopback);
    3. no node holds two replicas: one on each;
    4. every request was answered;
    5. each node served requests.

    A wrong outcome: both replicas on the head node, which then serves every request (3 and 5).
    3 and 5 are NOT CHECKED where the cluster had fewer than two nodes: no second node to place a
    replica on (1 says so)."""
    nodes = report["nodes"]
    replicas = {node: len(report["replicas_by_node"].get(node, [])) for node in nodes}
    served = {node: report["requests_by_node"].get(node, 0) for node in nodes}
    lone = f"the cluster had {len(nodes)} node(s): no second node to place a replica on, nor to serve"
    elsewhere = set(report["node_addresses"]) - {"127.0.0.1"}
    return Expectation(
        "Serve spreads the replicas over both nodes, on loopback, and both serve requests",
        (
            condition("the cluster has two nodes", len(nodes) == 2, measured("nodes", len(nodes))),
            condition(
                "every node is on 127.0.0.1 (Ray kept on loopback)",
                not elsewhere and bool(report["node_addresses"]),
                measured("node addresses other than 127.0.0.1", len(elsewhere)),
                detail=", ".join(report["node_addresses"]),
            ),
            unless(
                len(nodes) >= 2,
                lone,
                condition(
                    "no node holds two replicas: one on each",
                    all(count == 1 for count in replicas.values()),
                    *(measured(f"replicas on node {node[:8]}", count) for node, count in replicas.items()),
                ),
            ),
            condition(
                "every request was answered",
                report["statuses"] == {"200": requests},
                measured("answered", report["statuses"].get("200", 0)),
                detail=f"of {requests}; statuses {report['statuses']}",
            ),
            unless(
                len(nodes) >= 2,
                lone,
                condition(
                    "each node served requests",
                    min(served.values(), default=0) > 0,
                    *(measured(f"served by node {node[:8]}", count) for node, count in served.items()),
                ),
            ),
        ),
        reason=f"the cluster's nodes: {len(nodes)}, at {', '.join(report['node_addresses']) or 'no address'}",
        must_hold=True,
    )


def fastapi_queues_inside(few: RunResult, many: RunResult, slots: int) -> Expectation:
    """FastAPI with `slots` predict slots and nothing in front of them, `few` then `many` clients:

    1. nobody is refused;
    2. the median latency grows at least 2.5x: each extra client waiting for the slots adds a
       service time, which from 4 to 16 clients on one slot is about 4x; 2.5x leaves room for
       the work outside the slot that overlaps, and is beyond any noise;
    3. the wait for the slots grows more than the inference does, by at least one inference time
       (a margin: with nothing queued, the noise in either mean could decide a bare comparison).

    A wrong outcome: the extra clients' requests refused or waiting outside the process (the
    latency grows while the slot wait does not). 2 and 3 are NOT CHECKED where `many` had no more
    clients than the slots: nothing could wait for one."""
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
            unless(
                crowd,
                why,
                condition(
                    f"the median latency grows at least 2.5x from {few.concurrency} to {many.concurrency} clients",
                    p50s[1].value >= 2.5 * p50s[0].value,
                    *p50s,
                    detail=f"{p50s[1].value / p50s[0].value:.1f}x",
                ),
            ),
            unless(
                crowd,
                why,
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
    )
