"""Notebooks 6 and 7's checks (servelab.lessons.triton_bench), each fed a case it must pass and one it
must fail (what the notebooks show beside them: tests/test_lessons_triton_bench_views.py)."""

import math

import pytest

from servelab.lessons import triton_bench
from servelab.lessons.expectations import AnswerError, Estimate, Outcome
from tests.helpers.lessons import outcomes, perf_run, poisson


def timed(decode_ms, forward_ms):
    """Triton's statistics of a run whose model timed its own stages (model.py's StageClock)."""
    return {"stage_mean_ms": {"decode": decode_ms, "forward": forward_ms}}


def test_client_batching_is_judged_on_the_model_s_forward_pass_not_on_its_decoding():
    """A GPU: the forward pass of 16 images costs 1.5x that of 1, but decoding them one after another
    costs 16x: Triton's compute infer (both) grows 5.5x, and only the forward pass is the lesson's."""
    single = perf_run(throughput_rps=80, mean_ms=12.5, compute_ms=11, triton_stats=timed(3, 8))
    batched = perf_run(throughput_rps=12.5, mean_ms=80, compute_ms=60, batch_size=16, triton_stats=timed(48, 12))
    held = triton_bench.client_batching(single, batched, "1 GPU", cores=8)
    assert outcomes(held) == [Outcome.HELD, Outcome.HELD]  # 200 images/s against 80
    assert held.conditions[0].detail == "1.5x" and held.conditions[1].detail == "x2.50"
    assert "model.py decoded 16 images in 48.0 ms, one after another, against 3.0 ms for 1" in held.reason
    # The forward pass of 16 costs 14x that of 1 (a CPU): the claim fails on the model's own clock.
    costly = perf_run(throughput_rps=2.3, mean_ms=400, compute_ms=350, batch_size=16, triton_stats=timed(30, 112))
    failed = triton_bench.client_batching(single, costly, "2 CPU cores", cores=2)
    assert outcomes(failed) == [Outcome.NOT_HELD, Outcome.NOT_HELD]
    assert failed.conditions[0].detail == "14.0x"
    assert "the instances' CPU is not known here" in failed.reason  # no instance CPU sampled


def test_client_batching_without_the_model_s_own_clock_is_not_judged_on_compute_infer():
    single, batched = perf_run(throughput_rps=34), perf_run(throughput_rps=10, batch_size=16)
    unclocked = triton_bench.client_batching(single, batched, "1 GPU", cores=8)
    assert outcomes(unclocked) == [Outcome.NOT_CHECKED, Outcome.HELD]  # 160 images/s against 34
    assert "reported no time of its own stages" in unclocked.conditions[0].detail


def test_client_batching_with_no_batched_measurement_is_not_checked():
    single = perf_run()
    assert triton_bench.client_batching(single, None, "cpu", 2).outcome is Outcome.NOT_CHECKED


def test_instance_scaling_reason_reads_the_instances_cpu():
    def with_cpu(rps, percents):
        series = {"t_s": [0, 1], "cpu_percent": [90, 90], "memory_percent": [5, 5], "gpus": [], "gpu_source": "none"}
        processes = {f"instance {n}": percent for n, percent in enumerate(percents)}  # ProcessCpu's reading
        return perf_run(throughput_rps=rps, resources={**series, "processes": processes})

    failed = triton_bench.instance_scaling(with_cpu(120, [190]), with_cpu(110, [95, 95]), 2, "2 CPU cores", 2)
    assert failed.outcome is Outcome.NOT_HELD
    assert "1 instance: the instances used 190% of a core, of the 200%" in failed.reason
    held = triton_bench.instance_scaling(with_cpu(60, [100]), with_cpu(110, [95, 95]), 2, "2 CPU cores", 2)
    assert held.outcome is Outcome.HELD


