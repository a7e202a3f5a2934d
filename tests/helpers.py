"""Small helpers the tests share: waiting on a state, never on a sleep a busy machine can outlast."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(check: Callable[[], T], timeout_s: float, what: str, every_s: float = 0.01) -> T:
    """Poll `check` until it returns something true, and return that; fail naming `what` (the
    state waited for) after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s:g} s for {what}")
        time.sleep(every_s)
    return found


def synthetic_run(
    target: str = "t",
    concurrency: int | None = 1,
    throughput_rps: float = 10.0,
    mean_ms: float = 100.0,
    p50_ms: float | None = None,
    **fields,
):
    """A RunResult with the figures a lesson's check reads, for feeding it a passing or a failing
    case; `fields` sets any other field (service_stats, server_breakdown, triton_stats...)."""
    from servelab.results import LatencySummary, RunResult

    p50 = mean_ms if p50_ms is None else p50_ms
    latency = LatencySummary(mean_ms, p50, 1.2 * p50, 1.3 * p50, 1.5 * p50, 2 * p50)
    mode = fields.pop("mode", "closed" if concurrency else "open")
    return RunResult(target, fields.pop("tool", "loadgen"), mode, fields.pop("requests", 100), throughput_rps,
                     latency, fields.pop("wall_s", 10.0), concurrency=concurrency, **fields)  # fmt: skip


def service_stages(**means_ms: float) -> dict:
    """A FastAPI service's account of a run (`RunResult.service_stats`) with these stage means."""
    return {"stage_mean_ms": {"download": float("nan"), "slot_wait": 0.0, "preprocess": 0.0, "inference": 0.0,
                              **means_ms}}  # fmt: skip
