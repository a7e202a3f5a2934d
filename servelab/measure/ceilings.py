"""The in-process ceiling, the best of a small sweep of thread plans (servelab.measure.inprocess's
points), each run in a process of its own so that one plan's threads never slow the next. It is
reported with the plan that won, whose process stays to measure it again next to each service
(`Ceiling.measure_now`): its model is already built, so measuring again costs the measurement only.
`make bench` and the GPU check judge their services against it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from servelab.measure.inprocess import Point, PointProcess
from servelab.results import RunResult
from servelab.service.cores import available_cores, service_plan

log = logging.getLogger(__name__)


def sweep_points(cores: int, pipelined: bool, device: str | None = None) -> list[Point]:
    """The plans worth trying. On a CPU: every core busy, in one slot or spread over 2, 4... slots;
    for one request in flight, one slot with 1, 2, 4... threads up to the cores. On a GPU
    (`device` "cuda"): one or two slots, every core decoding (the best by hand on an H200: 259
    against 221 req/s); one request in flight with every core. Pipelined, also in the processes of
    a service's plan (cores.service_plan), where it has several, each on its share of the cores:
    one process's ceiling is capped by its interpreter lock, as a one-process service is."""
    on_gpu = device == "cuda"
    powers = [2**k for k in range(cores.bit_length()) if 2**k <= cores]
    if not pipelined:
        return [Point(1, cores, False)] if on_gpu else [Point(1, threads, False) for threads in powers]
    plan = service_plan(cores, on_gpu=on_gpu)
    if on_gpu:
        alone = [Point(slots, max(1, cores // slots), True) for slots in (1, 2)]
        several = Point(1, plan.cores_each, True, plan.processes)
    else:
        alone = [Point(slots, cores // slots, True) for slots in powers]
        several = Point(plan.slots, 1, True, plan.processes)
    return alone + ([several] if plan.processes > 1 else [])


@dataclass
class Ceiling:
    """The best point of a sweep (`best`, measured with `plan`), the best in one process
    (`best_alone`), and every point measured; the winner's process stays until `close`, to measure
    it again."""

    runtime: str
    decode: bool
    plan: Point
    best: RunResult
    best_alone: RunResult
    points: list[RunResult]
    process: PointProcess

    def measure_now(self, duration_s: float, warmup_s: float) -> RunResult:
        """The winning plan measured once more, now: the ceiling for runs made right after it (the
        machine's speed drifts, so a service is judged against a ceiling taken next to it)."""
        again = self.process.measure(duration_s, warmup_s)
        self.points.append(again)
        return again

    def close(self) -> None:
        self.process.close()


def sweep(
    runtime: str, pipelined: bool, duration_s: float, warmup_s: float, decode: bool = True, device: str | None = None
) -> Ceiling:
    """Every plan worth trying (`sweep_points`), each in a process of its own on `device` (None:
    this process's INFERENCE_DEVICE), one at a time; the best one's process is kept in the Ceiling,
    the others' end. A plan that cannot run raises RuntimeError, saying why."""
    best: tuple[Point, RunResult, PointProcess] | None = None
    measured, alone = [], []
    for point in sweep_points(available_cores(), pipelined, device):
        log.info("in-process %s%s: %s", runtime, "" if decode else " (inference only)", point.name)
        process = PointProcess(runtime, point, decode, device=device)
        try:
            result = process.measure(duration_s, warmup_s)
        except BaseException:
            process.close()
            if best is not None:
                best[2].close()
            raise
        measured.append(result)
        alone += [result] if point.processes == 1 else []
        if best is None or result.throughput_rps > best[1].throughput_rps:
            if best is not None:
                best[2].close()
            best = (point, result, process)
        else:
            process.close()
    assert best is not None, "sweep_points gives at least one plan"
    plan, result, process = best
    best_alone = max(alone, key=lambda run: run.throughput_rps)
    return Ceiling(runtime, decode, plan, result, best_alone, measured, process)
