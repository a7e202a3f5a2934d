"""The checks of what more work at once buys: a batch of images from one client and more
instances of the Python-backend model (notebook 6, sections 1 and 2), the ONNX Runtime model
against the Python-backend one and more instances of it (notebook 7, section 1). Claims about what
the model costs are judged on Triton's own statistics (perf_analyzer's server-side breakdown),
never on the client's latency, which also counts uploads and the network. `MARGIN`, the noise
between two runs of one setting, serves the other checks too.
"""

from __future__ import annotations

import math

from servelab.lessons.expectations import (
    AnswerError,
    Estimate,
    Expectation,
    Figure,
    condition,
    figure,
    machine_cores,
    machine_hardware,
    unless,
)
from servelab.measure.resources import summarize
from servelab.results import RunResult

NOT_MEASURED = math.nan
# What each request to the ONNX model carries: a [3, 224, 224] tensor of float32 pixels, preprocessed
# by the client, where the Python-backend model receives the compressed JPEG.
ONNX_INPUT_BYTES = 3 * 224 * 224 * 4

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
        return (
            f"{name}: the instances' CPU is not known here (processes of another container, or threads of "
            "Triton's own process)"
        )
    return f"{name}: the instances used {used:.0f}% of a core, of the {100 * cores}% this machine has"


def _stage(run: RunResult | None, stage: str, name: str) -> Figure:
    """The model's own time per execution in `stage` over `run` (model.py's clock, Triton's metrics);
    NaN where the run has none (a model that reports no stages, or Triton's metrics out of reach)."""
    timed = run is not None and stage in ((run.triton_stats or {}).get("stage_mean_ms") or {})
    return figure(run if timed else None, f"triton_stats.stage_mean_ms.{stage}", name)


def client_batching(
    single: RunResult | None, batched: RunResult | None, hardware: str | None = None, cores: int | None = None
) -> Expectation:
    """One client, a request of 16 images against one of 1: the model's own forward pass on the 16
    takes less than twice its time on 1, and the client gets more images per second, by more than
    MARGIN. Judged on the forward pass that model.py times apart: Triton's compute infer also holds
    model.py decoding the images one after another, which a batch does not share (on a GPU the
    decoding of 16 can outweigh their forward pass); the decoding is said in the reason. NOT
    CHECKED where the model reported no stage times."""
    hardware, cores = hardware or machine_hardware(), cores or machine_cores()
    size = batched.batch_size if batched is not None else 16
    forward_batched = _stage(batched, "forward", f"forward pass, {size} images")
    forward_single = _stage(single, "forward", "forward pass, 1 image")
    decode_batched, decode_single = _stage(batched, "decode", "decoding"), _stage(single, "decode", "decoding")
    rate_batched, rate_single = (
        figure(batched, "images_per_s", "batched"),
        figure(single, "images_per_s", "one at a time"),
    )
    ratio = forward_batched.value / forward_single.value
    timed = not math.isnan(ratio)
    gain = rate_batched.value / rate_single.value
    return Expectation(
        f"a batch of {size} costs little more than a batch of 1",
        (
            unless(
                timed,
                "the model reported no time of its own stages (model.py's clock, read at Triton's /metrics)",
                condition(
                    f"the model's forward pass on {size} images takes less than twice its time on 1 image",
                    ratio < 2,
                    forward_batched,
                    forward_single,
                    detail=f"{ratio:.1f}x",
                ),
            ),
            condition(
                f"so the client gets more images per second, by more than {MARGIN:.0%}",
                gain > 1 + MARGIN,
                rate_batched,
                rate_single,
                detail=f"x{gain:.2f}",
            ),
        ),
        reason=f"on {hardware}, model.py decoded {size} images in {decode_batched.value:.1f} ms, one after another, "
        f"against {decode_single.value:.1f} ms for 1, beside a forward pass of {forward_batched.value:.1f} against "
        f"{forward_single.value:.1f} ms; {_cpu_said('with 1 image per request', single, cores)}. A batch pays where "
        "one image leaves the hardware idle: what the single-image run left unused is the most a batch could use",
        estimate=Estimate(f"the images per second with {size} images per request, over 1 per request", gain, "x"),
    )


