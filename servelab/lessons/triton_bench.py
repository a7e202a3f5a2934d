"""Notebook 6's checks: batches of images, instances, and dynamic batching on Triton.

Claims about what the model costs are judged on Triton's own statistics (perf_analyzer's
server-side breakdown, or the model's /stats around a run, with its per-batch-size compute
times), never on the client's latency, which also counts uploads and the network.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Protocol

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
from servelab.measure import queueing
from servelab.measure.resources import summarize
from servelab.results import RunResult


class Capacity(Protocol):
    """What `queueing_view` reads of a measured capacity (servelab.lab.triton_side.Capacity, which
    this layer does not import)."""

    alone: RunResult  # one client at a time
    saturated: RunResult  # enough clients to keep every instance busy

    @property
    def service_time_s(self) -> float: ...

    @property
    def service_cv2(self) -> float: ...


NOT_MEASURED = math.nan

# Two runs of the same setting differ by a few percent in throughput on a shared machine: a gain
# smaller than this is not taken for one, and "no better" allows this much.
MARGIN = 0.10


def instances_cpu(run: RunResult | None) -> float:
    """The CPU the model's instance processes used during `run`, in % of one core, summed over
    them; NaN where this notebook could not see them (in Docker, or no run)."""
    if run is None or not run.resources:
        return NOT_MEASURED
    processes = summarize(run.resources).get("processes") or {}
    return float(sum(processes.values())) if processes else NOT_MEASURED


def _cpu_said(name: str, run: RunResult | None, cores: int) -> str:
    used = instances_cpu(run)
    if math.isnan(used):
        return f"{name}: the instances ran out of this notebook's sight (their CPU is not known)"
    return f"{name}: the instances used {used:.0f}% of a core, of the {100 * cores}% this machine has"


def client_batching(single: RunResult | None, batched: RunResult | None, hardware: str, cores: int) -> Expectation:
    """One client, a request of 16 images against one of 1: Triton computes the 16 in less than
    twice the time of 1 (its compute infer, per request), and the client gets at least 4 times the
    images per second."""
    size = batched.batch_size if batched is not None else 16
    compute_batched = figure(batched, "server_ms(compute_infer)", f"compute infer, {size} images")
    compute_single = figure(single, "server_ms(compute_infer)", "compute infer, 1 image")
    rate_batched, rate_single = (
        figure(batched, "images_per_s", "batched"),
        figure(single, "images_per_s", "one at a time"),
    )
    ratio = compute_batched.value / compute_single.value
    per_image_batched = compute_batched.value / size
    return Expectation(
        f"a batch of {size} costs little more than a batch of 1",
        (
            condition(
                f"Triton computes a request of {size} images in less than twice the time of 1 image",
                ratio < 2,
                compute_batched,
                compute_single,
                detail=f"{ratio:.1f}x",
            ),
            condition(
                "so the client gets at least 4 times the images per second",
                rate_batched.value >= 4 * rate_single.value,
                rate_batched,
                rate_single,
            ),
        ),
        reason=f"on {hardware}, an image cost {per_image_batched:.1f} ms of compute infer in a batch of {size} "
        f"against {compute_single.value:.1f} ms alone (compute infer here includes model.py decoding each image); "
        f"{_cpu_said('with 1 image per request', single, cores)}. A batch pays where one image leaves the "
        "hardware idle: what the single-image run left unused is the most a batch could use",
    )


def instance_scaling(one: RunResult | None, more: RunResult | None, instances: int, hardware: str, cores: int):
    """Under load, `instances` instances serve more requests per second than one: by more than
    MARGIN, so that two runs of the same setting, differing by noise, do not pass."""
    one_rate, more_rate = (
        figure(one, "throughput_rps", "1 instance"),
        figure(more, "throughput_rps", f"{instances} instances"),
    )
    gain = more_rate.value / one_rate.value
    return Expectation(
        f"under load, {instances} instances of the ONNX model serve more than one",
        (
            condition(
                f"at 8 clients, {instances} instances serve more than {1 + MARGIN:.2f}x the requests per second "
                "of 1 (less is within the noise between two runs)",
                gain > 1 + MARGIN,
                one_rate,
                more_rate,
                detail=f"x{gain:.2f}",
            ),
        ),
        reason=f"on {hardware}: {_cpu_said('1 instance', one, cores)}; "
        f"{_cpu_said(f'{instances} instances', more, cores)}. More instances can only use what one left idle",
    )


def instances_stop_helping(runs: dict[int, RunResult | None], hardware: str, cores: int) -> Expectation:
    """The original lab's claim, on the Python-backend model at 8 clients, by instance count
    (`runs`: 1, 4 and 8 instances): more instances help while the hardware has idle capacity
    (4 serve more than 1, by more than MARGIN), and once it has none they only fight over it:
    8 do no better than 4 (at most MARGIN more, or fewer)."""
    rate = {count: figure(run, "throughput_rps", f"{count} instance{'s' * (count > 1)}") for count, run in runs.items()}
    one, four, eight = rate[1], rate[4], rate[8]
    rise, further = four.value / one.value, eight.value / four.value
    used = "; ".join(_cpu_said(f"with {count}", run, cores) for count, run in runs.items())
    return Expectation(
        "more Python-backend instances help while the hardware has idle capacity, and stop helping when it has none",
        (
            condition(
                f"from 1 instance to 4, throughput rises by more than {MARGIN:.0%}",
                rise > 1 + MARGIN,
                one,
                four,
                detail=f"x{rise:.2f}",
            ),
            condition(
                f"8 instances do no better than 4: at most {MARGIN:.0%} more requests per second (within the "
                "noise), or fewer",
                further <= 1 + MARGIN,
                four,
                eight,
                detail=f"x{further:.2f}",
            ),
        ),
        reason=f"on {hardware}: {used}. Where 4 instances left the cores idle, 8 use them; where 1 kept them busy, "
        "4 only take turns",
    )


def onnx_beats_python(onnx: RunResult | None, python: RunResult | None, onnx_behind_python: bool, hardware: str):
    """One client at a time, the ONNX model answers sooner than the Python-backend model: a lower
    mean latency. Its throughput is not judged beside it: with one client, each request starts as
    the last one ends, so requests per second are 1 / the mean latency, the same number again."""
    onnx_ms, python_ms = figure(onnx, "latency.mean_ms", "ONNX mean"), figure(python, "latency.mean_ms", "Python mean")
    return Expectation(
        "the ONNX Runtime model beats the Python-backend model at concurrency 1",
        (
            condition(
                "a lower mean latency (with one client, also more requests per second: 1 / the mean)",
                onnx_ms.value < python_ms.value,
                onnx_ms,
                python_ms,
                detail=f"x{onnx_ms.value / python_ms.value:.2f}",
            ),
        ),
        reason="this Triton has no ONNX Runtime backend: the ONNX model also runs behind the Python backend, and "
        "each of its requests carries 600 KB of float32 pixels instead of a compressed JPEG"
        if onnx_behind_python
        else f"on {hardware}, both models spend most of a request outside the network",
    )


def _queued_enough(off: RunResult) -> bool:
    """Whether requests queued enough without batching for batching to shorten it: a mean wait at
    least as long as the compute time, so that a request typically found another ahead of it.
    Below that, most requests found the instance idle, and a difference is noise."""
    return off.server_ms("queue") >= off.server_ms("compute_infer")


def batching_shortens_the_queue(without: dict[str, RunResult | None], with_batching: dict[str, RunResult | None]):
    """At each rate where requests queued without batching (a mean wait at least as long as the
    compute time), they wait less in Triton's queue with dynamic batching on."""
    conditions, skipped = [], []
    for name, off in without.items():
        on = with_batching.get(name)
        if off is None or on is None:
            conditions.append(condition(f"at {name}, batching lowers the time in the queue", False,
                                        figure(off, "server_ms(queue)", "queue off"),
                                        figure(on, "server_ms(queue)", "queue on")))  # fmt: skip
            continue
        if not _queued_enough(off):
            skipped.append(
                f"{name} ({off.server_ms('queue'):.2f} ms queue, {off.server_ms('compute_infer'):.2f} ms compute)"
            )
            continue
        queue_off, queue_on = figure(off, "server_ms(queue)", "queue off"), figure(on, "server_ms(queue)", "queue on")
        conditions.append(condition(f"at {name}, batching lowers the time in the queue",
                                    queue_on.value < queue_off.value, queue_off, queue_on))  # fmt: skip
    if not conditions:
        conditions.append(
            not_checked(
                "where requests queued without batching, batching lowers the time in the queue",
                "without batching, no rate queued enough to judge: " + ", ".join(skipped),
            )
        )
    return Expectation(
        "where requests queue, dynamic batching shortens the time they wait",
        tuple(conditions),
        reason="not judged, too little queueing without batching: " + ", ".join(skipped) if skipped else "",
    )


