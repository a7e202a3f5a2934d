"""Notebook 9's checks of autoscaling and queues, each fed the case it must pass and the cases it must
fail (its checks of capacity: tests/test_lessons_concurrency_target_capacity.py)."""

import math
import statistics

from servelab.lessons import concurrency_target
from servelab.lessons.concurrency_target import Step, StepLoad
from servelab.lessons.expectations import Outcome
from servelab.ray.watch import ServeSample
from tests.helpers import synthetic_run
from tests.helpers.lessons import outcomes

AUTOSCALING = {
    "target_ongoing_requests": 1.5,
    "min_replicas": 1,
    "max_replicas": 2,
    "upscale_delay_s": 2,
    "downscale_delay_s": 5,
    "look_back_period_s": 4,
    "metrics_interval_s": 1,
}
MAX_ONGOING = 4
HARDWARE = "2 CPU core(s) and no GPU"  # what the checks' reasons name, set rather than read from this machine


def sample(t_s, running, ongoing, queued=0.0, starting=0, in_ms_total=0.0, in_count_total=0.0, cpu=80.0):
    replicas = {"RUNNING": running, **({"STARTING": starting} if starting else {})}
    return ServeSample(t_s, replicas, ongoing, queued, in_ms_total, in_count_total, cpu)


def step_load(replicas_at, ongoing_at, queued_at=lambda t: 0.0):
    """One sample a second for 70 s; `replicas_at(t)` gives (running, starting)."""
    return [sample(t, replicas_at(t)[0], ongoing_at(t), queued_at(t), replicas_at(t)[1]) for t in range(71)]


def steps(clients=(1, 3, 12, 1), bounds=((0, 10), (10, 25), (25, 40), (40, 70))):
    return [Step(start, end, c, synthetic_run("ray_serve", c)) for (start, end), c in zip(bounds, clients, strict=True)]


def as_predicted(t):  # the second replica decided 6 s into the 3-client step, running 5 s later, gone at 56 s
    return (1, 1) if 16 <= t < 21 else (2, 0) if 21 <= t < 56 else (1, 0)


def load(t):  # one request per client in the system; the replicas hold 4 each, the rest queue
    return 1.0 if t <= 10 or t > 40 else 3.0 if t <= 25 else 8.0


def test_an_autoscaler_that_follows_the_target_holds_every_condition():
    held = concurrency_target.scales_on_the_target(StepLoad(step_load(as_predicted, load), steps(), AUTOSCALING))
    assert outcomes(held) == [Outcome.HELD] * 3, held
    assert held.conditions[1].figures[0].value == 3.0  # per replica, 11 to 20 s


def test_a_prompt_scale_up_is_judged_before_the_second_replica_ran_not_over_the_whole_step():
    def prompt(t):
        return (1, 1) if t == 12 else (2, 0) if 13 <= t < 56 else (1, 0)

    def settled(t):  # once two replicas run, the 3 clients keep 2.6 requests in Serve: 1.3 per replica
        return 2.6 if 13 <= t <= 25 else load(t)

    samples = step_load(prompt, settled)
    whole_step = statistics.fmean(s.per_replica for s in samples if 10 <= s.t_s <= 25)
    assert whole_step <= AUTOSCALING["target_ongoing_requests"]  # the former check's window: it failed
    held = concurrency_target.scales_on_the_target(StepLoad(samples, steps(), AUTOSCALING))
    assert outcomes(held) == [Outcome.HELD] * 3, held
    assert [item.value for item in held.conditions[1].figures] == [3.0, 1]  # the sample at 12 s, after SETTLE_S


def test_a_load_that_never_exceeded_the_target_fails():
    def light(t):  # a lighter load: 1.2 requests per replica, below the target of 1.5
        return 1.2 if 10 < t <= 25 else load(t)

    failed = concurrency_target.scales_on_the_target(StepLoad(step_load(as_predicted, light), steps(), AUTOSCALING))
    assert outcomes(failed) == [Outcome.HELD, Outcome.NOT_HELD, Outcome.HELD]
    assert "metrics_interval_s (1 s here)" in failed.reason