def instance_scaling(
    one: RunResult | None,
    more: RunResult | None,
    instances: int,
    hardware: str | None = None,
    cores: int | None = None,
) -> Expectation:
    """Under load, `instances` instances serve more requests per second than one: by more than
    MARGIN, so that two runs of the same setting, differing by noise, do not pass."""
    hardware, cores = hardware or machine_hardware(), cores or machine_cores()
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
        estimate=Estimate(f"the requests per second of {instances} ONNX instances over 1", gain, "x"),
    )


def instances_stop_helping(
    runs: dict[int, RunResult | None], hardware: str | None = None, cores: int | None = None
) -> Expectation:
    """The original lab's claim, on the Python-backend model at 8 clients, by instance count
    (`runs`: three counts, as the student typed them; the original lab's are 1, 4 and 8): more
    instances help while the hardware has idle capacity (the middle count serves more than the
    fewest, by more than MARGIN), and once it has none they only fight over it: the most do no
    better than the middle count (at most MARGIN more, or fewer)."""
    hardware, cores = hardware or machine_hardware(), cores or machine_cores()
    if len(runs) != 3:
        counts = ", ".join(map(str, sorted(runs)))
        raise AnswerError(
            f"This check compares three instance counts; Triton ran {len(runs)} different ones ({counts}): a count was "
            "typed twice.\nType another count in one instance_group above, run that cell again, then this one."
        )
    fewest, middle, most = sorted(runs)
    name = lambda count: f"{count} instance{'s' * (count > 1)}"  # noqa: E731
    rate = {count: figure(run, "throughput_rps", name(count)) for count, run in runs.items()}
    rise, further = rate[middle].value / rate[fewest].value, rate[most].value / rate[middle].value
    used = "; ".join(_cpu_said(f"with {count}", run, cores) for count, run in runs.items())
    return Expectation(
        "more Python-backend instances help while the hardware has idle capacity, and stop helping when it has none",
        (
            condition(
                f"from {name(fewest)} to {middle}, throughput rises by more than {MARGIN:.0%}",
                rise > 1 + MARGIN,
                rate[fewest],
                rate[middle],
                detail=f"x{rise:.2f}",
            ),
            condition(
                f"{name(most)} do no better than {middle}: at most {MARGIN:.0%} more requests per second (within "
                "the noise), or fewer",
                further <= 1 + MARGIN,
                rate[middle],
                rate[most],
                detail=f"x{further:.2f}",
            ),
        ),
        reason=f"on {hardware}: {used}. Where {middle} instances left the cores idle, {most} use them; where "
        f"{fewest} kept them busy, {middle} only take turns",
        estimate=Estimate(f"the speedup of {name(middle)} over {fewest}", rise, "x"),
    )


def onnx_beats_python(onnx: RunResult | None, python: RunResult | None, hardware: str | None = None) -> Expectation:
    """One client at a time, the ONNX model answers sooner than the Python-backend model: a lower
    mean latency. Its throughput is not judged beside it: with one client, each request starts as
    the last one ends, so requests per second are 1 / the mean latency, the same number again. The
    reason splits each mean into the model's compute infer (the Python-backend model's includes
    decoding the JPEG) and the rest (the network, the upload, Triton's handling), as measured."""
    hardware = hardware or machine_hardware()
    onnx_ms, python_ms = figure(onnx, "latency.mean_ms", "ONNX mean"), figure(python, "latency.mean_ms", "Python mean")
    onnx_compute, python_compute = (figure(run, "server_ms(compute_infer)", "").value for run in (onnx, python))
    return Expectation(
        "the ONNX Runtime model beats the Python-backend model at concurrency 1",
        (
            condition(
                "a lower mean latency (with one client, also more requests per second: 1 / the mean)",
                onnx_ms.value < python_ms.value,
                onnx_ms,
                python_ms,
                detail=f"Python / ONNX = {python_ms.value / onnx_ms.value:.2f}x",
            ),
        ),
        reason=f"on {hardware}, a request to the ONNX model spent {onnx_compute:.1f} ms in its compute infer and "
        f"{onnx_ms.value - onnx_compute:.1f} ms around it (the network, the upload, Triton's handling), against "
        f"{python_compute:.1f} ms (decoding the JPEG included) and {python_ms.value - python_compute:.1f} ms for "
        f"the Python-backend model: each ONNX request carries {ONNX_INPUT_BYTES / 1000:.0f} KB of float32 pixels "
        "instead of a compressed JPEG",
        estimate=Estimate.ratio(
            "the ONNX model's speedup at one client (the Python mean over the ONNX mean)",
            python_ms.value,
            onnx_ms.value,
        ),
    )