def batch_cost(run: RunResult | None) -> tuple[int, Figure]:
    """The batch size larger than 1 that served most images in `run` (Triton's statistics), and
    what an image cost in it; (1, NaN) where no larger batch ran."""
    stats = (run.triton_stats or {}) if run is not None else {}
    served = {int(size): int(size) * int(count) for size, count in stats.get("executions_by_batch_size", {}).items()}
    larger = {size: images for size, images in served.items() if size > 1}
    if not larger:
        return 1, measured("compute per image in a batch", NOT_MEASURED, "ms")
    size = max(larger, key=larger.__getitem__)
    field = f"triton_stats.compute_ms_per_inference_by_batch_size.{size}"
    return size, figure(run, field, f"compute per image, batches of {size}")


def batching_keeps_latency_flat(
    without: dict[str, RunResult | None], with_batching: dict[str, RunResult | None], hardware: str
) -> Expectation:
    """The seed's headline: with dynamic batching on, the mean latency stays roughly flat as the
    rate grows (the highest rate's at most 1.5x the lowest's), and grows less than without it.
    Both are NOT CHECKED where, without batching, requests hardly queued at the highest rate (see
    `_queued_enough`): a rate that never loaded the instance leaves the latency flat either way.
    The reason reads what an image cost in a batch against alone, from Triton's statistics at the
    highest rate: only a cheaper image lets a batch absorb a higher rate."""
    low, high = list(without)[0], list(without)[-1]
    off_at_high = without.get(high)
    queued = off_at_high is not None and _queued_enough(off_at_high)
    why = (
        f"without batching, requests hardly queued at {high} ("
        f"{off_at_high.server_ms('queue'):.2f} ms queue, {off_at_high.server_ms('compute_infer'):.2f} ms compute): "
        "the rate never loaded the instance, so a flat latency says nothing of batching"
        if off_at_high is not None and not queued
        else ""
    )
    on_low, on_high = (figure(with_batching.get(name), "latency.mean_ms", f"on, {name}") for name in (low, high))
    off_low, off_high = (figure(without.get(name), "latency.mean_ms", f"off, {name}") for name in (low, high))
    growth_on, growth_off = on_high.value / on_low.value, off_high.value / off_low.value
    size, in_batch = batch_cost(with_batching.get(high))
    alone = figure(without.get(high), "triton_stats.compute_ms_per_inference", "compute per image alone")
    saving = 1 - in_batch.value / alone.value
    return Expectation(
        "with dynamic batching on, latency stays roughly flat as the rate grows",
        (
            unless(
                off_at_high is None or queued,
                why,
                condition(
                    f"with batching, the mean at {high} is at most 1.5x the mean at {low}",
                    growth_on <= 1.5,
                    on_low,
                    on_high,
                    detail=f"x{growth_on:.2f}",
                ),
            ),
            unless(
                off_at_high is None or queued,
                why,
                condition(
                    "with batching, the mean grows less than without",
                    growth_on < growth_off,
                    on_low,
                    on_high,
                    off_low,
                    off_high,
                    detail=f"x{growth_on:.2f} against x{growth_off:.2f}",
                ),
            ),
        ),  # fmt: skip
        reason=f"at {high}, an image cost {in_batch.value:.2f} ms of compute in the batches of {size} that served "
        f"most images, against {alone.value:.2f} ms alone ({saving:+.0%} saved) on {hardware}: "
        + (
            "a batch saves little per image here, so forming one only moves a request's wait from the queue into "
            "a longer execution, and the capacity, hence the latency at a high rate, stays as it was"
            if not saving > 0.2
            else "a batch does save compute per image, so what remains is the time a request waits for its batch "
            "and the spread of the arrivals"
        ),
    )


