"""What notebooks 6 and 7 show beside their checks: what the device did during each run
(`device_use`, notebook 6), the batches that ran (`batches_ran`, drawn by `show_batches`: notebook
7, section 4), and the queueing view, the runs against M/D/1 and M/G/1 (`queueing_view`, drawn by
`show_queueing`, reading a measured `Capacity`: notebook 7, section 4).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Protocol

import matplotlib.pyplot as plt

from servelab.lessons.expectations import machine_cores
from servelab.measure import queueing
from servelab.measure.resources import summarize
from servelab.report import plots
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


# The busy share from which a device counts as full: the samplers read its utilization about once a
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


def device_use(runs: Mapping[str, RunResult | None], cores: int | None = None, sweep: bool = False) -> str:
    """One line per run: what the device did meanwhile (see `_use`; `cores`: the machine's where a
    notebook leaves it out). With `sweep` (one instance, more and more clients), a last line says
    whether the latency grew while the device was not full (FULL), where more instances can use
    what one leaves idle."""
    cores = cores or machine_cores()
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
            "busy time is waiting (a thread spinning while it waits counts as busy); section 2 measures it."
        )
    return "\n".join(lines)


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


def show_batches(without: dict[str, RunResult | None], with_batching: dict[str, RunResult | None]) -> None:
    """The batches that ran (`batches_ran`): each run's share of inferences by batch size, drawn,
    then in words."""
    histograms, said = batches_ran(without, with_batching)
    plots.plot_batch_sizes(histograms, share=True, title="food_classifier_onnx: inferences by batch size executed")
    plt.show()
    print(said)


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


def show_queueing(without: dict[str, RunResult | None], capacity: Capacity, constant: RunResult | None = None) -> None:
    """The queueing view (`queueing_view`) in words, then drawn: the Poisson runs without batching,
    and `constant`, a run with evenly spaced arrivals, against what M/D/1, M/G/1 and D/D/1 predict
    with the measured service time."""
    print(queueing_view(without, capacity))
    measured = [run for run in (constant, *without.values()) if run is not None]
    plots.plot_queueing(
        measured, capacity.service_time_s, cv2=capacity.service_cv2, alone_ms=capacity.alone.latency.mean_ms
    )
    plt.show()
