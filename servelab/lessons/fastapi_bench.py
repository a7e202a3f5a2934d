"""Notebook 4's checks (GourmetGram's labels for its samples, one user against sixteen, PyTorch
against ONNX Runtime, thread plans, processes) and the machinery of its cells: what /openapi.json
says about /predict, the four thread plans, the watch kept beside the 16-sender run (/health timed
in a background thread, the machine sampled), and the resources it saw, in words.

The FastAPI services time each stage of a request themselves (their /metrics, read around a run
into `RunResult.service_stats`), so a claim about where a request's time went is judged on the
service's own timing, not on the client's latency alone.
"""

from __future__ import annotations

import json
import math
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import psutil
import requests

from servelab.lessons.expectations import (
    Condition,
    Expectation,
    Outcome,
    condition,
    figure,
    measured,
    unless,
)
from servelab.measure.resources import ResourceSampler, summarize
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
    """ONNX Runtime against PyTorch eager, one request at a time: a lower median latency. Its
    requests per second are not judged beside it: with one request at a time they are 1 / the
    mean latency, the same measurement again. The reason says how much of a request the model
    call was, from the services' own inference times."""
    pt_p50, onnx_p50 = (
        figure(pytorch, "latency.p50_ms", "PyTorch median"),
        figure(onnx, "latency.p50_ms", "ONNX median"),
    )
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
    latency is spent waiting for a slot (the service's own slot-wait timing). The last two are NOT
    CHECKED where there were no more senders than slots: then no request had to wait for one."""
    senders = loaded.concurrency
    room = f"{senders} sender(s) for {slots} slot(s): every request found a free slot, so none could queue"
    can_queue = senders is not None and senders > slots
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
            unless(
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
            ),
            unless(
                can_queue,
                room,
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
    )


def health_stays_out_of_the_queue(
    idle_ms: Sequence[float], loaded_ms: Sequence[float], loaded: RunResult, slots: int, hardware: str
) -> Expectation:
    """/health, timed at idle (`idle_ms`) and while `loaded` ran (`loaded_ms`), does not wait
    behind the model: its median under load stays below its median at idle plus half of one
    inference (the service's own mean inference time over `loaded`). A handler that blocked the
    event loop for an inference would hold /health for what remains of the running one, half of
    it on average, plus any queued ahead. NOT CHECKED where the inference slots were busy less than
    half the time (throughput x inference time, by Little's law): with no load, nothing could queue."""
    senders = loaded.concurrency
    idle = measured("/health median idle", statistics.median(idle_ms) if idle_ms else math.nan, "ms")
    busy = measured(
        f"/health median at {senders} senders", statistics.median(loaded_ms) if loaded_ms else math.nan, "ms"
    )
    inference = _stage(loaded, "inference", f"inference at {senders} senders")
    rate = figure(loaded, "throughput_rps", f"{senders} senders")
    in_use = rate.value * inference.value / 1000
    bound = idle.value + inference.value / 2
    judged = condition(
        f"under {senders} senders, /health answers within half an inference of its idle time",
        busy.value < bound,
        busy,
        idle,
        inference,
        detail=f"under {bound:.1f} ms",
    )
    return Expectation(
        "/health does not wait in the inference queue",
        (
            unless(
                not in_use < slots / 2,
                f"the {slots} inference slot(s) were in use {in_use:.2f} on average, under half: the service "
                "was not loaded, so nothing could make /health wait",
                judged,
            ),
        ),
        reason="the event loop does not queue /health behind the model, but it still waits for a free core: "
        f"the inference threads, the decoding pool and the load generator keep {hardware} busy",
    )


def _on_the_gpu(device: str) -> str:
    """Why the thread plans are not judged on `device`; empty on a CPU."""
    if device.startswith("cuda"):
        return (
            f"the model ran on {device}: the plans only change how the CPU shares its other work, and the "
            "lesson expects differences too small to judge"
        )
    return ""


def crowded_threads_are_slower(
    loaded: Mapping[str, RunResult], crowded: str, fitting: str, slots: int, cores: int, device: str, hardware: str
) -> Expectation:
    """Under load, `slots` slots with `cores` threads each (the plan `crowded`: more busy threads
    than cores) serve worse than the same slots with one thread each (`fitting`): a higher median
    latency and a lower throughput. NOT CHECKED where the model ran on a GPU."""
    crowded_p50 = figure(loaded[crowded], "latency.p50_ms", f"{crowded} p50")
    fitting_p50 = figure(loaded[fitting], "latency.p50_ms", f"{fitting} p50")
    crowded_rate = figure(loaded[crowded], "throughput_rps", crowded)
    fitting_rate = figure(loaded[fitting], "throughput_rps", fitting)
    gpu = _on_the_gpu(device)
    return Expectation(
        f"with {slots} slots, {cores} threads each (more busy threads than cores) are slower under load than 1 each",
        (
            unless(
                not gpu,
                gpu,
                condition("a higher median latency", crowded_p50.value > fitting_p50.value, crowded_p50, fitting_p50),
            ),
            unless(
                not gpu,
                gpu,
                condition("a lower throughput", crowded_rate.value < fitting_rate.value, crowded_rate, fitting_rate),
            ),
        ),  # fmt: skip
        reason=f"on {hardware}, the model on {device}, the crowded plan's extra threads found cores to run on",
    )


def every_core_serves_one_faster(
    alone: Mapping[str, RunResult], every_core: str, one_core: str, cores: int, device: str, hardware: str
) -> Expectation:
    """One request at a time, the plan that gives an inference every core (`every_core`) answers
    sooner than one thread (`one_core`): a lower median latency. (Its requests per second, one at
    a time, are 1 / its mean latency: not judged again.) NOT CHECKED with one core, where both
    plans are one thread, and on a GPU."""
    all_cores = figure(alone[every_core], "latency.p50_ms", f"{cores} threads")
    one_thread = figure(alone[one_core], "latency.p50_ms", "1 thread")
    infer = {name: _stage(alone[name], "inference", name).value for name in (every_core, one_core)}
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
        ),  # fmt: skip
        reason=f"on {hardware}, the model on {device}, the model call itself took {infer[every_core]:.1f} ms with "
        f"{cores} threads and {infer[one_core]:.1f} ms with 1, by the service's own timing: where the threads "
        "gained little on one image, the rest of the request decided",
    )


def elastic_default_near_the_best(
    alone: Mapping[str, RunResult], loaded: Mapping[str, RunResult], default: str, device: str, hardware: str,
    earlier_p50_ms: float,
) -> Expectation:  # fmt: skip
    """The `default` plan is within 15% of the best plan: alone, its median latency at most 1.15x
    the lowest; under load, its throughput at least the highest / 1.15. NOT CHECKED on a GPU."""
    best_alone = min(alone.values(), key=lambda result: result.latency.p50_ms)
    best_loaded = max(loaded.values(), key=lambda result: result.throughput_rps)
    default_alone = figure(alone[default], "latency.p50_ms", "default alone")
    default_loaded = figure(loaded[default], "throughput_rps", "default under load")
    best_p50 = figure(best_alone, "latency.p50_ms", f"best alone ({best_alone.name})")
    best_rate = figure(best_loaded, "throughput_rps", f"best under load ({best_loaded.name})")
    gpu = _on_the_gpu(device)
    return Expectation(
        "the elastic default is within 15% of the best plan, alone and under load",
        (
            unless(
                not gpu,
                gpu,
                condition(
                    "alone: a median latency within 15% of the best plan's",
                    default_alone.value <= 1.15 * best_p50.value,
                    default_alone,
                    best_p50,
                    detail=f"x{default_alone.value / best_p50.value:.2f}",
                ),
            ),
            unless(
                not gpu,
                gpu,
                condition(
                    "under load: a throughput within 15% of the best plan's",
                    default_loaded.value >= best_rate.value / 1.15,
                    default_loaded,
                    best_rate,
                    detail=f"x{default_loaded.value / best_rate.value:.2f}",
                ),
            ),
        ),  # fmt: skip
        reason=f"the same default plan served one request at a time in {earlier_p50_ms:.1f} ms (median) earlier "
        f"in this notebook and in {default_alone.value:.1f} ms here: on {hardware}, the model on {device}, runs "
        "move that much between measurements",
    )


MORE_THAN_NOISE = 1.2  # two runs of one plan move by up to 15-40% on a shared machine: a gain must beat that


def processes_follow_the_plan(
    one: RunResult, several: RunResult, processes: int, planned: int, cores: int
) -> Expectation:
    """Under load, `processes` processes of the service (`several`) against one (`one`), judged by
    what the plan says for `cores` cores (`planned` processes, cores.service_plan). Where the plan
    calls for several, the interpreter lock caps one process: several serve more than
    MORE_THAN_NOISE x its throughput. Where it calls for one (a few cores), the cores are the limit,
    not the lock: several serve no more than that. A plausible wrong outcome either way: several
    processes that gain nothing on a many-core machine (the lock was not the cap), or gain much on
    two cores (the plan leaves throughput on the table). NOT CHECKED where `processes` is one: the
    same setting twice, nothing to compare."""
    one_rate = figure(one, "throughput_rps", "1 process")
    several_rate = figure(several, "throughput_rps", f"{processes} processes")
    gain = several_rate.value / one_rate.value
    if planned > 1:
        part = condition(
            f"{processes} processes serve more than {MORE_THAN_NOISE}x one",
            gain > MORE_THAN_NOISE, several_rate, one_rate, detail=f"x{gain:.2f}",
        )  # fmt: skip
    else:
        part = condition(
            f"{processes} processes serve no more than {MORE_THAN_NOISE}x one",
            gain <= MORE_THAN_NOISE, several_rate, one_rate, detail=f"x{gain:.2f}",
        )  # fmt: skip
    return Expectation(
        f"on {cores} core(s), the plan's {planned} process(es) is the right count: "
        + ("one interpreter caps a process" if planned > 1 else "the cores, not the interpreter, are the limit"),
        (unless(processes > 1, f"{processes} process(es) tried: the same setting as one, nothing to compare", part),),
        reason=f"on {cores} core(s), {processes} processes served x{gain:.2f} of one process's throughput",
    )


# ---- the machinery of the notebook's cells ------------------------------------------------------


def describe_predict(openapi: dict[str, Any]) -> str:
    """What an OpenAPI document (a FastAPI service's /openapi.json) says about POST /predict: its
    JSON request body's schema, and each answer it documents with the fields of its body, every
    `$ref` followed into the document's components/schemas."""
    schemas = openapi.get("components", {}).get("schemas", {})

    def resolve(schema: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in schema:
            schema = schemas[schema["$ref"].rsplit("/", 1)[1]]
        return schema

    def json_schema(part: dict[str, Any]) -> dict[str, Any]:
        return resolve(part.get("content", {}).get("application/json", {}).get("schema", {}))

    operation = openapi["paths"]["/predict"]["post"]
    request = json.dumps(json_schema(operation["requestBody"]), indent=2)
    lines = ["POST /predict, request body:", request, "", "Answers:"]
    for status, answer in operation["responses"].items():
        fields = ", ".join(json_schema(answer).get("properties", {})) or "no body"
        lines.append(f"  {status}: {answer.get('description', '')} (fields: {fields})")
    return "\n".join(lines)


def _plan_names(cores: int) -> tuple[str, str, str, str]:
    """The thread plans' names on `cores` cores: every core for one slot, one core per slot,
    crowded (more busy threads than cores), the default."""
    crowded = max(2, cores)
    return (
        f"1 slot x {cores} threads",
        f"{cores} slots x 1 thread",
        f"{crowded} slots x {cores} threads",
        "default (elastic)",
    )


def thread_plans(cores: int) -> dict[str, tuple[int | None, int | None]]:
    """The four plans notebook 4 serves on `cores` cores, by name: (inference slots, threads per
    inference), None keeping the service's default. The crowded plan has at least two slots, each
    with every core: more busy threads than cores, even on one core."""
    every_core, one_core, crowded, default = _plan_names(cores)
    return {every_core: (1, cores), one_core: (cores, 1), crowded: (max(2, cores), cores), default: (None, None)}


def thread_plan_checks(
    alone: Mapping[str, RunResult],
    loaded: Mapping[str, RunResult],
    cores: int,
    device: str,
    hardware: str,
    earlier_p50_ms: float,
) -> tuple[Expectation, Expectation, Expectation]:
    """The three checks of the plans of `thread_plans(cores)`, each run alone and under load:
    crowded threads are slower under load, every core serves one request faster, and the elastic
    default is near the best (`earlier_p50_ms`: the default's median one at a time, measured earlier)."""
    every_core, one_core, crowded, default = _plan_names(cores)
    return (
        crowded_threads_are_slower(loaded, crowded, one_core, max(2, cores), cores, device, hardware),
        every_core_serves_one_faster(alone, every_core, one_core, cores, device, hardware),
        elastic_default_near_the_best(alone, loaded, default, device, hardware, earlier_p50_ms),
    )


def listening_pids(url: str) -> list[int]:
    """The processes of this machine that listen on `url`'s port (a local server's), as psutil sees
    them; none where it sees no such process."""
    port = urlsplit(url).port
    return sorted(
        {
            conn.pid
            for conn in psutil.net_connections("tcp")
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid
        }
    )


def health_check_ms(url: str) -> float:
    """How long the service at `url` takes to answer one GET /health, in ms."""
    started = time.perf_counter()
    requests.get(f"{url}/health", timeout=10).raise_for_status()
    return (time.perf_counter() - started) * 1000


class LoadWatch:
    """What notebook 4 watches beside a run under load, as a context manager around it:

    - /health, timed `idle_checks` times as the block starts (`idle_ms`), then every `every_s`
      seconds in a background thread until it ends (`loaded_ms`);
    - `sampler`, a ResourceSampler to hand the run, which also samples the server's own process
      where this one can see it: locally, not in the Compose project (`on_compose`), where the
      server runs in another container.

    `time_health`: how one health check is timed (health_check_ms of `url` unless given)."""

    def __init__(
        self,
        url: str,
        on_compose: bool,
        idle_checks: int = 10,
        every_s: float = 0.1,
        time_health: Callable[[], float] | None = None,
    ) -> None:
        self.url = url
        self.idle_checks = idle_checks
        self.every_s = every_s
        self._time_health = time_health or (lambda: health_check_ms(url))
        self.sampler = ResourceSampler(interval_s=0.25, pids=[] if on_compose else listening_pids(url))
        self.idle_ms: list[float] = []
        self.loaded_ms: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.loaded_ms.append(self._time_health())
            self._stop.wait(self.every_s)

    def __enter__(self) -> LoadWatch:
        self.idle_ms = [self._time_health() for _ in range(self.idle_checks)]
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, name="health-poller", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def usage_text(series: Mapping[str, Any], cores: int) -> str:
    """The resources a ResourceSampler saw (`series`, a RunResult's `resources`), in words: the
    whole machine's CPU on `cores` cores, each GPU's use (or how none was read), and the server
    process's own CPU where it was sampled."""
    usage = summarize(dict(series))
    gpus = ", ".join(
        f"{gpu['name']} {gpu['util_percent_mean']}% busy on average (peak {gpu['util_percent_max']}%)"
        for gpu in usage["gpus"]
    )
    lines = [
        f"The whole machine: CPU {usage['cpu_percent_mean']}% of all {cores} cores on average "
        f"(peak {usage['cpu_percent_max']}%); GPU: {gpus or usage['gpu_source']}"
    ]
    if "process_cpu_percent_mean" in usage:
        server = usage["process_cpu_percent_mean"]
        lines.append(
            f"The server process alone: {server}% of one core on average, i.e. {server / cores:.0f}% of all "
            f"{cores} cores, the unit of the plot's thick line."
        )
    return "\n".join(lines)