def test_a_replica_never_added_or_never_removed_fails_the_removal():
    never = concurrency_target.scales_on_the_target(StepLoad(step_load(lambda t: (1, 0), load), steps(), AUTOSCALING))
    assert outcomes(never)[2] is Outcome.NOT_HELD  # nothing to remove is not a removal
    kept = concurrency_target.scales_on_the_target(
        StepLoad(step_load(lambda t: (1, 0) if t < 16 else (2, 0), load), steps(), AUTOSCALING)
    )
    assert outcomes(kept)[2] is Outcome.NOT_HELD
    assert [item.value for item in kept.conditions[2].figures] == [2, 2]


def test_no_sample_before_the_second_replica_ran_is_not_checked():
    at_once = concurrency_target.scales_on_the_target(
        StepLoad(step_load(lambda t: (2, 0) if 11 <= t < 56 else (1, 0), load), steps(), AUTOSCALING)
    )
    assert outcomes(at_once)[1] is Outcome.NOT_CHECKED


# ---- the two rules for when to scale: target below the cap (Ray's practice), at the cap (Baseten's)

AT_CAP = {**AUTOSCALING, "target_ongoing_requests": MAX_ONGOING}


def at_cap_steps(clients=(1, 3, 12)):
    return steps(clients, ((0, 5), (5, 20), (20, 35)))


def at_cap_load(
    replicas_at,
    inside_at=lambda t: 1.0 if t <= 5 else 3.0 if t <= 20 else 4.0,
    queued_at=lambda t: 8.0 if t > 20 else 0.0,
):
    """The target-at-the-cap load, one sample a second for 35 s; 12 clients fill the replica and 8 queue."""
    return [sample(t, replicas_at(t)[0], inside_at(t), queued_at(t), replicas_at(t)[1]) for t in range(36)]


def when_full(t):  # the second replica decided 4 s into the step of 12 clients, running 5 s later
    return (1, 1) if 24 <= t < 29 else (2, 0) if t >= 29 else (1, 0)


def rules(below_samples, at_cap_samples, below_steps=None, at_cap=None):
    return concurrency_target.scaling_rules(
        StepLoad(below_samples, below_steps or steps(), AUTOSCALING),
        StepLoad(at_cap_samples, at_cap or at_cap_steps(), AT_CAP),
        MAX_ONGOING,
    )


def test_each_rule_adding_its_replica_as_it_says_holds_every_condition():
    held = rules(step_load(as_predicted, load), at_cap_load(when_full))
    assert outcomes(held) == [Outcome.HELD] * 3, held
    assert held.conditions[0].detail == "added 6 s into the step of 3 clients"
    assert [item.value for item in held.conditions[0].figures] == [3, 3.0, 0.0]
    assert held.conditions[2].detail == "added 4 s into the step of 12 clients"
    assert [item.value for item in held.conditions[2].figures] == [12, 4.0, 8.0]


def test_full_replicas_read_from_the_queue_in_front_not_from_one_snapshot_inside():
    """Measured (session 47): 12 clients, 4.5 queued in front on average, while no one-second
    snapshot read the replica at its cap of 4. The router queues only for full replicas: it held."""
    snapshots = at_cap_load(when_full, inside_at=lambda t: 1.0 if t <= 5 else 3.0)
    held = rules(step_load(as_predicted, load), snapshots)
    assert outcomes(held) == [Outcome.HELD] * 3, held
    assert [item.value for item in held.conditions[2].figures] == [12, 3.0, 8.0]


def test_a_low_target_that_waited_for_a_full_replica_fails():
    """The wrong outcome for Ray's practice: with the target at 1.5, Serve added the replica only once
    12 clients had filled the replica and queued, as if the cap triggered scaling."""

    def late(t):
        return (1, 1) if 28 <= t < 32 else (2, 0) if 32 <= t < 56 else (1, 0)

    failed = rules(step_load(late, load, lambda t: 4.0 if 25 < t <= 40 else 0.0), at_cap_load(when_full))
    assert outcomes(failed) == [Outcome.NOT_HELD, Outcome.HELD, Outcome.HELD]
    assert failed.conditions[0].detail == "added 3 s into the step of 12 clients"


