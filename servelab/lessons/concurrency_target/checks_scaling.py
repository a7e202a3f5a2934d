"""Notebook 9's checks of its step loads: Serve's autoscaler (`target_ongoing_requests`), the
rule for when it adds a replica (below the cap, or at it: Baseten's rule), and the queue in front
of the replicas. Judged on Serve's own accounts of itself, sampled every second by
servelab.ray.watch (replicas by state, requests inside the replicas and queued in front, time
inside a replica), and on the clients' runs.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from servelab.lessons.concurrency_target.runs import SETTLE_S, Step, StepLoad, mean_of, most_of
from servelab.lessons.expectations import Expectation, Figure, condition, figure, measured, unless, unless_each
from servelab.ray.watch import ServeSample, during, in_replica_mean_ms


def scales_on_the_target(load: StepLoad) -> Expectation:
    """A step load of (below the target, between the target and the replicas' cap, above both,
    below the target again), against a deployment with `load.autoscaling` (its
    autoscaling_config): Serve's autoscaler follows the requests per replica, inside it or queued in
    front, judged in the second step until a second replica runs. When Serve added that replica,
    and how full the replica was then, is `scaling_rules`'s to judge."""
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
        mean_of(sample.per_replica for sample in one_running),
    )
    loaded = [sample.running for sample in samples if between.start_s <= sample.t_s <= last.start_s]
    at_end = during(samples, last.start_s, last.end_s)
    most = measured("replicas running under load (most)", most_of(loaded))
    end = measured("replicas running at the end", at_end[-1].running if at_end else math.nan)
    return Expectation(
        "Serve's autoscaler follows the requests per replica: above target_ongoing_requests it adds a "
        "replica, and it removes it once the load is back below",
        (
            condition(
                f"with {low.clients} client(s), below the target, {fewest} replica(s) serve",
                most_of(at_start) == fewest,
                measured(f"replicas running, {low.clients} client(s) (most)", most_of(at_start)),
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
            measured(
                f"{name}: requests inside the replicas until then (most)", most_of(s.ongoing for s in self.before)
            ),
            measured(f"{name}: queued in front until then (mean)", mean_of(s.queued for s in self.before)),
        )


def _addition(load: StepLoad) -> _Addition:
    target, fewest, first = load.autoscaling["target_ongoing_requests"], load.autoscaling["min_replicas"], load.steps[0]
    at_first = int(most_of(s.added for s in during(load.samples, first.start_s + SETTLE_S, first.end_s)))
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
    """Two rules for when to add a replica, on step loads against the same deployment (each replica
    holds at most `max_ongoing` requests, its cap): `below`, target_ongoing_requests under the cap
    (Ray Serve's practice), adds one before any replica is full; `at_cap`, the target equal to the
    cap (Baseten's concurrency target: one number caps a replica and, once every replica reached
    it, triggers scaling), adds one only once the replicas are full and requests wait in front.

    "Until it decided" (a replica starting) is Serve's samples of that step once SETTLE_S had
    passed. Nothing waiting in front is under half a request on average (a gauge's snapshot can
    catch one while the router assigns it); full replicas are read from the queue in front (at
    least one on average), which Serve's router holds only while every replica holds its cap: the
    most read inside is shown, not judged, as two gauges sampled once a second can miss that moment
    (measured: 3 of 4 inside, with 4.5 queued). Wrong outcomes: a low target whose replica came
    only above the cap; a target at the cap whose replica came below it. Each is NOT CHECKED where
    its premise did not arise: more than `min_replicas` ran already in the first step, Serve added
    none (for the low target, `scales_on_the_target` judges that), or no step of `at_cap` had more
    clients than its replicas hold."""
    low, high = _addition(below), _addition(at_cap)
    full = high.fewest * max_ongoing  # what the replicas hold before Serve adds one
    most_clients = max(step.clients for step in at_cap.steps)
    low_clients, low_inside, low_queued = low.figures()
    high_clients, high_inside, high_queued = high.figures()
    added = measured(
        f"target {high.target:g}: replicas running or starting (most)", most_of(s.added for s in at_cap.samples)
    )
    cpu = mean_of(s.cpu_percent for s in [*below.samples, *at_cap.samples])
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
    replicas = most_of(sample.running for sample in inside)
    room = (
        f"{high.clients} clients, {replicas:g} replica(s) of {max_ongoing} requests each: every request found room "
        "in a replica"
    )
    queued = measured(f"queued in front, {high.clients} clients (mean)", mean_of(s.queued for s in inside))
    held, cpu = mean_of(s.ongoing for s in inside), mean_of(s.cpu_percent for s in inside)
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
            *unless_each(
                not high.clients <= replicas * max_ongoing,
                room,
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
        ),
        reason=f"with {high.clients} clients, Serve's gauges counted {held:.1f} requests inside the replicas and "
        f"{queued.value:.1f} queued on average: the other {high.clients - held - queued.value:.1f} were in neither, "
        f"in Serve's proxy before its queue or in the clients, while the CPU samples read {cpu:.0f}%; and the "
        f"gauges are snapshots, {len(inside)} of them in this step",
    )