def test_instance_scaling_takes_a_gain_within_the_noise_for_none():
    """The wrong outcome it must fail: two runs of the same capacity, the second 3% faster by chance."""
    assert triton_bench.instance_scaling(perf_run(100), perf_run(103), 2, "cpu", 2).outcome is Outcome.NOT_HELD
    gained = triton_bench.instance_scaling(perf_run(100), perf_run(125), 2, "cpu", 2)
    assert gained.outcome is Outcome.HELD and gained.estimate is not None and gained.estimate.value == 1.25
    assert triton_bench.instance_scaling(None, perf_run(125), 2, "cpu", 2).outcome is Outcome.NOT_CHECKED


def test_eight_instances_do_no_better_than_four_as_the_original_lab_says():
    def judged(one, four, eight):
        runs = {1: perf_run(one), 4: perf_run(four), 8: perf_run(eight)}
        return outcomes(triton_bench.instances_stop_helping(runs, "2 CPU cores", 2))

    assert judged(10, 20, 19) == [Outcome.HELD, Outcome.HELD]  # 4 used the idle cores, 8 only take turns
    assert judged(10, 20, 21) == [Outcome.HELD, Outcome.HELD]  # 5% more: within the noise
    # The wrong outcome the old rule passed: perfect linear scaling (x4, then x2, a "smaller factor").
    assert judged(10, 40, 80) == [Outcome.HELD, Outcome.NOT_HELD]
    assert judged(10, 10.5, 10) == [Outcome.NOT_HELD, Outcome.HELD]  # 4 gained only noise over 1
    missing = triton_bench.instances_stop_helping({1: perf_run(10), 4: perf_run(20), 8: None}, "cpu", 2)
    assert outcomes(missing) == [Outcome.HELD, Outcome.NOT_CHECKED]


def test_the_instance_counts_judged_are_those_the_student_typed():
    typed = triton_bench.instances_stop_helping({6: perf_run(21), 1: perf_run(10), 2: perf_run(20)}, "2 CPU cores", 2)
    assert outcomes(typed) == [Outcome.HELD, Outcome.HELD]
    assert [condition.text for condition in typed.conditions] == [
        "from 1 instance to 2, throughput rises by more than 10%",
        "6 instances do no better than 2: at most 10% more requests per second (within the noise), or fewer",
    ]
    with pytest.raises(AnswerError, match=r"Triton ran 2 different ones \(1, 4\): a count was typed twice") as twice:
        triton_bench.instances_stop_helping({1: perf_run(10), 4: perf_run(20)}, "cpu", 2)
    # In a notebook, IPython shows what to change, not a traceback.
    assert twice.value._render_traceback_()[-1].startswith("Type another count in one instance_group above")


def test_onnx_against_python_at_one_client_is_judged_once_on_the_mean():
    """At c=1 the throughput is 1 / the mean latency: one condition, not the same number twice."""
    faster = triton_bench.onnx_beats_python(perf_run(50, 20, compute_ms=12), perf_run(33, 30, compute_ms=25), "cpu")
    assert outcomes(faster) == [Outcome.HELD]
    assert faster.estimate is not None and faster.estimate.value == 1.5  # 30 ms against 20: a number to predict
    assert faster.reason == (
        "on cpu, a request to the ONNX model spent 12.0 ms in its compute infer and 8.0 ms around it (the network, "
        "the upload, Triton's handling), against 25.0 ms (decoding the JPEG included) and 5.0 ms for the "
        "Python-backend model: each ONNX request carries 602 KB of float32 pixels instead of a compressed JPEG"
    )
    slower = triton_bench.onnx_beats_python(perf_run(25, 40), perf_run(33, 30), "1 GPU")
    assert outcomes(slower) == [Outcome.NOT_HELD] and "on 1 GPU" in slower.reason  # the JPEG upload was cheaper
    # The ratio beside the verdict is the prediction's, the Python mean over the ONNX mean, either way.
    assert faster.conditions[0].detail == "Python / ONNX = 1.50x" and "1.50x" in str(faster)
    assert slower.conditions[0].detail == "Python / ONNX = 0.75x" and slower.estimate.value == 0.75
    assert triton_bench.onnx_beats_python(None, perf_run(33, 30), "cpu").outcome is Outcome.NOT_CHECKED


