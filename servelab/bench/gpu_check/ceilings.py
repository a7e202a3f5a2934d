"""The in-process ceiling each service is compared with: the runtime it runs, the plans measured (one
request in flight, and pipelines), each in a process of its own (servelab.measure.inprocess)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from servelab.loadgen.processes import last_line
from servelab.measure import inprocess
from servelab.results import RunResult
from servelab.service.cores import available_cores, service_plan

log = logging.getLogger(__name__)

# What each service runs, as the in-process ceiling names it: Triton's food_classifier is PyTorch.
CEILING_RUNTIME = {"fastapi_pt": "pytorch", "fastapi_onnx": "onnxruntime", "triton": "pytorch", "naive_pt": "pytorch"}


@dataclass
class Ceiling:
    """The in-process ceiling of one runtime: one request in flight, the best pipeline in one process,
    and the best pipeline of all (the machine's: in as many processes as a service plans, where that
    is more than one); or why it was not measured (`note`)."""

    runtime: str
    one_in_flight: RunResult | None = None
    one_process: RunResult | None = None
    pipelined: RunResult | None = None
    runs: list[RunResult] = field(default_factory=list)
    note: str = ""


def ceiling_points(device: str, cores: int) -> tuple[inprocess.Point, list[inprocess.Point]]:
    """The in-process plans measured: one request in flight with every core, and pipelines. On a
    GPU one slot (the services' plan) and two (the best by hand on an H200: 259 against 221 req/s);
    on a CPU a slot per core, as a busy service runs. Then, where a service's plan has several
    processes (cores.service_plan), the same work in that many, each on its share of the cores:
    one process's ceiling is capped by its interpreter lock, as a one-process service is."""
    one = inprocess.Point(1, cores, pipelined=False)
    plan = service_plan(cores, on_gpu=device == "cuda")
    if device == "cuda":
        pipelines = [inprocess.Point(slots, max(1, cores // slots), pipelined=True) for slots in (1, 2)]
        several = inprocess.Point(1, plan.cores_each, pipelined=True, processes=plan.processes)
    else:
        pipelines = [inprocess.Point(cores, 1, pipelined=True)]
        several = inprocess.Point(plan.slots, 1, pipelined=True, processes=plan.processes)
    return one, pipelines + ([several] if plan.processes > 1 else [])


def measure_ceiling(runtime: str, device: str, seconds: float, warmup_s: float) -> Ceiling:
    """Each plan of `ceiling_points` in a process of its own (servelab.measure.inprocess), one at a time."""
    one, pipelines = ceiling_points(device, available_cores())
    ceiling = Ceiling(runtime)
    for point in [one, *pipelines]:
        log.info("in-process ceiling, %s on %s: %s", runtime, device, point.name)
        try:
            with inprocess.PointProcess(runtime, point, device=device) as process:
                ceiling.runs.append(process.measure(seconds, warmup_s))
        except RuntimeError as exc:
            log.error("in-process ceiling, %s on %s: %s", runtime, device, exc)
            ceiling.note = f"not measured: {last_line(str(exc))}"
            return ceiling
    ceiling.one_in_flight = ceiling.runs[0]
    alone = [run for point, run in zip(pipelines, ceiling.runs[1:], strict=True) if point.processes == 1]
    ceiling.one_process = max(alone, key=lambda run: run.throughput_rps)
    ceiling.pipelined = max(ceiling.runs[1:], key=lambda run: run.throughput_rps)
    return ceiling