# Requests Triton must hold at once, on average, for a queue to be possible at all: one computing
# and one more. Below it, the load generator never had a second request at the server.
SEVERAL_IN_SERVER = 2.0


def in_server(run: RunResult) -> float:
    """How many requests Triton held at a time during `run`, on average, in its queue or its model
    (Little's law at the server: requests per second x seconds each spent there)."""
    return run.throughput_rps * (run.server_ms("queue") + run.server_ms("compute_infer")) / 1000


def queueing_grows(runs: dict[int, RunResult | None], hardware: str, cores: int) -> Expectation:
    """The Python-backend model, one instance, at 1, 8 and 16 clients (`runs`, by client count):
    each added client puts one more request ahead of the others, so the time in Triton's queue
    grows from 1 to 8 clients, and again from 8 to 16, each time by more than one compute time;
    while compute infer stays within 50% of its lowest value.

    The wrong outcome it fails: the time moves into compute instead of the queue (a server that
    runs the requests together, so that each computes longer; or perf_analyzer and the model
    fighting over the cores), or a queue that does not grow with the clients. Its premise: at
    the most clients, Triton held several requests at once (SEVERAL_IN_SERVER, by `in_server`).
    Where it held fewer, the load generator never had a second request at the server, nothing
    could queue, and every condition is NOT CHECKED, with the figures that show it; so is each
    one whose run is missing (None)."""
    fewest, middle, most = sorted(runs)
    queue = {count: figure(runs[count], "server_ms(queue)", f"queue at c={count}") for count in runs}
    infer = {count: figure(runs[count], "server_ms(compute_infer)", f"compute at c={count}") for count in runs}
    step = infer[fewest]  # one more request ahead adds about one compute time of a request alone
    computes = [item.value for item in infer.values()]
    busiest = runs[most]
    held = in_server(busiest) if busiest is not None else math.nan
    premise = busiest is None or held >= SEVERAL_IN_SERVER
    why = (
        f"at c={most}, Triton held {held:.2f} requests at a time on average, under {SEVERAL_IN_SERVER:g}: the load "
        "generator never had a second request at the server, so nothing could queue"
    )
    shown = (figure(busiest, "throughput_rps", f"throughput at c={most}"), queue[most], infer[most])

    def if_loaded(judged: Condition) -> Condition:
        return judged if premise else not_checked(judged.text, why, *shown)

    # A bare `<` passes on a queue that stays at ~0 ms and differs by noise (0.01 against 0.02 ms):
    # each step adds 7 or 8 clients, about that many compute times of queue; one is the margin.
    grows = [
        if_loaded(
            condition(
                f"from {low} to {high} clients, the time in Triton's queue grows by more than one compute time of "
                "a request alone",
                queue[high].value - queue[low].value > step.value,
                queue[low],
                queue[high],
                step,
                detail=f"+{(queue[high].value - queue[low].value) / step.value:.1f} compute times",
            )
        )
        for low, high in ((fewest, middle), (middle, most))
    ]
    spread = max(computes) / min(computes)
    flat = if_loaded(
        condition(
            "compute infer stays within 50% of its lowest value",
            spread <= 1.5,
            *infer.values(),
            detail=f"highest / lowest = {spread:.2f}",
        )
    )
    waiting = busiest.throughput_rps * busiest.server_ms("queue") / 1000 if busiest is not None else math.nan
    return Expectation(
        "queueing delay grows with concurrency while compute infer stays about the same",
        (*grows, flat),
        reason=f"perf_analyzer and the server share {hardware} ({cores} cores): compute infer went from "
        f"{computes[0]:.1f} ms at c={fewest} to {max(computes):.1f} ms at its highest (a hypothesis, not measured "
        "here: perf_analyzer's own work, and the model's decoding of the images, compete with the model for the "
        f"cores); at c={most}, Triton held {held:.1f} requests at a time on average, {waiting:.1f} of them in its "
        "queue",
    )


