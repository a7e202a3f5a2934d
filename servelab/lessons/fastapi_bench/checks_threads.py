"""Notebook 4's checks of its thread plans (inference slots x threads per inference, the plans of
servelab.lessons.fastapi_bench.runs.CorePlans), each plan run alone and under load: crowded threads
are slower, every core serves one request faster, and the default is near the best.
"""

from __future__ import annotations

from collections.abc import Mapping

from servelab.lessons.expectations import (
    Estimate,
    Expectation,
    condition,
    figure,
    machine_hardware,
    unless,
    unless_each,
)
from servelab.lessons.fastapi_bench.checks import stage
from servelab.lessons.fastapi_bench.runs import CorePlans
from servelab.results import RunResult


def _on_the_gpu(device: str) -> str:
    """Why the thread plans are not judged on `device`; empty on a CPU."""
    if device.startswith("cuda"):
        return (
            f"the model ran on {device}: the plans only change how the CPU shares its other work, and the "
            "lesson expects differences too small to judge"
        )
    return ""


def crowded_threads_are_slower(
    loaded: Mapping[str, RunResult], plans: CorePlans, hardware: str | None = None
) -> Expectation:
    """Under load, the crowded plan (its slots with every core each: more busy threads than cores)
    serves worse than as many slots with one thread each: a higher median latency and a lower
    throughput. NOT CHECKED where the model ran on a GPU."""
    crowded, fitting, device = plans.crowded, plans.one_core, plans.device
    hardware = machine_hardware() if hardware is None else hardware
    crowded_p50 = figure(loaded[crowded], "latency.p50_ms", f"{crowded} p50")
    fitting_p50 = figure(loaded[fitting], "latency.p50_ms", f"{fitting} p50")
    crowded_rate = figure(loaded[crowded], "throughput_rps", crowded)
    fitting_rate = figure(loaded[fitting], "throughput_rps", fitting)
    gpu = _on_the_gpu(device)
    return Expectation(
        f"with {plans.crowded_slots} slots, {plans.cores} threads each (more busy threads than cores) are slower "
        "under load than 1 each",
        (
            *unless_each(
                not gpu,
                gpu,
                condition("a higher median latency", crowded_p50.value > fitting_p50.value, crowded_p50, fitting_p50),
                condition("a lower throughput", crowded_rate.value < fitting_rate.value, crowded_rate, fitting_rate),
            ),
        ),
        reason=f"on {hardware}, the model on {device}, the crowded plan's extra threads found cores to run on",
        estimate=Estimate.ratio(
            f"the requests per second under load of {crowded}, over {fitting}", crowded_rate.value, fitting_rate.value
        ),
    )


def every_core_serves_one_faster(
    alone: Mapping[str, RunResult], plans: CorePlans, hardware: str | None = None
) -> Expectation:
    """One request at a time, the plan that gives an inference every core answers sooner than one
    thread: a lower median latency. (Its requests per second, one at a time, are 1 / its mean
    latency: not judged again.) NOT CHECKED with one core, where both plans are one thread, and on
    a GPU."""
    every_core, one_core, cores, device = plans.every_core, plans.one_core, plans.cores, plans.device
    hardware = machine_hardware() if hardware is None else hardware
    all_cores = figure(alone[every_core], "latency.p50_ms", f"{cores} threads")
    one_thread = figure(alone[one_core], "latency.p50_ms", "1 thread")
    infer = {name: stage(alone[name], "inference", name).value for name in (every_core, one_core)}
    why = _on_the_gpu(device) or (
        "with one core there is only one thread to give: both plans are the same" if cores < 2 else ""
    )
    return Expectation(
        "a request alone is served faster with every core than with one",
        (
            unless(
                not why,
                why,
                condition(
                    "a lower median latency, one request at a time",
                    all_cores.value < one_thread.value,
                    all_cores,
                    one_thread,
                    detail=f"x{all_cores.value / one_thread.value:.2f}",
                ),
            ),
        ),
        reason=f"on {hardware}, the model on {device}, the model call itself took {infer[every_core]:.1f} ms with "
        f"{cores} threads and {infer[one_core]:.1f} ms with 1, by the service's own timing: where the threads "
        "gained little on one image, the rest of the request decided",
        estimate=Estimate.ratio(
            f"one request's median with {cores} threads, over 1 thread", all_cores.value, one_thread.value
        ),
    )


def default_near_the_best(
    alone: Mapping[str, RunResult],
    loaded: Mapping[str, RunResult],
    plans: CorePlans,
    earlier_p50_ms: float,
    hardware: str | None = None,
) -> Expectation:
    """The default plan is within 15% of the best plan: alone, its median latency at most 1.15x
    the lowest; under load, its throughput at least the highest / 1.15 (`earlier_p50_ms`: its
    median one at a time, measured earlier, for the reason). NOT CHECKED on a GPU."""
    default, device = plans.default, plans.device
    hardware = machine_hardware() if hardware is None else hardware
    best_alone = min(alone.values(), key=lambda result: result.latency.p50_ms)
    best_loaded = max(loaded.values(), key=lambda result: result.throughput_rps)
    default_alone = figure(alone[default], "latency.p50_ms", "default alone")
    default_loaded = figure(loaded[default], "throughput_rps", "default under load")
    best_p50 = figure(best_alone, "latency.p50_ms", f"best alone ({best_alone.name})")
    best_rate = figure(best_loaded, "throughput_rps", f"best under load ({best_loaded.name})")
    gpu = _on_the_gpu(device)
    return Expectation(
        "the default (a slot per core, one thread each) is within 15% of the best plan, alone and under load",
        (
            *unless_each(
                not gpu,
                gpu,
                condition(
                    "alone: a median latency within 15% of the best plan's",
                    default_alone.value <= 1.15 * best_p50.value,
                    default_alone,
                    best_p50,
                    detail=f"x{default_alone.value / best_p50.value:.2f}",
                ),
                condition(
                    "under load: a throughput within 15% of the best plan's",
                    default_loaded.value >= best_rate.value / 1.15,
                    default_loaded,
                    best_rate,
                    detail=f"x{default_loaded.value / best_rate.value:.2f}",
                ),
            ),
        ),
        reason=f"the same default plan served one request at a time in {earlier_p50_ms:.1f} ms (median) earlier "
        f"in this notebook and in {default_alone.value:.1f} ms here: on {hardware}, the model on {device}, runs "
        "move that much between measurements",
        estimate=Estimate.ratio(
            "the default plan's requests per second under load, over the best plan's",
            default_loaded.value,
            best_rate.value,
        ),
    )