def test_a_check_left_without_the_machine_reads_it_where_it_runs(monkeypatch):
    """A notebook leaves `hardware` and `cores` out: the reason names the machine the check ran on."""
    monkeypatch.setattr(triton_bench.checks_queueing, "machine_hardware", lambda: "3 CPU core(s) and no GPU")
    monkeypatch.setattr(triton_bench.checks_queueing, "machine_cores", lambda: 3)
    held = triton_bench.queueing_grows(concurrency_runs((0.1, 175, 375), (25, 26, 27), (38, 38, 38)))
    assert "3 CPU core(s) and no GPU (3 cores)" in held.reason


def test_the_queue_is_judged_only_where_requests_queued_without_batching():
    without = {
        "50 req/s": poisson(50, 8, 0.5, 6),
        "75 req/s": poisson(75, 10, 3, 6),
        "100 req/s": poisson(100, 20, 10, 6),
    }
    with_on = {
        "50 req/s": poisson(50, 9, 0.6, 6),
        "75 req/s": poisson(75, 11, 4, 6),
        "100 req/s": poisson(100, 12, 3, 7),
    }
    held = triton_bench.batching_shortens_the_queue(without, with_on, "2 CPU cores")
    # 50 and 75 req/s queued 0.5 and 3 ms for 6 ms of compute: most requests found the instance
    # idle, too little to judge (75's longer queue with batching is noise), and the claim says so.
    assert [part.text for part in held.conditions] == ["at 100 req/s, batching lowers the time in the queue"]
    assert held.outcome is Outcome.HELD and "left out" in held.claim
    assert "50 req/s (0.50 ms queue, 6.00 ms compute), 75 req/s" in held.claim
    assert held.estimate is not None and held.estimate.value == 0.3  # at the highest rate: 3 ms against 10
    longer = {**with_on, "100 req/s": poisson(100, 25, 12, 6, batches={1: 10, 4: 30}, per_image={1: 6, 4: 6})}
    failed = triton_bench.batching_shortens_the_queue(without, longer, "2 CPU cores")
    assert failed.outcome is Outcome.NOT_HELD
    assert failed.reason.startswith(
        "at 100 req/s, a request waited 12.00 ms in the queue with batching against 10.00 ms without; in the "
        "batches of 4 that served most images, an image cost 6.00 ms of compute against 6.00 ms alone (+0% saved)"
    )


@pytest.mark.parametrize("skipped_rates", [False, True])
def test_a_queue_that_did_not_shorten_is_never_explained_as_not_judged(skipped_rates):
    """Under DID NOT HOLD, the reason says why the judged rate's queue stayed, never that a rate was
    not judged (the rates left out are in the claim, above the verdict)."""
    without = {"100 req/s": poisson(100, 20, 10, 6)}
    longer = {"100 req/s": poisson(100, 25, 12, 6)}  # only batches of 1 ran
    if skipped_rates:
        without, longer = (
            {"50 req/s": poisson(50, 8, 0.5, 6), **without},
            {"50 req/s": poisson(50, 8, 0.6, 6), **longer},
        )
    failed = triton_bench.batching_shortens_the_queue(without, longer, "2 CPU cores")
    shown = str(failed)
    assert failed.outcome is Outcome.NOT_HELD and "Why: at 100 req/s, a request waited 12.00 ms" in shown
    assert "no batch larger than 1 ran on 2 CPU cores" in failed.reason
    under_the_verdict = shown.split("DID NOT HOLD", 1)[1]
    assert "not judged" not in under_the_verdict.lower() and "too little" not in under_the_verdict