# How far the measured queue may sit from (c - 1) compute times, either way. A request that finds
# the c - 1 others ahead waits about (c - 1) service times, less the time a client spends outside
# Triton per round trip (at most about one service time: so no less than (c - 2) / (c - 1) of it),
# and a service time is compute infer plus the instance's work around it (compute input and
# output, the Python backend's hand-off), a few percent of it in this lab's runs. 1.5 admits both
# and still fails a server that runs the requests together (a queue near zero, compute growing)
# or a queue fed by something else than the clients ahead.
AHEAD_FACTOR = 1.5


def queue_is_the_clients_ahead(runs: dict[int, RunResult | None], hardware: str) -> Expectation:
    """The one-instance sweep (`runs`, by client count c): a request finds the c - 1 other clients'
    requests ahead of it, so its time in Triton's queue is (c - 1) x the compute time of that run,
    within AHEAD_FACTOR either way.

    The wrong outcomes it fails: a queue near zero while compute grows (the server runs requests
    together), or a queue far longer than the clients ahead explain. One client has nothing ahead
    (no factor of zero can be judged): only runs of two or more clients are judged, and with none
    the check is NOT CHECKED. Also NOT CHECKED: a run where Triton held fewer than
    SEVERAL_IN_SERVER requests at a time (the load generator, not the server, held them), and a
    missing run (None)."""
    crowded = {clients: run for clients, run in sorted(runs.items()) if clients > 1}
    conditions = []
    if not crowded:
        text = "with more than one client, the queue is (clients - 1) compute times"
        conditions.append(not_checked(text, f"the sweep had no run with two or more clients: {sorted(runs)}"))
    for clients, run in crowded.items():
        queue = figure(run, "server_ms(queue)", f"queue at c={clients}")
        compute = figure(run, "server_ms(compute_infer)", f"compute at c={clients}")
        ahead = (clients - 1) * compute.value
        ratio = queue.value / ahead if ahead > 0 else math.nan
        text = (
            f"at {clients} clients, the queue is {clients - 1} compute times (the clients ahead), within "
            f"{AHEAD_FACTOR:g}x either way"
        )
        judged = condition(
            text,
            1 / AHEAD_FACTOR <= ratio <= AHEAD_FACTOR,
            queue,
            compute,
            detail=f"queue / ({clients - 1} x compute) = {ratio:.2f}",
        )
        if run is not None and (held := in_server(run)) < SEVERAL_IN_SERVER:
            why = (
                f"Triton held {held:.2f} requests at a time on average, under {SEVERAL_IN_SERVER:g}: the load "
                "generator never had the clients' requests at the server"
            )
            judged = not_checked(text, why, figure(run, "throughput_rps", f"throughput at c={clients}"), queue, compute)
        conditions.append(judged)
    return Expectation(
        "a request waits for the clients ahead of it: the queue is (clients - 1) compute times",
        tuple(conditions),
        reason=f"on {hardware}: a shorter queue means the clients held their requests themselves or the server ran "
        "them together (compute grows instead); a longer one, that an instance spends more per request than its "
        "compute infer",
    )