def test_a_target_at_the_cap_that_scaled_below_the_cap_fails():
    """The wrong outcome for Baseten's rule: with the target at the cap, Serve added a replica while
    3 clients left the replica short of its 4 and nothing waited in front, as with the lower target."""

    def early(t):
        return (1, 1) if 11 <= t < 16 else (2, 0) if t >= 16 else (1, 0)

    failed = rules(step_load(as_predicted, load), at_cap_load(early))
    assert outcomes(failed) == [Outcome.HELD, Outcome.HELD, Outcome.NOT_HELD]
    assert [item.value for item in failed.conditions[2].figures] == [3, 3.0, 0.0]
    # The same full replica whose queue stayed under one request on average: not the rule either.
    fleeting = rules(step_load(as_predicted, load), at_cap_load(when_full, queued_at=lambda t: 0.5 if t > 20 else 0))
    assert outcomes(fleeting)[2] is Outcome.NOT_HELD


def test_a_target_at_the_cap_that_never_scaled_fails_and_leaves_its_timing_not_checked():
    never = rules(step_load(as_predicted, load), at_cap_load(lambda t: (1, 0)))
    assert outcomes(never) == [Outcome.HELD, Outcome.NOT_HELD, Outcome.NOT_CHECKED]
    assert never.conditions[2].detail == "with target 4, Serve added no replica: no addition to time"


def test_the_rules_are_not_checked_where_their_premise_did_not_arise():
    # Two replicas left from the run before: already during the first step, nothing to add.
    crowded = rules(step_load(lambda t: (2, 0), load), at_cap_load(lambda t: (2, 0)))
    assert outcomes(crowded) == [Outcome.NOT_CHECKED] * 3
    assert crowded.conditions[0].detail == (
        "with target 1.5, 2 replicas ran or started already during the first step (1 client(s)): no addition to time"
    )
    # No step had more clients than the replica holds: nothing could fill it, nor queue.
    few = rules(step_load(as_predicted, load), at_cap_load(lambda t: (1, 0)), at_cap=at_cap_steps((1, 3, 4)))
    assert outcomes(few) == [Outcome.HELD, Outcome.NOT_CHECKED, Outcome.NOT_CHECKED]
    assert few.conditions[1].detail == "no step had more than 4 clients, for 1 replica(s) of 4: nothing could fill them"


def queue_samples(in_replica_ms_12, queued_12):
    """The step load with Serve's running totals of time in the replica: 20 ms a request with one
    client, `in_replica_ms_12` with twelve."""
    samples, ms, count = [], 0.0, 0.0
    for t in range(71):
        per_request, served = (in_replica_ms_12, 60) if 25 < t <= 40 else (20.0, 40)
        ms, count = ms + per_request * served, count + served
        running = 2 if 20 <= t < 56 else 1
        queued = queued_12 if 25 < t <= 40 else 0.0
        samples.append(sample(t, running, load(t), queued, in_ms_total=ms, in_count_total=count))
    return samples


def queue_steps(client_ms_1=24.0, client_ms_12=200.0):
    return [
        Step(0, 10, 1, synthetic_run("ray_serve, 1", 1, 40, client_ms_1)),
        Step(10, 25, 3, synthetic_run("ray_serve, 3", 3, 60, 50)),
        Step(25, 40, 12, synthetic_run("ray_serve, 12", 12, 60, client_ms_12)),
        Step(40, 70, 1, synthetic_run("ray_serve, 1 again", 1, 40, client_ms_1)),
    ]


def queue_in_front(samples, steps, max_ongoing):
    return concurrency_target.queue_in_front(StepLoad(samples, steps, AUTOSCALING), max_ongoing)


def test_requests_waiting_in_front_hold_the_queue_check():
    held = queue_in_front(queue_samples(120.0, 3.0), queue_steps(), MAX_ONGOING)
    assert outcomes(held) == [Outcome.HELD] * 3, held
    assert held.conditions[1].detail == "outside 40%, expected about 33% = 1 - 2 x 4 / 12"
    assert held.conditions[2].detail == "outside 4.0 ms against 80.0 ms"


def test_requests_waiting_inside_the_replicas_fail_the_queue_check():
    # No queue in front, and nearly all of a request's time spent inside a replica.
    failed = queue_in_front(queue_samples(190.0, 0.0), queue_steps(), MAX_ONGOING)
    assert outcomes(failed) == [Outcome.NOT_HELD] * 3
    assert [item.name for item in failed.conditions[0].figures] == ["queued in front, 12 clients (mean)"]
    assert failed.reason.startswith(
        "with 12 clients, Serve's gauges counted 7.7 requests inside the replicas and "
        "0.0 queued on average: the other 4.3 were in neither"
    )


