"""The runners: closed loop (N senders) and open loop (a request rate), in asyncio.

- Closed loop (`run_closed`): N concurrent senders, each sending its next request as soon as
  the previous one is answered. It measures what the server does at a fixed number of requests
  in flight. When the server slows down, the senders slow down with it.
- Open loop (`run_open`): requests arrive on a schedule (a constant rate, or a Poisson process
  like independent users), whether or not earlier ones were answered. Latency is measured from
  each request's *scheduled* time, not from when the generator got round to sending it:
  measuring from the send time would hide the wait of every request queued behind a stall
  ("coordinated omission").

A closed loop can also have *impatient* senders: each gives up on a request after `patience_s`
and cancels it the way its protocol does (closing the HTTP connection, cancelling the gRPC call),
then sends the next as a new client. A cancelled request is its own outcome, not an error.

Each run returns one `RunResult`. Cancelling a run (Ctrl-C) returns what it had measured.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from servelab.loadgen.lag import LoopWatch, schedule_lag
from servelab.loadgen.load import Load, bounds_in_words
from servelab.loadgen.targets import RequestError, Target
from servelab.progress import bar as progress_bar
from servelab.progress import watched as progress_watched
from servelab.results import LatencySummary, RunResult

log = logging.getLogger(__name__)

ARRIVALS = ("constant", "poisson")


class Recorder:
    """Outcomes of one phase of a run (warm-up or measurement), and its progress bar. `unit` is
    what one request is called in the progress ("request", or a sequence's "frame"). With
    `watch_loop`, it watches how late the generator's event loop runs until the phase ends
    (servelab.loadgen.lag): the schedule lag of a run that has no schedule of arrivals."""

    def __init__(
        self, description: str, total: int | None, progress: bool, unit: str = "request", watch_loop: bool = False
    ) -> None:
        self.latencies_ms: list[float] = []
        self.patient_latencies_ms: list[float] = []  # answered to senders without a deadline
        self.errors: Counter[str] = Counter()
        self.cancelled = 0  # requests their (impatient) client gave up on
        # [ended at (s since the phase began), latency ms (of a failure too; None if never sent), outcome]
        self.timeline: list[list] = []
        self.started = time.perf_counter()
        self.ended: float | None = None
        self.description = description
        self.unit = unit
        # A bar where it is watched (a terminal, a notebook's kernel: servelab.progress); elsewhere (CI,
        # a log file) one line when the phase ends, instead of thousands of carriage-return updates.
        self.line_at_end = progress and progress_watched() is None
        self.bar = progress_bar(description, total, unit, shown=progress, leave=False)
        self.watch = LoopWatch().start() if watch_loop else None
        self.schedule_lag: dict[str, Any] | None = None

    def success(self, latency_s: float, patient: bool = True) -> None:
        self.latencies_ms.append(latency_s * 1000.0)
        if patient:
            self.patient_latencies_ms.append(latency_s * 1000.0)
        self.timeline.append([time.perf_counter() - self.started, latency_s * 1000.0, "ok"])
        self.bar.update()

    def gave_up(self, latency_s: float) -> None:
        """A request its client cancelled after `latency_s`, its patience."""
        self.cancelled += 1
        self.timeline.append([time.perf_counter() - self.started, latency_s * 1000.0, "cancelled"])
        self.bar.update()

    def failure(self, error: RequestError, latency_s: float | None = None) -> None:
        """A request that failed after `latency_s` (None: it was never sent)."""
        if error.kind not in self.errors:  # the first of each kind says what went wrong
            log.warning("request failed (%s)%s", error.kind, f": {error.detail}" if error.detail else "")
        self.errors[error.kind] += 1
        failed_after = None if latency_s is None else latency_s * 1000.0
        self.timeline.append([time.perf_counter() - self.started, failed_after, error.kind])
        self.bar.update()

    @property
    def count(self) -> int:
        return len(self.latencies_ms) + sum(self.errors.values()) + self.cancelled

    def finish(self) -> None:
        if self.ended is None:
            self.ended = time.perf_counter()
            if self.watch is not None:
                self.schedule_lag = self.watch.stop()
            if self.line_at_end:
                log.info("%s: %d %ss in %.1f s", self.description, self.count, self.unit, self.wall_s)
        self.bar.close()

    @property
    def wall_s(self) -> float:
        return max((self.ended or time.perf_counter()) - self.started, 0.0)


async def _timed_send(target: Target, since: float, recorder: Recorder, patience_s: float | None = None) -> bool:
    """Send once; the latency runs from `since` (the send time, or the scheduled time). With
    `patience_s`, give up and cancel the request after that long. True when it was answered."""
    try:
        if patience_s is None:  # the common case keeps its cost: no timer per request
            await target.send()
        else:
            async with asyncio.timeout(patience_s) as patience:
                await target.send()
    except RequestError as error:
        recorder.failure(error, time.perf_counter() - since)
        return False
    except TimeoutError:
        if patience_s is None or not patience.expired():
            raise
        recorder.gave_up(time.perf_counter() - since)  # the send was cancelled: connection closed, call cancelled
        return False
    recorder.success(time.perf_counter() - since, patient=patience_s is None)
    return True


def _check_bounds(requests: int | None, duration_s: float | None) -> None:
    if requests is None and duration_s is None:
        raise ValueError("give requests, duration_s or both: the run stops at whichever comes first")
    if (requests is not None and requests < 1) or (duration_s is not None and duration_s <= 0):
        raise ValueError("requests and duration_s must be positive")


def interrupted_note(recorder: Recorder) -> str:
    return f"stopped early by Ctrl-C after {recorder.count} {recorder.unit}s"


def run_result(name: str, mode: str, recorder: Recorder, notes: list[str], **load: Any) -> RunResult:
    """The RunResult of a finished run, named `name`: `load` are the fields that say how it loaded the target."""
    successes = len(recorder.latencies_ms)
    wall_s = recorder.wall_s
    if recorder.cancelled or load.get("impatient"):
        load["patient_latency"] = LatencySummary.of(recorder.patient_latencies_ms)
    return RunResult(
        name=name,
        tool="loadgen",
        mode=mode,
        requests=recorder.count,
        throughput_rps=successes / wall_s if wall_s > 0 else 0.0,
        latency=LatencySummary.of(recorder.latencies_ms),
        wall_s=wall_s,
        errors=dict(recorder.errors),
        cancelled=recorder.cancelled,
        latencies_ms=recorder.latencies_ms,
        timeline=recorder.timeline,
        notes=notes,
        schedule_lag=recorder.schedule_lag,
        **load,
    )


async def _closed_phase(target: Target, load: Load, recorder: Recorder) -> None:
    """`load.concurrency` senders, each sending again as soon as it has its answer, or
    `load.backoff_s` after a request that was not answered (refused, or given up on:
    `load.impatient` of the senders give up after `load.patience_s`), until `load.requests` or
    `load.duration_s`."""
    limit = math.inf if load.requests is None else load.requests
    deadline = math.inf if load.duration_s is None else recorder.started + load.duration_s
    issued = 0

    async def sender(patience: float | None) -> None:
        nonlocal issued
        # Requests already sent when the deadline passes are waited for and counted.
        while issued < limit and time.perf_counter() < deadline:
            issued += 1  # no await between check and increment: no other sender can interleave
            if not await _timed_send(target, time.perf_counter(), recorder, patience) and load.backoff_s:
                await asyncio.sleep(load.backoff_s)

    patiences = [None] * (load.concurrency - load.impatient) + [load.patience_s] * load.impatient
    try:
        # If this is cancelled (Ctrl-C), gather cancels the senders and their requests in flight.
        await asyncio.gather(*(sender(patience) for patience in patiences))
    finally:
        recorder.finish()


async def run_closed(
    target: Target, load: Load, progress: bool = True, on_measuring: Callable[[], None] | None = None
) -> RunResult:
    """Closed loop: `load.concurrency` senders until `load.requests` are answered or
    `load.duration_s` has passed. With `load.backoff_s`, a sender whose request failed waits that
    long before its next one, as a client that respects a refusal (503) does; by default it sends
    again at once. `load.impatient` of the senders give up on a request after `load.patience_s`
    and cancel it (counted in `cancelled`), and wait `backoff_s` too before the next: a new client
    arriving later. The result then also has the latency of the patient senders' answers.

    Warm-up (up to `load.warmup_requests` requests or `load.warmup_s` seconds, whichever comes
    first) runs at the same concurrency and is finished before measurement starts, so none of it
    is counted. `on_measuring()` is called as measurement starts, after the warm-up: what a
    caller counts from there (a server's counters, say) covers the measured requests and no
    others. Cancelling the run (Ctrl-C) returns what was measured until then, with a note saying so.
    """
    _check_bounds(load.requests, load.duration_s)
    if load.impatient and not load.patience_s:
        raise ValueError("impatient senders are 0 to concurrency, and need a positive patience_s")
    concurrency, backoff_s, impatient = load.concurrency, load.backoff_s, load.impatient
    log.info("closed loop against %s: concurrency %d, %s", target.name, concurrency, load.bounds())
    notes: list[str] = [f"after a request that was not answered, a sender waited {backoff_s:g} s"] if backoff_s else []
    if impatient:
        notes.append(
            f"{impatient} of the {concurrency} senders gave up on a request after {load.patience_s:g} s, cancelled it "
            f"and sent the next as a new client{f' {backoff_s:g} s later' if backoff_s else ''}"
        )
    recorder: Recorder | None = None
    await target.open(connections=concurrency)
    try:
        if load.warms_up:
            warmup = load.warmup()
            await _closed_phase(target, warmup, Recorder("warm-up", warmup.requests, progress))
        if on_measuring:
            on_measuring()  # called in the loop's thread, blocking it: nothing is in flight between the phases
        recorder = Recorder(f"c={concurrency}", load.requests, progress, watch_loop=True)
        await _closed_phase(target, load, recorder)
    except asyncio.CancelledError:
        # Deliberately not re-raised: stopping early is how a user ends a long run, and what
        # was measured so far is the result they asked for.
        recorder = recorder or Recorder(f"c={concurrency}", load.requests, progress=False)
        recorder.finish()
        notes.append(interrupted_note(recorder))
        log.warning("%s", notes[-1])
    finally:
        await target.close()
    return run_result(target.name, "closed", recorder, notes, concurrency=concurrency, impatient=impatient)


def arrival_offsets(rate_rps: float, arrival: str = "constant", seed: int = 0) -> Iterator[float]:
    """Endless arrival times in seconds from the start: cumulative sums of inter-arrival gaps,
    either all 1/rate ("constant") or exponential with mean 1/rate ("poisson", seeded)."""
    if rate_rps <= 0:
        raise ValueError("rate_rps must be positive")
    if arrival == "constant":
        index = 1
        while True:
            yield index / rate_rps  # multiplied, not summed, so rounding errors do not pile up
            index += 1
    if arrival != "poisson":
        raise ValueError(f"unknown arrival process {arrival!r}; choose one of {', '.join(ARRIVALS)}")
    rng = np.random.default_rng(seed)
    elapsed = 0.0
    while True:
        for gap in rng.exponential(1.0 / rate_rps, size=1024):
            elapsed += float(gap)
            yield elapsed


async def run_open(
    target: Target,
    rate_rps: float,
    arrival: str = "constant",
    requests: int | None = None,
    duration_s: float | None = None,
    warmup_s: float = 0.0,
    seed: int = 0,
    max_outstanding: int = 1000,
    progress: bool = True,
) -> RunResult:
    """Open loop: requests at `rate_rps` on a schedule, each sent at its time whatever the others do.

    Arrivals in the first `warmup_s` seconds are sent but not counted. After them come `requests`
    measured arrivals, or `duration_s` seconds of them, whichever ends first. Latency runs from
    the scheduled time. If `max_outstanding` requests are already waiting for answers, a new
    arrival is dropped and counted as a "generator_overload" error. Cancelling the run (Ctrl-C)
    returns what was measured until then, with a note saying so.
    """
    _check_bounds(requests, duration_s)
    if max_outstanding < 1 or warmup_s < 0:
        raise ValueError("max_outstanding must be at least 1, and warmup_s not negative")
    schedule = arrival_offsets(rate_rps, arrival, seed)
    limit = math.inf if requests is None else requests
    end_s = math.inf if duration_s is None else warmup_s + duration_s
    log.info(
        "open loop against %s: %g req/s %s, %s", target.name, rate_rps, arrival, bounds_in_words(requests, duration_s)
    )
    if warmup_s:
        log.info("warming up for %g s", warmup_s)
    warmup = Recorder("warm-up", None, progress=False)
    recorder: Recorder | None = None  # created when the first measured request is due
    measured = 0  # measured arrivals so far, sent or dropped
    in_flight: set[asyncio.Task] = set()
    lags_s: list[float] = []
    notes: list[str] = []

    async def scheduled_send(scheduled: float, phase: Recorder) -> None:
        if phase is not warmup:
            lags_s.append(time.perf_counter() - scheduled)
        await _timed_send(target, scheduled, phase)

    await target.open(connections=max_outstanding)
    started = time.perf_counter()
    try:
        for offset in schedule:
            if offset >= end_s or measured >= limit:
                break
            if offset < warmup_s:
                phase = warmup
            else:
                if recorder is None:
                    warmup.finish()
                    recorder = Recorder(f"{rate_rps:g} req/s", requests, progress)
                    recorder.started = started + warmup_s
                phase = recorder
                measured += 1
            scheduled = started + offset
            # sleep(0) when late still yields, so that answers are handled between arrivals.
            await asyncio.sleep(max(scheduled - time.perf_counter(), 0.0))
            if len(in_flight) >= max_outstanding:
                phase.failure(RequestError("generator_overload", f"{max_outstanding} requests already outstanding"))
                continue
            task = asyncio.create_task(scheduled_send(scheduled, phase))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        await asyncio.gather(*in_flight)
    except asyncio.CancelledError:
        # As in run_closed, stopping early keeps what was measured. The requests in flight
        # are cancelled, not waited for: their answers may never come.
        for task in in_flight:
            task.cancel()
        await asyncio.gather(*in_flight, return_exceptions=True)
        recorder = recorder or Recorder(f"{rate_rps:g} req/s", requests, progress=False)
        notes.append(interrupted_note(recorder))
        log.warning("%s", notes[-1])
    finally:
        warmup.finish()
        if recorder is not None:
            recorder.finish()
        await target.close()
    if recorder is None:  # the run ended within its warm-up
        recorder = Recorder(f"{rate_rps:g} req/s", requests, progress=False)
        recorder.finish()
    overloaded = recorder.errors.get("generator_overload", 0)
    if overloaded:
        notes.append(
            f"{overloaded} requests were not sent because {max_outstanding} were already waiting for answers: "
            f"the server could not keep up with {rate_rps:g} req/s. The latencies understate what users "
            "would have seen; lower the rate, or raise max_outstanding."
        )
        log.warning("%s", notes[-1])
    lag = schedule_lag(lags_s, rate_rps)
    if lag["fell_behind"]:
        log.warning("%s", lag["message"])
    result = run_result(target.name, "open", recorder, notes, rate_rps=rate_rps, arrival=arrival)
    result.schedule_lag = lag
    return result