# The share of the device busy at which it counts as full: utilization is sampled every half
# second and a device that is never idle reads a little under 100%.
FULL = 0.9


def _use(run: RunResult, cores: int) -> tuple[float, str]:
    """What the device that served `run` was doing: its busy share and how it was read. Where this
    notebook sees the instances' processes (local services: the server runs on this CPU), their CPU
    against all cores; else (in Docker) the busiest GPU the sampler read; else the machine's CPU."""
    summary = summarize(run.resources or {})
    if processes := summary.get("processes"):
        used = sum(processes.values())
        rate = run.throughput_rps / (used / 100) if used else math.nan
        return used / (100 * cores), (
            f"the instances used {used:.0f}% of a core, of the {100 * cores}% this machine has; "
            f"{rate:.1f} requests per second of CPU"
        )
    gpus = [gpu for gpu in summary["gpus"] if not math.isnan(gpu["util_percent_mean"])]
    machine = f"machine CPU {summary['cpu_percent_mean']}% of all {cores} cores"
    if gpus:
        busiest = max(gpu["util_percent_mean"] for gpu in gpus)
        said = ", ".join(f"GPU {gpu['index']} {gpu['util_percent_mean']}% busy" for gpu in gpus)
        return busiest / 100, f"{said}; {machine}"
    return summary["cpu_percent_mean"] / 100, machine