def test_the_queue_check_is_not_checked_where_every_client_found_room_in_a_replica():
    # A cap of 8 on 2 replicas holds the 12 clients: nothing had to wait in front.
    roomy = queue_in_front(queue_samples(190.0, 0.0), queue_steps(), 8)
    assert outcomes(roomy) == [Outcome.NOT_CHECKED] * 3
    assert roomy.conditions[0].detail == (
        "12 clients, 2 replica(s) of 8 requests each: every request found room in a replica"
    )


def test_the_step_table_shows_each_step_from_serves_side_and_the_clients():
    load = StepLoad(queue_samples(120.0, 3.0), queue_steps(), AUTOSCALING)
    view = concurrency_target.step_view(load.samples, load.steps[2])  # 12 clients, samples 25 to 40 s
    assert view["replicas (max)"] == 2
    assert math.isclose(view["queued (mean)"], 15 * 3.0 / 16)  # the sample at 25 s still read none
    assert math.isclose(view["in replica ms"], 120.0) and view["client ms"] == 200.0
    table = concurrency_target.step_table(load).splitlines()
    assert len(table) == 1 + len(load.steps)
    assert table[0].split()[0] == "step" and "client ms" in table[0]
    assert table[3].startswith("12 client(s), 25-40 s") and table[3].split()[-2:] == ["120.0", "200.0"]


def test_a_step_without_samples_reads_none():
    view = concurrency_target.step_view([], queue_steps()[0])
    assert view["replicas (max)"] == 0 and math.isnan(view["queued (mean)"]) and math.isnan(view["in replica ms"])


def slot_run(cap, throughput_rps, inferences, inference_ms, slot_wait_ms):
    stats = {
        "stage_counts": {"inference": inferences},
        "stage_mean_ms": {"inference": inference_ms, "slot_wait": slot_wait_ms},
    }
    name = f"ray_serve, max_ongoing_requests {cap}"
    return synthetic_run(name, 4, throughput_rps, 4000 / throughput_rps, wall_s=5.0, service_stats=stats)


def watched(queued, cpu=80.0):
    return [sample(t, 1, 1.0, queued, cpu=cpu) for t in range(5)]


def test_slots_filling_with_room_in_the_replica_hold_every_condition():
    runs = {1: slot_run(1, 25, 125, 8.3, 0.7), 2: slot_run(2, 48, 240, 10.6, 2.2), 4: slot_run(4, 84, 420, 15.2, 4.6)}
    held = concurrency_target.slots_need_room(runs, {1: watched(2.2), 2: watched(1.4), 4: watched(0.4)}, 2)
    assert outcomes(held) == [Outcome.HELD] * 4, held
    assert held.conditions[1].detail == "0.21 -> 0.51 -> 1.28"
    assert math.isclose(concurrency_target.busy_slots(runs[4]), 420 * 15.2 / 1000 / 5)


def test_the_slot_table_has_a_row_per_cap():
    runs = {1: slot_run(1, 25, 125, 8.3, 0.7), 4: slot_run(4, 84, 420, 15.2, 4.6)}
    table = concurrency_target.slot_table(runs, {1: watched(2.2), 4: watched(0.4)}).splitlines()
    assert len(table) == 3 and "busy slots" in table[0]
    assert table[2].split()[:5] == ["4", "84.0", "1.28", "0.40", "4.6"]
    assert table[2].split()[-1] == "15.2"


def test_slots_that_fill_whatever_the_cap_fail():
    # What one would expect if PREDICT_CONCURRENCY alone decided: both slots busy even with room for one
    # request in the replica, nothing waiting in front, no gain from a larger cap.
    runs = {1: slot_run(1, 84, 420, 15.2, 4.6), 2: slot_run(2, 84, 420, 15.2, 4.6), 4: slot_run(4, 84, 420, 15.2, 4.6)}
    failed = concurrency_target.slots_need_room(runs, {cap: watched(0.0, cpu=99.0) for cap in runs}, 2)
    assert outcomes(failed) == [Outcome.NOT_HELD, Outcome.NOT_HELD, Outcome.HELD, Outcome.NOT_HELD]
    assert "CPU samples read 99%" in failed.reason


