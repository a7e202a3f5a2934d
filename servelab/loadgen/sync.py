"""The load generator from synchronous code: scripts, notebooks, the command line.

`closed_loop` and `open_loop` run a measurement to its end and return its `RunResult`,
`sequence_loop` a stateful model's run of sequences (a `SequenceRunResult`), and `stream_loop` a
closed loop of streamed requests (a `RunResult` with its `steps`); Ctrl-C stops a run
and returns what it had measured so far. Each takes the run's `Endpoint` (where the load goes)
and its load: a `Load` (closed loop, streams), a `SequenceLoad`, or an open loop's rate.
`describe_result` says a result in words (not to be confused with `measure.resources.summarize`,
the figures of a resource series).

Where a run is watched (a terminal, a notebook) and bounded by time, its progress is a bar over
its seconds, whose ETA is its end (`_clocked`); a run bounded by requests counts them on the
runner's own bar, whose total gives the ETA.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from servelab.loadgen.endpoint import Endpoint
from servelab.loadgen.load import Load, SequenceLoad
from servelab.loadgen.runners import run_closed, run_open
from servelab.loadgen.sequences import make_sequence_target, run_sequences
from servelab.loadgen.streams import make_stream_target, run_streams
from servelab.loadgen.targets import make_target
from servelab.progress import timed, watched
from servelab.results import RunResult, SequenceRunResult

log = logging.getLogger(__name__)

# A run's result: a RunResult, or a SequenceRunResult for a run of sequences.
Result = TypeVar("Result", bound=RunResult)


def _run_sync(run: Coroutine[Any, Any, Result]) -> Result:
    """Run a measurement to its end from synchronous code, and keep its result on Ctrl-C.

    The event loop runs in a worker thread, in a script and in a notebook alike: in Jupyter
    the main thread's loop is already running, and no second loop can run there. The main thread
    only waits, so it is the one that gets Ctrl-C (KeyboardInterrupt). It then cancels the run,
    which closes its target and returns what it had measured.
    """
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="servelab-loadgen", daemon=True)
    thread.start()
    try:
        task = asyncio.run_coroutine_threadsafe(_start_task(run), loop).result()
        outcome = asyncio.run_coroutine_threadsafe(_wait_for(task), loop)
        try:
            return _interruptible_result(outcome)
        except KeyboardInterrupt:
            log.warning("Ctrl-C: stopping the run (press it again to abandon it)")
            loop.call_soon_threadsafe(task.cancel)
            return _interruptible_result(outcome)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def _interruptible_result(outcome: concurrent.futures.Future[Result]) -> Result:
    # Python raises KeyboardInterrupt only when the main thread runs Python code. A wait that
    # never times out would not notice a SIGINT that the OS delivered to another thread.
    while True:
        try:
            return outcome.result(timeout=0.1)
        except concurrent.futures.TimeoutError:
            continue


async def _start_task(run: Coroutine[Any, Any, Result]) -> asyncio.Task[Result]:
    return asyncio.ensure_future(run)


async def _wait_for(task: asyncio.Task[Result]) -> Result:
    # Awaited from a second coroutine so that cancelling `task` leaves this one waiting for the
    # partial result that the cancelled run returns.
    return await task


@contextlib.contextmanager
def _clocked(
    description: str,
    duration_s: float | None,
    progress: bool,
    on_measuring: Callable[[], None] | None = None,
    warms_up: bool = False,
    warmup_s: float | None = None,
) -> Iterator[tuple[bool, Callable[[], None] | None]]:
    """A bar over a run's seconds while it runs, when `duration_s` alone bounds it and it is watched:
    its warm-up first, over `warmup_s` (None: a warm-up bounded by requests, shown over the
    measurement's seconds), then `duration_s` from when measurement starts. Yields the runner's own
    `progress` (off while this bar shows) and the `on_measuring` to give the runner."""
    if not (progress and duration_s and watched()):
        yield progress, on_measuring
        return
    with timed(f"{description}, warm-up" if warms_up else description, warmup_s or duration_s) as clock:

        def measuring() -> None:
            clock.restart(description, duration_s)
            if on_measuring:
                on_measuring()

        yield False, measuring


def closed_loop(
    endpoint: Endpoint, load: Load, progress: bool = True, on_measuring: Callable[[], None] | None = None
) -> RunResult:
    """`run_closed` of `load` against `make_target(endpoint)`, from synchronous code (a script or a
    notebook cell); `on_measuring()` is called as measurement starts, after the warm-up. Ctrl-C
    returns the partial result."""
    duration_s = load.duration_s if load.requests is None else None
    clock = _clocked(f"c={load.concurrency}", duration_s, progress, on_measuring, load.warms_up, load.warmup_s or None)
    with clock as (runner_progress, measuring):
        return _run_sync(run_closed(make_target(endpoint), load, runner_progress, measuring))


def open_loop(
    endpoint: Endpoint,
    rate_rps: float,
    arrival: str = "constant",
    requests: int | None = None,
    duration_s: float | None = None,
    warmup_s: float = 0.0,
    seed: int = 0,
    max_outstanding: int = 1000,
    progress: bool = True,
) -> RunResult:
    """`run_open` of `rate_rps` requests a second (see run_open for the rest) against
    `make_target(endpoint)`, from synchronous code (a script or a notebook cell). Ctrl-C returns
    the partial result."""
    target = make_target(endpoint)
    planned_s = warmup_s + duration_s if duration_s and requests is None else None  # the schedule's end
    with _clocked(f"{rate_rps:g} req/s", planned_s, progress) as (runner_progress, _):
        return _run_sync(
            run_open(target, rate_rps, arrival, requests, duration_s, warmup_s, seed, max_outstanding, runner_progress)
        )


def sequence_loop(
    endpoint: Endpoint, load: SequenceLoad, progress: bool = True, on_measuring: Callable[[], None] | None = None
) -> SequenceRunResult:
    """`run_sequences` of `load` against `make_sequence_target(endpoint)`, from synchronous code (a
    script or a notebook cell); `on_measuring()` is called as measurement starts, after the
    warm-up sequences. Ctrl-C returns the partial result."""
    duration_s = load.duration_s if load.sequences is None else None
    clock = _clocked(f"c={load.concurrency} sequences", duration_s, progress, on_measuring, load.warmup_sequences > 0)
    with clock as (runner_progress, measuring):
        return _run_sync(run_sequences(make_sequence_target(endpoint), load, runner_progress, measuring))


def stream_loop(
    endpoint: Endpoint, load: Load, steps: int, leave_after_steps: int | None = None, progress: bool = True
) -> RunResult:
    """`run_streams` of `load`, each stream `steps` steps long, the impatient senders leaving after
    `leave_after_steps` steps (or `load.patience_s`), against `make_stream_target(endpoint)`, from
    synchronous code. Ctrl-C returns the partial result."""
    with _clocked(f"c={load.concurrency}, {steps} steps", load.duration_s, progress) as (runner_progress, _):
        return _run_sync(run_streams(make_stream_target(endpoint), load, steps, leave_after_steps, runner_progress))


def describe_result(result: RunResult) -> str:
    """One paragraph in words: load, throughput, latency percentiles, errors, and any notes."""
    if isinstance(result, SequenceRunResult):
        return _describe_sequences(result)
    latency = result.latency
    if result.mode == "closed":
        load = f"Closed loop, {result.concurrency} concurrent senders"
    else:
        load = f"Open loop, {result.rate_rps:g} req/s offered ({result.arrival} arrivals)"
    errors = ", ".join(f"{count} {kind}" for kind, count in sorted(result.errors.items())) or "none"
    parts = [
        f"{load}, against {result.name}: {result.requests} requests in {result.wall_s:.1f} s, "
        f"{result.throughput_rps:.1f} successful req/s.",
        f"Latency{' from the scheduled send time' if result.mode == 'open' else ''}: "
        f"p50 {latency.p50_ms:.1f} ms, p95 {latency.p95_ms:.1f} ms, p99 {latency.p99_ms:.1f} ms, "
        f"max {latency.max_ms:.1f} ms (mean {latency.mean_ms:.1f} ms).",
        f"Errors: {errors}.",
    ]
    return " ".join(parts + _lag_sentences(result) + _sentences(result.notes))


def _describe_sequences(result: SequenceRunResult) -> str:
    pace = f"a frame every {result.frame_interval_s * 1000:g} ms" if result.frame_interval_s else "frames back to back"
    frame, sequence = result.latency, result.sequence_latency
    assert sequence is not None, "a run of sequences measures each sequence's latency"
    failed = ", ".join(f"{count} {kind}" for kind, count in sorted(result.sequences_failed.items())) or "none"
    parts = [
        f"{result.concurrency} sequences of {result.sequence_length} frames at once ({pace}), against "
        f"{result.name}: {result.sequences} sequences started in {result.wall_s:.1f} s, "
        f"{result.sequences_completed} completed, failed: {failed}.",
        f"{result.requests} frames, {result.throughput_rps:.1f} answered per second; {result.frames_skipped} "
        "skipped, as they came due while their sequence's previous frame was in flight.",
        f"Frame latency: p50 {frame.p50_ms:.1f} ms, p95 {frame.p95_ms:.1f} ms, p99 {frame.p99_ms:.1f} ms, "
        f"max {frame.max_ms:.1f} ms.",
        f"Sequence latency (first frame sent to last answered): p50 {sequence.p50_ms:.1f} ms, "
        f"max {sequence.max_ms:.1f} ms.",
    ]
    return " ".join(parts + _lag_sentences(result) + _sentences(result.notes))


def _lag_sentences(result: RunResult) -> list[str]:
    """An open loop says how it kept its schedule of arrivals; the other runs speak only where the
    machine held the generator up (servelab.loadgen.lag)."""
    lag = result.schedule_lag
    return [lag["message"]] if lag and (result.mode == "open" or lag["fell_behind"]) else []


def _sentences(notes: list[str]) -> list[str]:
    return [note[0].upper() + note[1:] + ("" if note.endswith(".") else ".") for note in notes]
