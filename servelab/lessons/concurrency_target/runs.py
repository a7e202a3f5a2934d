"""The runs notebook 9's checks read, and what is read from them: a step load (`StepLoad`, the
steps with Serve's samples, as servelab.lab.ray_side measures it), the means and maxima of those
samples, and a run's busy predict slots (`busy_slots`).
"""

from __future__ import annotations

import math
import statistics
from typing import NamedTuple

from servelab.ray.watch import ServeSample
from servelab.results import RunResult

# Serve's gauges are reported every second: a sample taken this soon after a step began may
# still describe the step before.
SETTLE_S = 1.5


class Step(NamedTuple):
    """One step of a step load, on the watcher's time axis."""

    start_s: float
    end_s: float
    clients: int
    run: RunResult


class StepLoad(NamedTuple):
    """A step load against an autoscaling deployment: Serve's samples, the steps, and the
    deployment's autoscaling_config."""

    samples: list[ServeSample]
    steps: list[Step]
    autoscaling: dict


def mean_of(values) -> float:
    """The mean of `values`; NaN where there are none."""
    values = list(values)
    return statistics.fmean(values) if values else math.nan


def most_of(values) -> float:
    """The largest of `values`; NaN where there are none."""
    return float(max(values, default=math.nan))


def busy_slots(run: RunResult) -> float:
    """The predict slots at work on average during `run`: the replica's own inference time over
    the run (its /metrics, `service_stats`) divided by the run's measured seconds."""
    if run.service_stats is None:
        raise ValueError(f"{run.label}: the service's /metrics were not read over this run (service_stats)")
    count = run.service_stats["stage_counts"]["inference"]
    return 0.0 if count == 0 else count * run.service_stats["stage_mean_ms"]["inference"] / 1000 / run.wall_s