def test_with_no_queue_worth_shortening_the_queue_check_is_not_checked_rather_than_held():
    quiet = {"50 req/s": poisson(50, 8, 0.1, 6)}
    skipped = triton_bench.batching_shortens_the_queue(quiet, quiet)
    assert skipped.outcome is Outcome.NOT_CHECKED
    assert (
        skipped.conditions[0].detail == "without batching, no rate queued enough to judge: 50 req/s (0.10 ms "
        "queue, 6.00 ms compute)"
    )


def test_flat_latency_holds_on_cheap_batches_and_fails_with_its_reason_read_from_the_per_batch_costs():
    without = {"50 req/s": poisson(50, 8, 1, 6), "150 req/s": poisson(150, 40, 30, 6)}
    cheap = {
        "50 req/s": poisson(50, 8, 1, 6),
        "150 req/s": poisson(150, 10, 2, 3, batches={1: 10, 4: 30}, per_image={1: 6, 4: 2}),
    }
    held = triton_bench.batching_keeps_latency_flat(without, cheap, "1 GPU")
    assert held.outcome is Outcome.HELD
    assert held.estimate is not None and held.estimate.value == 10 / 8  # the mean with batching, 8 ms to 10
    assert "2.00 ms of compute in the batches of 4" in held.reason and "+67% saved" in held.reason
    costly = {
        "50 req/s": poisson(50, 8, 1, 6),
        "150 req/s": poisson(150, 45, 5, 12, batches={1: 10, 4: 30}, per_image={1: 6, 4: 6}),
    }
    failed = triton_bench.batching_keeps_latency_flat(without, costly, "2 CPU cores")
    assert outcomes(failed) == [Outcome.NOT_HELD, Outcome.NOT_HELD]
    assert "+0% saved" in failed.reason and "moves a request's wait" in failed.reason


def test_batch_cost_is_read_back_from_a_saved_run_whose_batch_sizes_are_strings():
    run = poisson(150, 10, 2, 3, batches={"1": 10, "4": 30}, per_image={"1": 6.0, "4": 2.0})
    size, cost = triton_bench.batch_cost(run)
    assert (size, cost.value) == (4, 2.0)
    assert math.isnan(triton_bench.batch_cost(poisson(50, 8, 1, 6))[1].value)  # only batches of 1 ran


def test_flat_latency_is_not_checked_where_the_runs_without_batching_never_queued():
    """The vacuous pass it must not give: a sweep whose highest rate left the instance idle, where
    the latency stays flat with batching or without."""
    idle = {"50 req/s": poisson(50, 8, 0.2, 6), "150 req/s": poisson(150, 8.5, 0.5, 6)}
    on = {"50 req/s": poisson(50, 8, 0.2, 6), "150 req/s": poisson(150, 8.2, 0.3, 6)}
    skipped = triton_bench.batching_keeps_latency_flat(idle, on, "cpu")
    assert outcomes(skipped) == [Outcome.NOT_CHECKED, Outcome.NOT_CHECKED]
    assert skipped.conditions[0].detail.startswith("without batching, requests hardly queued at 150 req/s (0.50 ms")


def concurrency_runs(queues, computes, throughputs):
    return {
        c: perf_run(throughput_rps=x, queue_ms=q, compute_ms=m, concurrency=c)
        for c, q, m, x in zip((1, 8, 16), queues, computes, throughputs, strict=True)
    }


def test_queueing_grows_with_the_clients_while_compute_stays():
    # One instance at 25 ms: each added client waits about one more compute time.
    held = triton_bench.queueing_grows(concurrency_runs((0.1, 175, 375), (25, 26, 27), (38, 38, 38)), "2 CPU cores", 2)
    assert outcomes(held) == [Outcome.HELD] * 3
    assert held.conditions[0].detail == "+7.0 compute times"
    assert "2 CPU cores (2 cores)" in held.reason and "held 15.3 requests at a time" in held.reason