def device_use(runs: Mapping[str, RunResult | None], cores: int, sweep: bool = False) -> str:
    """One line per run: what the device did meanwhile (see `_use`). With `sweep` (one instance,
    more and more clients), a last line says whether the latency grew while the device was not
    full (FULL), where more instances can use what one leaves idle."""
    lines, seen = [], []
    for name, run in runs.items():
        if run is None or not run.resources:
            lines.append(f"{name}: no measurement of the device")
            continue
        busy, said = _use(run, cores)
        seen.append((name, run, busy))
        lines.append(f"{name}: {run.latency.mean_ms:.1f} ms mean latency; {said}")
    if sweep and len(seen) > 1:
        (first, low, _), (last, high, _) = seen[0], seen[-1]
        busiest = max(busy for _, _, busy in seen)
        grew = f"From {first} to {last} the mean latency went from {low.latency.mean_ms:.1f} to "
        grew += f"{high.latency.mean_ms:.1f} ms"
        lines.append(
            f"{grew} while the device was at most {busiest:.0%} busy: not full, so the requests wait for the "
            "instance, not the device, and more instances can use what one leaves idle."
            if busiest < FULL
            else f"{grew} with the device {busiest:.0%} busy: full, so more instances help only as far as that "
            "busy time is waiting (threads that spin count as busy); section 2 measures it."
        )
    return "\n".join(lines)


def poisson_sweep(perf: Callable[..., RunResult | None], rates: list[float], model: str = "food_classifier_onnx"):
    """Poisson runs of `model` at every rate (`perf`: lab.triton.perf), each with Triton's statistics
    over that run, and a line of them printed: inferences, executions, the average batch."""
    sweep: dict[str, RunResult | None] = {}
    for rate in rates:
        result = perf(model, rate=rate, distribution="poisson", triton_stats=True)
        sweep[f"{rate:g} req/s"] = result
        if result is not None and (stats := result.triton_stats) is not None:
            print(
                f"    server: {stats['inference_count']} inferences in {stats['execution_count']} executions "
                f"(average batch {stats['avg_batch_size']:.2f})"
            )
    return sweep


def batches_ran(
    without: dict[str, RunResult | None], with_batching: dict[str, RunResult | None]
) -> tuple[dict[str, dict], str]:
    """Triton's statistics by name for the batch-size histogram (every rate with batching, the highest
    without), and in words: the largest batch that ran, and the compute per image at each batch size
    at the highest rate."""
    highest = list(without)[-1]
    histograms: dict[str, dict] = {}
    for batched, sweep in ((True, with_batching), (False, without)):
        for name, result in sweep.items():
            if result is not None and result.triton_stats is not None and (batched or name == highest):
                histograms[f"{name}, {'dynamic batching' if batched else 'no batching'}"] = result.triton_stats
    largest = max(
        (
            int(size)
            for stats in histograms.values()
            for size, count in stats["executions_by_batch_size"].items()
            if count
        ),
        default=0,
    )
    lines = [f"The largest batch that ran: {largest}."]
    for name, sweep in (("no batching", without), ("dynamic batching", with_batching)):
        run = sweep.get(highest)
        if run is None or (stats := run.triton_stats) is None:
            continue
        per_image = stats["compute_ms_per_inference_by_batch_size"]
        executions = stats["executions_by_batch_size"]
        costs = [f"{size}: {per_image[size]:.2f} ms ({executions[size]} executions)" for size in sorted(per_image)]
        lines.append(f"{name}, {highest}: compute per image, by batch size: " + ", ".join(costs))
    return histograms, "\n".join(lines)


def queueing_view(without: dict[str, RunResult | None], capacity: Capacity) -> str:
    """The runs without batching against M/D/1 and M/G/1 with the measured service time S = 1 /
    capacity: a table of mean latency (measured, and a request alone plus each model's wait) and
    time in Triton's queue, then how far the measurements sit from M/G/1 and what this run measured
    that explains it."""
    service_s, cv2 = capacity.service_time_s, capacity.service_cv2
    alone_ms = capacity.alone.latency.mean_ms
    lines = [f"{'rate':>10} | {'load':>4} | mean latency: measured, M/D/1, M/G/1 | Triton queue: measured, M/G/1 wait"]
    ratios, computes = [], []
    for name, result in without.items():
        if result is None or result.rate_rps is None:  # every open-loop run has its rate
            continue
        rate = result.rate_rps
        md1_wait = 1000 * queueing.md1_mean_wait_s(rate, service_s)
        mg1_wait = 1000 * queueing.mg1_mean_wait_s(rate, service_s, cv2)
        ratios.append(result.latency.mean_ms / (alone_ms + mg1_wait))
        computes.append(result.server_ms("compute_infer"))
        lines.append(
            f"{name:>10} | {rate * service_s:4.0%} | {result.latency.mean_ms:8.1f} ms, "
            f"{alone_ms + md1_wait:6.1f} ms, {alone_ms + mg1_wait:6.1f} ms | {result.server_ms('queue'):8.1f} ms, "
            f"{mg1_wait:6.1f} ms"
        )
    if not ratios:
        return "No queueing comparison: every Poisson run lacked a stable measurement."
    mean = sum(ratios) / len(ratios)
    outside_ms = alone_ms - capacity.alone.server_ms("compute_infer")
    lines.append(
        f"\nThe measured mean latencies are {min(ratios):.2f} to {max(ratios):.2f} times the M/G/1 estimate "
        f"({mean:.2f} on average: {'above' if mean > 1 else 'below'} it). What this run measured about the "
        f"difference:\n"
        f"- a request's time varies: its squared coefficient of variation is {cv2:.2f}, where M/D/1 assumes 0 "
        f"(M/G/1 uses it);\n"
        f"- of a request's {alone_ms:.1f} ms alone, {outside_ms:.1f} ms is spent outside Triton's compute infer, "
        f"while S = 1/capacity = {service_s * 1000:.1f} ms counts only what keeps the instance busy;\n"
        f"- the service time depends on the load, where both models take it as fixed: compute infer took "
        f"{min(computes):.1f} to {max(computes):.1f} ms per request in the Poisson runs, against "
        f"{capacity.saturated.server_ms('compute_infer'):.1f} ms while the capacity was measured "
        f"({capacity.saturated.concurrency} clients)."
    )
    return "\n".join(lines)


