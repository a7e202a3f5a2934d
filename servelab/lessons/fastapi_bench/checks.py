"""Notebook 4's checks, the thread plans' aside (checks_threads): GourmetGram's labels for its
samples, PyTorch against ONNX Runtime, one user against sixteen (and /health beside them, and on a
GPU its use), and processes.

The FastAPI services time each stage of a request themselves (their /metrics, read around a run
into `RunResult.service_stats`), so a claim about where a request's time went is judged on the
service's own timing (`stage`), not on the client's latency alone.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

import numpy as np

from servelab.lessons.expectations import (
    Condition,
    Estimate,
    Expectation,
    Outcome,
    condition,
    figure,
    machine_hardware,
    measured,
    not_checked,
    unless,
    unless_each,
)
from servelab.lessons.fastapi_bench.runs import CorePlans
from servelab.measure.resources import summarize
from servelab.results import RunResult

# GourmetGram's bundled samples (gourmetgram/static/samples), by file name, and the Food-11 class
# each one shows.
SAMPLE_LABELS = {"bread.jpg": "Bread", "fried_egg.jpg": "Egg", "soup.jpg": "Soup"}


def _percent(shown: str | None) -> float:
    """A result page's probability ("23.4% probability") as a number of percent; NaN where none was shown."""
    return float(shown.split("%", 1)[0]) if shown else math.nan


def samples_get_their_labels(pages: Mapping[str, tuple[str | None, str | None]], weights: str) -> Expectation:
    """Through GourmetGram, each sample photo gets the class its name says, judged per photo on the
    label and probability its result page showed (`pages`: photo -> (label, probability as shown)).
    `weights` is what the service's /health says; on any but trained weights the labels mean
    nothing, so every photo is NOT CHECKED, with that reason."""
    parts = []
    for photo, (label, probability) in pages.items():
        expected = SAMPLE_LABELS[photo]
        shown = measured(f"shown {label}, probability", _percent(probability), "%")
        text = f"{photo} is labelled {expected}"
        if weights == "trained":
            parts.append(condition(text, label == expected, shown))
        else:
            parts.append(Condition(text, Outcome.NOT_CHECKED, (shown,), f"{weights} weights: the labels mean nothing"))
    missed = sum(part.outcome is Outcome.NOT_HELD for part in parts)
    return Expectation(
        "GourmetGram labels each sample photo with the class its name says",
        tuple(parts),
        reason=f"{missed} of {len(parts)} samples got another label: they are drawn cartoons "
        "(gourmetgram/make_samples.py), not the photographs the model was trained on",
    )


def stage(run: RunResult, stage: str, name: str):
    """The service's mean time of one stage over `run`, as a figure."""
    return figure(run, f"service_stats.stage_mean_ms.{stage}", name)


def runtime_comparison(pytorch: RunResult, onnx: RunResult, hardware: str | None = None) -> Expectation:
    """ONNX Runtime against PyTorch eager, one request at a time: a lower median latency. Its
    requests per second are not judged beside it: with one request at a time they are 1 / the
    mean latency, the same measurement again. The reason says how much of a request the model
    call was, from the services' own inference times."""
    pt_p50, onnx_p50 = (
        figure(pytorch, "latency.p50_ms", "PyTorch median"),
        figure(onnx, "latency.p50_ms", "ONNX median"),
    )
    hardware = machine_hardware() if hardware is None else hardware
    pt_infer = stage(pytorch, "inference", "PyTorch inference").value
    onnx_infer = stage(onnx, "inference", "ONNX inference").value
    return Expectation(
        "ONNX Runtime serves faster than PyTorch eager",
        (
            condition(
                "a lower median latency, one request at a time",
                onnx_p50.value < pt_p50.value,
                onnx_p50,
                pt_p50,
                detail=f"PyTorch / ONNX = {pt_p50.value / onnx_p50.value:.2f}x",
            ),
        ),
        reason=f"on {hardware}, the model call took {pt_infer:.1f} ms in PyTorch and {onnx_infer:.1f} ms in ONNX "
        f"Runtime by the services' own timing, of medians of {pt_p50.value:.1f} and {onnx_p50.value:.1f} ms: "
        "the rest of a request (HTTP, JSON, base64 and JPEG decoding, preprocessing) costs the same in both, "
        "and where the model call is a small part of it, the runtime cannot change much",
        estimate=Estimate.ratio(
            "PyTorch's median latency over ONNX Runtime's, one request at a time", pt_p50.value, onnx_p50.value
        ),
    )


