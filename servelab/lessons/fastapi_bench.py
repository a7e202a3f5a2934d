"""Notebook 4's checks: GourmetGram's labels for its samples, one user against sixteen, PyTorch
against ONNX Runtime.

The FastAPI services time each stage of a request themselves (their /metrics, read around a run
into `RunResult.service_stats`), so a claim about where a request's time went is judged on the
service's own timing, not on the client's latency alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from servelab.lessons.expectations import Condition, Expectation, Outcome, condition, figure, measured
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


def _stage(run: RunResult, stage: str, name: str):
    """The service's mean time of one stage over `run`, as a figure."""
    return figure(run, f"service_stats.stage_mean_ms.{stage}", name)


def runtime_comparison(pytorch: RunResult, onnx: RunResult, hardware: str) -> Expectation:
    """ONNX Runtime against PyTorch eager, one request at a time: lower median latency, more
    requests per second. The reason says how much of a request the model call was, from the
    services' own inference times."""
    pt_p50, onnx_p50 = (
        figure(pytorch, "latency.p50_ms", "PyTorch median"),
        figure(onnx, "latency.p50_ms", "ONNX median"),
    )
    pt_rate, onnx_rate = figure(pytorch, "throughput_rps", "PyTorch"), figure(onnx, "throughput_rps", "ONNX Runtime")
    pt_infer = _stage(pytorch, "inference", "PyTorch inference").value
    onnx_infer = _stage(onnx, "inference", "ONNX inference").value
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
            condition(
                "more requests per second, one request at a time", onnx_rate.value > pt_rate.value, onnx_rate, pt_rate
            ),
        ),
        reason=f"on {hardware}, the model call took {pt_infer:.1f} ms in PyTorch and {onnx_infer:.1f} ms in ONNX "
        f"Runtime by the services' own timing, of medians of {pt_p50.value:.1f} and {onnx_p50.value:.1f} ms: "
        "the rest of a request (HTTP, JSON, base64 and JPEG decoding, preprocessing) costs the same in both, "
        "and where the model call is a small part of it, the runtime cannot change much",
    )


def queueing_under_load(alone: RunResult, loaded: RunResult, slots: int, hardware: str) -> Expectation:
    """With many senders: throughput rises above one-at-a-time, the inference slots are busy
    nearly all the time (by Little's law on the slots: the slots in use on average are the
    throughput times the service's inference time), and more than half of a request's mean
    latency is spent waiting for a slot (the service's own slot-wait timing)."""
    senders = loaded.concurrency
    busy_rate, alone_rate = (
        figure(loaded, "throughput_rps", f"{senders} senders"),
        figure(alone, "throughput_rps", "one at a time"),
    )
    inference = _stage(loaded, "inference", f"inference at {senders} senders")
    slot_wait = _stage(loaded, "slot_wait", f"slot wait at {senders} senders")
    decode = _stage(loaded, "preprocess", f"decoding at {senders} senders")
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
        reason=f"on {hardware}, the slots were in use {in_use / slots:.0%} of the time; decoding took "
        f"{decode.value:.1f} ms and an inference {inference.value:.1f} ms per request, a wait for a slot "
        f"{slot_wait.value:.1f} ms of the {mean.value:.1f} ms mean: where the slots idle, the decoding ahead of "
        "them (and the load generator on the same cores) did not keep up; where the wait is short, the time went "
        "to the stages themselves, stretched by sharing the cores",
    )