def test_slots_need_room_is_not_checked_where_serve_had_room_for_every_client():
    runs = {cap: slot_run(cap, 84, 420, 15.2, 4.6) for cap in (1, 2, 4)}
    for run in runs.values():
        run.concurrency = 1  # one client: never more requests than the lowest cap
    judged = concurrency_target.slots_need_room(runs, {cap: watched(0.0) for cap in runs}, 2)
    assert [outcomes(judged)[i] for i in (0, 3)] == [Outcome.NOT_CHECKED] * 2
    assert "1 client(s) for max_ongoing_requests 1" in judged.conditions[0].detail


def queue_run(p50_ms, refused=0, refusal_ms=2.0, error="http_503"):
    """A closed-loop run: answers with a median of `p50_ms`, and `refused` refusals of `refusal_ms` each."""
    timeline = [[0.1 * n, p50_ms, "ok"] for n in range(40)] + [[0.1 * n, refusal_ms, error] for n in range(refused)]
    return synthetic_run("x", 16, 20, p50_ms, errors={error: refused} if refused else {}, timeline=timeline)


def test_a_bounded_queue_holds_one_rule_for_every_engine():
    # 16 clients, 2 slots and a queue of 2: answers 40 ms (p95 48), refusals 2 ms; unbounded 200 ms (p95 240).
    for engine, refusal in (("Ray Serve", "http_503"), ("Triton", None)):
        held = concurrency_target.bounded_queue_refuses(engine, queue_run(40, 30), queue_run(200), 2, refusal, HARDWARE)
        assert outcomes(held) == [Outcome.HELD] * 4, held
        assert held.conditions[3].detail == "x0.20"
        assert (
            held.estimate is not None
            and held.estimate.value == held.conditions[3].figures[0].value / held.conditions[3].figures[1].value
        )


def test_a_bounded_queue_s_reason_names_the_machine_and_triton_s_own_account_of_the_wait():
    ray = concurrency_target.bounded_queue_refuses(
        "Ray Serve", queue_run(40, 30), queue_run(200), 2, "http_503", HARDWARE
    )
    assert ray.reason.startswith(f"on {HARDWARE}, the 16 clients and their refusals share the cores with Ray Serve")
    counted = queue_run(40, 30)
    counted.triton_stats = {"avg_queue_us": 1500.0, "avg_compute_infer_us": 12000.0}
    triton = concurrency_target.bounded_queue_refuses("Triton", counted, queue_run(200), 2, None, HARDWARE)
    assert triton.reason.endswith(
        "with the queue of 2 an answered request waited 1.5 ms in Triton's queue on average for 12.0 ms of computing"
    )


def test_a_bounded_queue_whose_answers_wait_nearly_as_long_fails_the_p95():
    """The wrong outcome Triton's former rule ("lower") passed: the bound refuses, yet the answered
    requests wait 80% as long as with no bound (p95 192 against 240 ms)."""
    failed = concurrency_target.bounded_queue_refuses("Triton", queue_run(160, 30), queue_run(200), 2, None, HARDWARE)
    assert outcomes(failed) == [Outcome.HELD, Outcome.HELD, Outcome.HELD, Outcome.NOT_HELD]
    # Refusals that waited in line (a timeout, not a full queue), and a refusal of another kind.
    slow = concurrency_target.bounded_queue_refuses(
        "Ray Serve", queue_run(40, 30, 35.0), queue_run(200), 2, "http_503", HARDWARE
    )
    assert outcomes(slow)[1] is Outcome.NOT_HELD
    other = concurrency_target.bounded_queue_refuses(
        "Ray Serve", queue_run(40, 30, error="http_500"), queue_run(200), 2, "http_503", HARDWARE
    )
    assert outcomes(other)[0] is Outcome.NOT_HELD


def test_a_bound_that_refused_nothing_leaves_its_effects_not_checked():
    never = concurrency_target.bounded_queue_refuses("Triton", queue_run(90), queue_run(200), 2, None, HARDWARE)
    assert outcomes(never) == [Outcome.NOT_HELD, Outcome.NOT_CHECKED, Outcome.HELD, Outcome.NOT_CHECKED]
    assert never.conditions[3].detail.startswith("the queue of 2 refused nothing")