def queueing_under_load(alone: RunResult, loaded: RunResult, slots: int, hardware: str | None = None) -> Expectation:
    """With many senders: throughput rises above one-at-a-time, the inference slots are busy
    nearly all the time (by Little's law on the slots: the slots in use on average are the
    throughput times the service's inference time), and more than half of a request's mean
    latency is spent waiting for a slot (the service's own slot-wait timing). The last two are NOT
    CHECKED where there were no more senders than slots: then no request had to wait for one."""
    hardware = machine_hardware() if hardware is None else hardware
    senders = loaded.concurrency
    room = f"{senders} sender(s) for {slots} slot(s): every request found a free slot, so none could queue"
    can_queue = senders is not None and senders > slots
    busy_rate, alone_rate = (
        figure(loaded, "throughput_rps", f"{senders} senders"),
        figure(alone, "throughput_rps", "one at a time"),
    )
    inference = stage(loaded, "inference", f"inference at {senders} senders")
    slot_wait = stage(loaded, "slot_wait", f"slot wait at {senders} senders")
    decode = stage(loaded, "preprocess", f"decoding at {senders} senders")
    mean = figure(loaded, "latency.mean_ms", f"mean at {senders} senders")
    in_use = busy_rate.value * inference.value / 1000
    waiting = slot_wait.value / mean.value
    return Expectation(
        f"with {senders} senders, throughput rises only so far, and the rest is waiting in line",
        (
            condition(
                "throughput rises above the one-at-a-time throughput",
                busy_rate.value > alone_rate.value,
                busy_rate,
                alone_rate,
                detail=f"{busy_rate.value / alone_rate.value:.2f}x",
            ),
            *unless_each(
                can_queue,
                room,
                condition(
                    f"the {slots} inference slot(s) are busy at least 90% of the time (throughput x inference "
                    "time, by Little's law)",
                    in_use >= 0.9 * slots,
                    busy_rate,
                    inference,
                    detail=f"{in_use:.2f} of {slots} slot(s) in use on average",
                ),
                condition(
                    "more than half of the mean latency is waiting for a slot, by the service's own timing",
                    waiting > 0.5,
                    slot_wait,
                    mean,
                    detail=f"{waiting:.0%} waiting",
                ),
            ),
        ),
        reason=f"on {hardware}, the slots were in use {in_use / slots:.0%} of the time; decoding took "
        f"{decode.value:.1f} ms and an inference {inference.value:.1f} ms per request, a wait for a slot "
        f"{slot_wait.value:.1f} ms of the {mean.value:.1f} ms mean: where the slots idle, the decoding ahead of "
        "them (and the load generator on the same cores) did not keep up; where the wait is short, the time went "
        "to the stages themselves, stretched by sharing the cores",
        estimate=Estimate.ratio(
            f"the requests per second of {senders} senders, over one at a time", busy_rate.value, alone_rate.value
        ),
    )


def health_stays_out_of_the_queue(
    idle_ms: Sequence[float], loaded_ms: Sequence[float], loaded: RunResult, slots: int, hardware: str | None = None
) -> Expectation:
    """/health, timed at idle (`idle_ms`) and while `loaded` ran (`loaded_ms`), does not wait
    behind the model: its median under load stays below its median at idle plus half of one
    inference (the service's own mean inference time over `loaded`). A handler that blocked the
    event loop for an inference would hold /health for what remains of the running one, half of
    it on average, plus any queued ahead. NOT CHECKED where the inference slots were busy less than
    half the time (throughput x inference time, by Little's law): with no load, nothing could queue;
    and where half an inference is within /health's own spread at idle (its 90th percentile less
    its median: a GPU's inference of a millisecond or two), where such a wait could not be told
    from the noise of the interpreter and the network."""
    hardware = machine_hardware() if hardware is None else hardware
    senders = loaded.concurrency
    idle = measured("/health median idle", statistics.median(idle_ms) if idle_ms else math.nan, "ms")
    spread = measured(
        "/health spread idle (90th percentile - median)",
        float(np.percentile(idle_ms, 90)) - idle.value if idle_ms else math.nan,
        "ms",
    )
    busy = measured(
        f"/health median at {senders} senders", statistics.median(loaded_ms) if loaded_ms else math.nan, "ms"
    )
    inference = stage(loaded, "inference", f"inference at {senders} senders")
    rate = figure(loaded, "throughput_rps", f"{senders} senders")
    in_use = rate.value * inference.value / 1000
    bound = idle.value + inference.value / 2
    judged = condition(
        f"under {senders} senders, /health answers within half an inference of its idle time",
        busy.value < bound,
        busy,
        idle,
        inference,
        spread,
        detail=f"under {bound:.1f} ms",
    )
    visible = unless(
        inference.value / 2 > spread.value,
        f"half an inference, {inference.value / 2:.1f} ms, is within /health's own spread at idle, "
        f"{spread.value:.1f} ms: a wait behind the running inference could not be told from noise",
        judged,
    )
    return Expectation(
        "/health does not wait in the inference queue",
        (
            unless(
                not in_use < slots / 2,
                f"the {slots} inference slot(s) were in use {in_use:.2f} on average, under half: the service "
                "was not loaded, so nothing could make /health wait",
                visible,
            ),
        ),
        reason="the event loop does not queue /health behind the model, but it still waits for a free core: "
        f"the inference threads, the decoding pool and the load generator keep {hardware} busy",
        estimate=Estimate(f"/health's median at {senders} senders", busy.value, "ms"),
    )