def test_a_compute_that_fell_under_load_is_said_as_the_range_that_failed_the_condition():
    """Notebook 6 on a busy machine: compute infer 57.9 ms at c=1, 38.5 at c=16 (highest / lowest
    1.50). The reason under DID NOT HOLD names that range, not "from 57.9 to 57.9 ms"."""
    slower_first = concurrency_runs((0.14, 282.9, 568.8), (57.9, 40.7, 38.5), (16.9, 24.4, 25.7))
    failed = triton_bench.queueing_grows(slower_first, "2 CPU cores", 2)
    assert outcomes(failed)[2] is Outcome.NOT_HELD and failed.conditions[2].detail == "highest / lowest = 1.50"
    assert "compute infer ranged from 38.5 ms at c=16 to 57.9 ms at c=1" in failed.reason


def test_queueing_fails_where_the_time_moves_into_compute_instead_of_the_queue():
    """The wrong outcome: the server runs the requests together, each computing 8 or 16 times
    longer, and nothing waits in its queue (0.1 to 0.3 ms: a bare `<` would pass on that)."""
    slices = triton_bench.queueing_grows(concurrency_runs((0.1, 0.2, 0.3), (25, 200, 400), (38, 38, 38)), "cpu", 2)
    assert outcomes(slices) == [Outcome.NOT_HELD] * 3
    # A queue that forms at 8 clients and does not grow further: the second step fails alone.
    capped = triton_bench.queueing_grows(concurrency_runs((0.1, 175, 180), (25, 25, 25), (38, 38, 38)), "cpu", 2)
    assert outcomes(capped) == [Outcome.HELD, Outcome.NOT_HELD, Outcome.HELD]


def test_queueing_is_not_checked_where_the_server_never_held_a_second_request_or_a_run_is_missing():
    """The load generator, not the server, was the bottleneck: at 16 clients Triton held one
    request at a time at most, so no queue could form and a flat compute time says nothing."""
    idle = triton_bench.queueing_grows(concurrency_runs((0.1, 0.2, 0.3), (25, 25, 25), (20, 30, 35)), "cpu", 2)
    assert outcomes(idle) == [Outcome.NOT_CHECKED] * 3
    assert idle.conditions[0].detail.startswith("at c=16, Triton held 0.89 requests at a time on average, under 2")
    figures = ["throughput at c=16", "queue at c=16", "compute at c=16"]
    assert [item.name for item in idle.conditions[0].figures] == figures
    missing = concurrency_runs((0.1, 175, 375), (25, 26, 27), (38, 38, 38))
    missing[16] = None
    assert outcomes(triton_bench.queueing_grows(missing, "cpu", 2)) == [Outcome.HELD] + [Outcome.NOT_CHECKED] * 2


def arrival_run(arrival, queue_ms, p95_ms, compute_ms=10.0, rate=36.0):
    open_loop = {"concurrency": None, "mode": "open", "rate_rps": rate, "arrival": arrival}
    return perf_run(rate, p95_ms / 1.5, queue_ms, compute_ms, **open_loop)


def test_poisson_arrivals_queue_more_than_constant_ones():
    # At 36% of capacity, M/D/1 puts the Poisson wait near 0.28 of a service time; constant, 0.
    constant, poisson = arrival_run("constant", 0.2, 15), arrival_run("poisson", 2.8, 24)
    held = triton_bench.poisson_queues_more(constant, poisson, 36, 100, "2 CPU cores", 2)
    assert outcomes(held) == [Outcome.HELD, Outcome.HELD]
    assert held.estimate is not None and held.estimate.unit == "ms" and held.estimate.value == 2.8
    assert "at 36% of capacity (the instance computing 36% of the time)" in held.reason
    assert "2 CPU cores (2 cores)" in held.reason


