"""The checks of dynamic batching (notebook 7, section 4), on Poisson sweeps with it off and on:
the time in Triton's queue, and the latency as the rate grows, with what an image cost in a batch
read from the model's /stats around each run (compute times by batch size).
"""

from __future__ import annotations

from servelab.lessons.expectations import (
    Estimate,
    Expectation,
    Figure,
    condition,
    figure,
    machine_hardware,
    measured,
    not_checked,
    unless_each,
)
from servelab.lessons.triton_bench.checks_capacity import NOT_MEASURED
from servelab.results import RunResult


def _queued_enough(off: RunResult) -> bool:
    """Whether requests queued enough without batching for batching to shorten it: a mean wait at
    least as long as the compute time, so that a request typically found another ahead of it.
    Below that, most requests found the instance idle, and a difference is noise."""
    return off.server_ms("queue") >= off.server_ms("compute_infer")


def batching_shortens_the_queue(
    without: dict[str, RunResult | None], with_batching: dict[str, RunResult | None], hardware: str | None = None
):
    """At each rate where requests queued without batching (a mean wait at least as long as the
    compute time), they wait less in Triton's queue with dynamic batching on. The rates that queued
    less are named in the claim, not judged. The reason, shown where a rate's queue did not shorten,
    reads that rate's queue with and without batching and what an image cost in a batch against
    alone (Triton's statistics): where a batch saves nothing, a batch takes as long as its requests
    one after another. `hardware`: read from the machine where a notebook leaves it out."""
    conditions, skipped, longer = [], [], []
    for name, off in without.items():
        on = with_batching.get(name)
        lowers = f"at {name}, batching lowers the time in the queue"
        if off is None or on is None:
            queues = figure(off, "server_ms(queue)", "queue off"), figure(on, "server_ms(queue)", "queue on")
            conditions.append(condition(lowers, False, *queues))
            continue
        if not _queued_enough(off):
            skipped.append(
                f"{name} ({off.server_ms('queue'):.2f} ms queue, {off.server_ms('compute_infer'):.2f} ms compute)"
            )
            continue
        queue_off, queue_on = figure(off, "server_ms(queue)", "queue off"), figure(on, "server_ms(queue)", "queue on")
        if not queue_on.value < queue_off.value:
            longer.append(name)
        conditions.append(condition(lowers, queue_on.value < queue_off.value, queue_off, queue_on))
    claim = "where requests queue, dynamic batching shortens the time they wait"
    if not conditions:
        conditions.append(
            not_checked(
                "where requests queued without batching, batching lowers the time in the queue",
                "without batching, no rate queued enough to judge: " + ", ".join(skipped),
            )
        )
    elif skipped:
        claim += " (left out, queueing less than a compute time without batching: " + ", ".join(skipped) + ")"
    highest = list(without)[-1]
    wait_off, wait_on = (figure(runs.get(highest), "server_ms(queue)", "") for runs in (without, with_batching))
    return Expectation(
        claim,
        tuple(conditions),
        reason=_why_the_queue_stayed(longer[0], without, with_batching, hardware or machine_hardware())
        if longer
        else "",
        estimate=Estimate.ratio(
            f"the time in the queue at {highest} with batching, as a share of it without", wait_on.value, wait_off.value
        ),
    )


def _why_the_queue_stayed(
    name: str, without: dict[str, RunResult | None], with_batching: dict[str, RunResult | None], hardware: str
) -> str:
    """Why the queue at rate `name` did not shorten with batching, from that rate's runs: the two
    queues, and what an image cost in a batch against alone (Triton's statistics)."""
    off, on = without[name], with_batching[name]
    assert off is not None and on is not None, "a rate judged had both runs"
    queues = (
        f"at {name}, a request waited {on.server_ms('queue'):.2f} ms in the queue with batching against "
        f"{off.server_ms('queue'):.2f} ms without"
    )
    if not on.triton_stats:
        return f"{queues} on {hardware} (Triton's statistics of the run with batching, its batches, were not read)"
    size, in_batch = batch_cost(on)
    if size == 1:
        return f"{queues}, and no batch larger than 1 ran on {hardware}: requests rarely met in the queue"
    alone = figure(off if off.triton_stats else None, "triton_stats.compute_ms_per_inference", "compute alone")
    saving = 1 - in_batch.value / alone.value
    return (
        f"{queues}; in the batches of {size} that served most images, an image cost {in_batch.value:.2f} ms of "
        f"compute against {alone.value:.2f} ms alone ({saving:+.0%} saved) on {hardware}: "
        + (
            "a batch takes about as long as its requests one after another, so a request waits for the batch "
            "ahead of it about as long as it waited for the requests ahead"
            if not saving > 0.2
            else "a batch is cheaper per image, so what remains is the time a request waits for the batch running "
            "ahead of it, and the spread of the arrivals"
        )
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
    without: dict[str, RunResult | None], with_batching: dict[str, RunResult | None], hardware: str | None = None
) -> Expectation:
    """The seed's headline: with dynamic batching on, the mean latency stays roughly flat as the
    rate grows (the highest rate's at most 1.5x the lowest's), and grows less than without it.
    Both are NOT CHECKED where, without batching, requests hardly queued at the highest rate (see
    `_queued_enough`): a rate that never loaded the instance leaves the latency flat either way.
    The reason reads what an image cost in a batch against alone, from Triton's statistics at the
    highest rate: only a cheaper image lets a batch absorb a higher rate. `hardware`: read from the
    machine where a notebook leaves it out."""
    hardware = hardware or machine_hardware()
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
            *unless_each(
                off_at_high is None or queued,
                why,
                condition(
                    f"with batching, the mean at {high} is at most 1.5x the mean at {low}",
                    growth_on <= 1.5,
                    on_low,
                    on_high,
                    detail=f"x{growth_on:.2f}",
                ),
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
        ),
        reason=f"at {high}, an image cost {in_batch.value:.2f} ms of compute in the batches of {size} that served "
        f"most images, against {alone.value:.2f} ms alone ({saving:+.0%} saved) on {hardware}: "
        + (
            "a batch saves little per image here, so forming one only moves a request's wait from the queue into "
            "a longer execution, and the capacity, hence the latency at a high rate, stays as it was"
            if not saving > 0.2
            else "a batch does save compute per image, so what remains is the time a request waits for its batch "
            "and the spread of the arrivals"
        ),
        estimate=Estimate(f"how many times the mean latency with batching grows from {low} to {high}", growth_on, "x"),
    )