MORE_THAN_NOISE = 1.2  # two runs of one plan move by up to 15-40% on a shared machine: a gain must beat that


def processes_follow_the_plan(one: RunResult, several: RunResult, processes: int, plans: CorePlans) -> Expectation:
    """Under load, `processes` processes of the service (`several`) against one (`one`), judged by
    what the services' plan says for the cores and device of `plans` (its `service`). Where the plan
    calls for several, the interpreter lock caps one process: several serve more than
    MORE_THAN_NOISE x its throughput. Where it calls for one (a few cores), the cores are the limit,
    not the lock: several serve no more than that. A plausible wrong outcome either way: several
    processes that gain nothing on a many-core machine (the lock was not the cap), or gain much on
    two cores (the plan leaves throughput on the table). NOT CHECKED where `processes` is one: the
    same setting twice, nothing to compare."""
    planned, cores = plans.service.processes, plans.cores
    one_rate = figure(one, "throughput_rps", "1 process")
    several_rate = figure(several, "throughput_rps", f"{processes} processes")
    gain = several_rate.value / one_rate.value
    if planned > 1:
        claim, held = f"{processes} processes serve more than {MORE_THAN_NOISE}x one", gain > MORE_THAN_NOISE
    else:
        claim, held = f"{processes} processes serve no more than {MORE_THAN_NOISE}x one", gain <= MORE_THAN_NOISE
    part = condition(claim, held, several_rate, one_rate, detail=f"x{gain:.2f}")
    return Expectation(
        f"on {cores} core(s), the plan's {planned} process(es) is the right count: "
        + ("one interpreter caps a process" if planned > 1 else "the cores, not the interpreter, are the limit"),
        (unless(processes > 1, f"{processes} process(es) tried: the same setting as one, nothing to compare", part),),
        reason=f"on {cores} core(s), {processes} processes served x{gain:.2f} of one process's throughput",
        estimate=Estimate(f"the requests per second of {processes} processes over 1", gain, "x"),
    )


# nvidia-smi's use of a GPU is the share of time any kernel ran, however little of it the kernel
# filled: under this, the GPU spent a tenth of the run or more with nothing to do.
GPU_SPARE_PERCENT = 90.0


def gpu_has_time_to_spare(loaded: RunResult, device: str) -> Expectation:
    """On a GPU, with one image per model call, the senders keep the slots busy but not the GPU:
    over the run under load (`loaded`, its resources sampled), even the busiest GPU ran a kernel
    less than GPU_SPARE_PERCENT of the time on average. A plausible wrong outcome: a model call
    slow enough on the GPU (a small GPU, a large model) that the slots keep it busy, where more
    slots or processes only queue on it. NOT CHECKED where the service ran on the CPU (`device`,
    its /health), or where no GPU was read during the run (the sampler says why)."""
    usage = summarize(loaded.resources) if loaded.resources else {"gpus": [], "gpu_source": "no resources sampled"}
    gpus = [
        figure(loaded, f"resources.gpus.{place}.util_percent_mean", f"GPU {gpu['index']} ({gpu['name']}) use")
        for place, gpu in enumerate(usage["gpus"])
    ]
    busiest = max(gpus, key=lambda gpu: gpu.value if math.isfinite(gpu.value) else -1.0, default=None)
    busy = busiest.value if busiest is not None else math.nan
    rate = figure(loaded, "throughput_rps", f"{loaded.concurrency} senders")
    text = f"the GPU had time to spare: under {GPU_SPARE_PERCENT:.0f}% busy on average (the busiest GPU)"
    if not device.startswith("cuda"):
        judged = not_checked(text, f"the service ran its model on {device}: the GPU had nothing of it to do", rate)
    elif busiest is None or not math.isfinite(busy):
        judged = not_checked(text, f"no GPU use was read during the run ({usage['gpu_source']})", rate, *gpus)
    else:
        judged = condition(text, busy < GPU_SPARE_PERCENT, *gpus, rate, detail=f"{busy:.0f}% busy")
    return Expectation(
        "with one image per model call, the GPU waits between images while requests wait for a slot",
        (judged,),
        reason=f"at {rate.value:.0f} req/s, the busiest GPU ran a kernel {busy:.0f}% of the time, "
        f"{10 * busy / rate.value if rate.value else math.nan:.2f} ms per request: each model call kept it busy "
        "that long. nvidia-smi counts the time any kernel runs, however little of the GPU it fills, so even a GPU "
        "busy by that count may have room for a batch",
        estimate=Estimate("the busiest GPU's mean use during the run", busy, "%"),
    )
