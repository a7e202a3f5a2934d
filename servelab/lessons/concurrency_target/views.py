"""Notebook 9's tables: a step load seen from both sides (`step_view`, `step_table`), and the runs
of `slots_need_room` (`slot_table`).
"""

from __future__ import annotations

import math

from servelab.lessons.concurrency_target.runs import Step, StepLoad, busy_slots, mean_of, most_of
from servelab.ray.watch import ServeSample, during, in_replica_mean_ms
from servelab.results import RunResult


def step_view(samples: list[ServeSample], step: Step) -> dict[str, float]:
    """One step seen from both sides: Serve's samples during it (replicas, requests inside the
    replicas and per replica, queued in front, CPU, time in a replica) and the client's latency."""
    inside = during(samples, step.start_s, step.end_s)
    return {
        "replicas (max)": most_of(sample.running for sample in inside) if inside else 0.0,
        "in replicas (mean)": mean_of(sample.ongoing for sample in inside),
        "per replica (mean)": mean_of(sample.per_replica for sample in inside if sample.running),
        "queued (mean)": mean_of(sample.queued for sample in inside),
        "CPU % (mean)": mean_of(sample.cpu_percent for sample in inside),
        "in replica ms": in_replica_mean_ms(samples, step.start_s, step.end_s),
        "client ms": step.run.latency.mean_ms,
    }


def step_table(load: StepLoad) -> str:
    """A step load's table: one row per step (`step_view`)."""
    views = [step_view(load.samples, step) for step in load.steps]
    lines = [f"{'step':<28}" + "".join(f"{name:>20}" for name in views[0])]
    for step, view in zip(load.steps, views, strict=True):
        label = f"{step.clients} client(s), {step.start_s:.0f}-{step.end_s:.0f} s"
        lines.append(f"{label:<28}" + "".join(f"{value:20.1f}" for value in view.values()))
    return "\n".join(lines)


def slot_table(runs: dict[int, RunResult], watched: dict[int, list[ServeSample]]) -> str:
    """`slots_need_room`'s runs as a table, one row per `max_ongoing_requests`: throughput, busy
    slots, requests queued in front (Serve's samples, `watched`), and the replica's own times: the
    wait for a slot, the time in the replica, the time at the model."""
    lines = [
        f"{'max_ongoing_requests':>22}{'req/s':>8}{'busy slots':>12}{'queued in front':>17}{'slot wait ms':>14}"
        f"{'in replica ms':>15}{'at the model ms':>17}"
    ]
    for cap, run in runs.items():
        stages = (run.service_stats or {}).get("stage_mean_ms", {})
        lines.append(
            f"{cap:>22}{run.throughput_rps:>8.1f}{busy_slots(run):>12.2f}"
            f"{mean_of(sample.queued for sample in watched[cap]):>17.2f}{stages.get('slot_wait', math.nan):>14.1f}"
            f"{in_replica_mean_ms(watched[cap], 0, math.inf):>15.1f}{stages.get('inference', math.nan):>17.1f}"
        )
    return "\n".join(lines)
