"""A run on a time axis: its requests cut into windows of equal length, each with its own
throughput, latency percentiles and errors. What a plot of a load that changes over time (a step
load, a replica that dies) is drawn from; the run's own totals stay in RunResult."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from servelab.results import RunResult, percentile_known


@dataclass(frozen=True)
class Window:
    start_s: float  # on the caller's time axis (the run's own, shifted by `offset_s`)
    end_s: float
    answered: int  # successful requests that ended in the window
    errors: dict[str, int] = field(default_factory=dict)  # error kind -> requests that failed in it
    p50_ms: float = math.nan  # NaN when too few requests ended in the window to know it
    p95_ms: float = math.nan

    @property
    def throughput_rps(self) -> float:
        return self.answered / (self.end_s - self.start_s)


def windows(result: RunResult, width_s: float, offset_s: float = 0.0) -> list[Window]:
    """`result`'s requests, by the time they ended, in windows of `width_s` seconds from its
    start to its end; `offset_s` moves them onto a longer time axis (a step's start)."""
    if width_s <= 0:
        raise ValueError("width_s must be above 0")
    if not result.timeline and result.requests:
        raise ValueError(f"{result.label} has no timeline: only the lab's load generator records one")
    count = max(1, math.ceil(result.wall_s / width_s))
    ended: list[list] = [[] for _ in range(count)]
    for entry in result.timeline:  # a request still answered after the end counts in the last window
        ended[min(int(entry[0] // width_s), count - 1)].append(entry)
    found = []
    for index, entries in enumerate(ended):
        latencies = [latency for _, latency, outcome in entries if outcome == "ok"]
        errors = Counter(outcome for _, _, outcome in entries if outcome != "ok")
        p50, p95 = (
            float(np.percentile(latencies, q)) if percentile_known(q, len(latencies)) else math.nan for q in (50, 95)
        )
        start_s, end_s = offset_s + index * width_s, offset_s + min((index + 1) * width_s, max(result.wall_s, width_s))
        found.append(Window(start_s, end_s, len(latencies), dict(errors), p50, p95))
    return found