def test_poisson_fails_where_constant_arrivals_clump_as_much():
    """The wrong outcome: the load generator cannot hold its constant schedule, and both queue
    alike; a bare `>` would pass on 2.0 against 1.95 ms and 16.5 against 16 ms."""
    constant, poisson = arrival_run("constant", 1.95, 16), arrival_run("poisson", 2.0, 16.5)
    failed = triton_bench.poisson_queues_more(constant, poisson, 36, 100, "cpu", 2)
    assert outcomes(failed) == [Outcome.NOT_HELD, Outcome.NOT_HELD]


def test_poisson_is_not_checked_where_neither_run_queued_or_one_is_missing():
    constant, poisson = arrival_run("constant", 0.02, 15), arrival_run("poisson", 0.05, 15.2)
    quiet = triton_bench.poisson_queues_more(constant, poisson, 5, 100, "1 GPU", 8)
    assert outcomes(quiet) == [Outcome.NOT_CHECKED] * 2
    assert quiet.conditions[1].detail == (
        "neither run queued: 0.05 and 0.02 ms, both under 10% of a 10.00 ms compute time, so neither can queue "
        "more than the other"
    )
    missing = triton_bench.poisson_queues_more(constant, None, 36, 100, "cpu", 2)
    assert outcomes(missing) == [Outcome.NOT_CHECKED] * 2
    assert missing.conditions[0].detail.startswith("not measured: poisson queue")


def test_the_queue_is_the_clients_ahead_times_the_compute_time():
    # One instance at 25 ms: at 8 clients a request waits for the 7 ahead, 175 ms; at 16, for 15.
    held = triton_bench.queue_is_the_clients_ahead(concurrency_runs((0.1, 175, 375), (25, 26, 27), (38, 38, 38)), "cpu")
    assert outcomes(held) == [Outcome.HELD, Outcome.HELD], "one client has nothing ahead: not judged"
    assert held.outcome is Outcome.HELD and held.conditions[0].detail == "queue / (7 x compute) = 0.96"
    only_one = {1: concurrency_runs((0.1, 1, 1), (25, 25, 25), (38, 38, 38))[1]}
    alone = triton_bench.queue_is_the_clients_ahead(only_one, "cpu")
    assert outcomes(alone) == [Outcome.NOT_CHECKED] and "no run with two or more clients: [1]" in str(alone)


def test_the_queue_is_not_the_clients_ahead_where_the_server_runs_them_together_or_something_else_queues():
    """The wrong outcomes: the server runs the requests together (no queue, each computing 8 or 16
    times longer), or a queue four times what the clients ahead explain."""
    together = concurrency_runs((0.1, 0.2, 0.3), (25, 200, 400), (38, 38, 38))
    assert outcomes(triton_bench.queue_is_the_clients_ahead(together, "cpu")) == [Outcome.NOT_HELD] * 2
    longer = concurrency_runs((0.1, 700, 390), (25, 25, 26), (38, 38, 38))
    assert outcomes(triton_bench.queue_is_the_clients_ahead(longer, "cpu")) == [Outcome.NOT_HELD, Outcome.HELD]


def test_the_queue_against_the_clients_ahead_is_not_checked_where_the_server_never_held_them():
    idle = triton_bench.queue_is_the_clients_ahead(concurrency_runs((0.1, 0.2, 0.3), (25, 25, 25), (20, 30, 35)), "cpu")
    assert outcomes(idle) == [Outcome.NOT_CHECKED] * 2
    assert idle.conditions[0].detail.startswith("Triton held 0.76 requests at a time on average, under 2")
    missing = concurrency_runs((0.1, 175, 375), (25, 26, 27), (38, 38, 38))
    missing[16] = None
    assert outcomes(triton_bench.queue_is_the_clients_ahead(missing, "cpu"))[1] is Outcome.NOT_CHECKED


def test_a_ratio_to_predict_over_nothing_is_not_measured_rather_than_an_error():
    assert Estimate.ratio("speedup", 30.0, 20.0).value == 1.5
    assert math.isnan(Estimate.ratio("speedup", 30.0, 0.0).value)  # a run that served nothing