# Poisson against constant arrivals at a light rate: a difference in the mean queue below this share
# of a compute time (of the constant run) is within the timing noise of two runs, as is a p95
# longer by less than MARGIN.
QUEUE_NOISE = 0.1


def poisson_queues_more(
    constant: RunResult | None, poisson: RunResult | None, rate: float, capacity_rps: float, hardware: str, cores: int
) -> Expectation:
    """At the same average `rate`, Poisson arrivals queue more than evenly spaced ones: a request
    waits longer in Triton's queue (by more than QUEUE_NOISE of a compute time), and the p95 is
    longer (by more than MARGIN).

    The wrong outcome it fails: the two patterns queue alike, as when the load generator cannot
    hold its constant schedule on a busy machine and its even arrivals clump too. Its premise: a
    queue formed in at least one of the runs; where both queued less than QUEUE_NOISE of a compute
    time, neither can queue more than the other, and both conditions are NOT CHECKED; so is each
    whose run is missing (None)."""
    waits = {
        name: figure(run, "server_ms(queue)", f"{name} queue")
        for name, run in (("poisson", poisson), ("constant", constant))
    }
    tails = {
        name: figure(run, "latency.p95_ms", f"{name} p95")
        for name, run in (("poisson", poisson), ("constant", constant))
    }
    compute = figure(constant, "server_ms(compute_infer)", "constant compute")
    noise = QUEUE_NOISE * compute.value
    shown = (*waits.values(), compute)
    queued = any(math.isnan(item.value) for item in shown) or max(item.value for item in waits.values()) >= noise
    why = (
        f"neither run queued: {waits['poisson'].value:.2f} and {waits['constant'].value:.2f} ms, both under "
        f"{QUEUE_NOISE:.0%} of a {compute.value:.2f} ms compute time, so neither can queue more than the other"
    )

    def if_queued(judged: Condition) -> Condition:
        return judged if queued else not_checked(judged.text, why, *shown)

    busy = rate * compute.value / 1000
    return Expectation(
        f"at {rate:g} req/s, Poisson arrivals queue more than constant arrivals",
        (
            if_queued(
                condition(
                    f"a request waits longer in Triton's queue, by more than {QUEUE_NOISE:.0%} of a compute time",
                    waits["poisson"].value - waits["constant"].value > noise,
                    *shown,
                )
            ),
            if_queued(
                condition(
                    f"the slow tail (p95) is more than {MARGIN:.0%} longer",
                    tails["poisson"].value > (1 + MARGIN) * tails["constant"].value,
                    *tails.values(),
                    detail=f"x{tails['poisson'].value / tails['constant'].value:.2f}",
                )
            ),
        ),
        reason=f"at {rate / capacity_rps:.0%} of capacity (the instance computing {busy:.0%} of the time) clumps "
        f"that find it busy are rare, and the load generator shares {hardware} ({cores} cores) with the server, so "
        "it cannot keep a constant schedule exactly either",
    )
