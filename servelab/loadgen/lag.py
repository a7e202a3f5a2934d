"""How late the generator acted, against when it meant to: whether a run kept its schedule.

A load generator measures the server only while it acts on time itself. An open loop has a
schedule of arrivals, and each request's lag is how late it went out. A closed loop, a run of
sequences and a run of streams send on answers, not on a clock, so their schedule is a watch
(`LoopWatch`): a timer due every `TICK_S` in the generator's event loop, and how late each fired.
A busy machine that holds the generator up (another process on its core, a stall) shows in both
the same way, and a run that fell behind says so in its `schedule_lag`: its latencies include the
generator's own wait, and the server was offered less than the run says.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import numpy as np

# A run fell behind its schedule when its p99 lag exceeds both of these. A lag has to be large
# compared with the gap between arrivals to change the offered load, and large in absolute terms
# to change latencies. Below 10 ms it is noise: asyncio's timers already wake up to about 1 ms
# late (epoll counts in milliseconds), and on a busy 2-core machine the OS often runs the
# generator a few milliseconds after its timer fired. A generator that cannot keep up falls
# further behind with every request, and soon passes both.
LAG_LIMIT_S = 0.010
LAG_LIMIT_FRACTION = 0.1

# The watch's timer: often enough that a stall of the limit's length is seen in a 1 s run's p99
# (a 10 ms stall makes two ticks late, 1% of 200), rarely enough to cost nothing (a wake-up is
# about 20 microseconds of Python).
TICK_S = 0.005


def schedule_lag(lags_s: list[float], rate_rps: float | None = None) -> dict[str, Any]:
    """The run's lag figures and, in words, whether it kept its schedule: of an open loop's
    requests at `rate_rps`, or (`rate_rps` None) of a `LoopWatch`'s ticks."""
    what = "requests went out" if rate_rps else "the generator's event loop ran its timers"
    if not lags_s:
        message = "Nothing was scheduled, so there is no schedule lag to report."
        return {"mean_ms": math.nan, "p99_ms": math.nan, "max_ms": math.nan, "fell_behind": False, "message": message}
    lags_ms = np.asarray(lags_s) * 1000.0
    mean_ms, p99_ms, max_ms = float(lags_ms.mean()), float(np.percentile(lags_ms, 99)), float(lags_ms.max())
    limit_ms = max(LAG_LIMIT_S, LAG_LIMIT_FRACTION / rate_rps if rate_rps else 0.0) * 1000.0
    fell_behind = p99_ms > limit_ms
    if not fell_behind:
        message = (
            f"The generator kept to its schedule: {what} {mean_ms:.2f} ms late on average "
            f"(p99 {p99_ms:.2f} ms, worst {max_ms:.2f} ms)."
        )
    elif rate_rps:
        message = (
            f"The generator fell behind its schedule: 1% of requests went out more than {p99_ms:.1f} ms late "
            f"(worst {max_ms:.1f} ms; the limit is {limit_ms:.1f} ms). The server was offered less than "
            f"{rate_rps:g} req/s, and the latencies include the lag. Try a lower rate, or perf_analyzer."
        )
    else:
        message = (
            f"The generator fell behind its schedule: 1% of the time {what} more than {p99_ms:.1f} ms late "
            f"(worst {max_ms:.1f} ms; the limit is {limit_ms:.1f} ms): other work held it up, this machine's or "
            "its own, so the latencies include the generator's wait and the server was offered less load than "
            "the run says. Fewer clients, or a quieter machine, measure the server alone."
        )
    return {"mean_ms": mean_ms, "p99_ms": p99_ms, "max_ms": max_ms, "fell_behind": fell_behind, "message": message}


class LoopWatch:
    """A timer due every `TICK_S` in the running event loop, and how late each fired, from
    `start()` to `stop()`. Ticks are due on a fixed clock, so a stall makes every tick due within
    it late, as it would an open loop's requests; ticks still due at `stop()` count as late until
    then (a loop held to the end never ran its timer at all)."""

    def __init__(self) -> None:
        self.lags_s: list[float] = []
        self._task: asyncio.Task | None = None
        self._started = 0.0
        self._next_tick = 1

    def _due(self) -> float:
        return self._started + self._next_tick * TICK_S

    def start(self) -> LoopWatch:
        self._started = time.perf_counter()
        self._task = asyncio.get_running_loop().create_task(self._watch())
        return self

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(max(self._due() - time.perf_counter(), 0.0))
            self.lags_s.append(time.perf_counter() - self._due())
            self._next_tick += 1

    def stop(self) -> dict[str, Any] | None:
        """Stop watching; the schedule lag of what was watched, None where no tick came due (a
        phase shorter than one tick has nothing to say)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
            stopped = time.perf_counter()
            while self._due() <= stopped:
                self.lags_s.append(stopped - self._due())
                self._next_tick += 1
        return schedule_lag(self.lags_s) if self.lags_s else None
