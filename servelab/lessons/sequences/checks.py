"""Notebook 11's checks: the sequence batcher, judged on Triton's statistics of each run
(`RunResult.triton_stats`: executions by batch size, the time a frame waited in Triton's queue),
and the sequences Triton or the model ends, judged on the specific refusal of a frame (`refusal`).
"""

from __future__ import annotations

import math

from servelab.lessons.expectations import Estimate, Expectation, condition, figure, measured, unless, unless_each
from servelab.results import RunResult, SequenceRunResult


def batcher_merges_sequences(oldest: RunResult | None, direct: RunResult | None, sequences: int) -> Expectation:
    """With `sequences` live sequences, each strategy runs at least 2 frames per execution on
    average. (One sequence at a time cannot be a condition: its client keeps one frame in flight,
    so each of its executions has one frame by construction.) Plausible wrong outcome: a strategy
    that runs each sequence's frame alone. NOT CHECKED with fewer than 2 sequences: no two
    sequences to merge."""
    return Expectation(
        "the sequence batcher puts frames of different sequences into one execution",
        tuple(
            unless(
                sequences >= 2,
                f"{sequences} sequence(s) live: no two sequences to merge",
                condition(f"with {sequences} sequences, {name}: average batch at least 2", average.value >= 2, average),
            )
            for name, run in (("oldest", oldest), ("direct", direct))
            for average in [figure(run, "triton_stats.avg_batch_size", f"average batch, {name}, {sequences} sequences")]
        ),
        estimate=Estimate(
            f"the average batch of the oldest strategy with {sequences} sequences",
            figure(oldest, "triton_stats.avg_batch_size", "").value,
            "frames",
        ),
    )


def batching_pays(alone: RunResult | None, batched: RunResult | None, sequences: int, hardware: str) -> Expectation:
    """Batching frames of `sequences` sequences pays where a batch costs less per frame: Triton's
    compute time per frame in the batches is under 0.8x that of a frame alone, and the batched
    run serves at least 1.2x the frames per second of one sequence at a time. Plausible wrong
    outcome: a device with no parallel work to spare (a CPU whose cores already work on one
    frame), where a batch costs its frames' sum. Both NOT CHECKED where no batch formed (an
    average batch under 2): then nothing was batched to pay. The reason says where a throughput
    gain came from when compute was not cheaper."""
    in_batch = figure(batched, "triton_stats.compute_ms_per_inference", f"compute per frame, {sequences} sequences")
    single = figure(alone, "triton_stats.compute_ms_per_inference", "compute per frame, 1 sequence")
    rate_batched = figure(batched, "throughput_rps", f"frames/s, {sequences} sequences")
    rate_alone = figure(alone, "throughput_rps", "frames/s, 1 sequence")
    average = figure(batched, "triton_stats.avg_batch_size", f"average batch, {sequences} sequences")
    cheaper = in_batch.value < 0.8 * single.value
    gain = rate_batched.value / rate_alone.value
    no_batch = f"the runs of {sequences} sequences averaged {average.value:.2f} frames an execution: no batch formed"
    return Expectation(
        "batching across sequences pays: cheaper frames in a batch, more frames per second",
        (
            *unless_each(
                not average.value < 2,
                no_batch,
                condition(
                    f"compute per frame in the batches of {sequences} sequences under 0.8x that of a frame alone",
                    cheaper,
                    in_batch,
                    single,
                ),
                condition(
                    f"{sequences} sequences serve at least 1.2x the frames per second of one at a time",
                    gain >= 1.2,
                    rate_batched,
                    rate_alone,
                    detail=f"{gain:.2f}x",
                ),
            ),
        ),
        reason=f"on {hardware}, a frame in a batch of {average.value:.1f} took {in_batch.value:.1f} ms of compute "
        f"against {single.value:.1f} ms alone"
        + (" (the device had parallel work to spare)" if cheaper else " (the device had no parallel work to spare)")
        + f", and {sequences} sequences served {gain:.2f}x the frames per second of one"
        + (
            ": that gain came from overlapping the work around the model (client, network, queue), not from "
            "cheaper compute"
            if gain >= 1.2 and not cheaper
            else ""
        ),
        estimate=Estimate(f"the frames per second of {sequences} sequences, over one at a time", gain, "x"),
    )


def evictions_break_the_oldest(
    at_capacity: SequenceRunResult | None, above: SequenceRunResult | None, capacity: int, logged: float
) -> Expectation:
    """A state cache of `capacity` sequences: `at_capacity` (that many sequences, each started
    once) breaks none off; `above` (twice as many) breaks at least `capacity` off, every one by an
    "evicted" error; and the model logged `logged` evictions over `above`, as many as its clients
    saw (NaN where the lab cannot read the model's log: NOT CHECKED). Plausible wrong outcomes:
    an unbounded cache (nothing broken at twice the capacity), sequences broken by another error,
    or a model that evicts silently. The log comparison is NOT CHECKED where nothing was evicted:
    zero against zero shows nothing."""
    completed = figure(at_capacity, "sequences_completed", f"completed of {capacity}")
    broken_at_capacity = measured(
        f"broken off, {capacity} sequences",
        math.nan if at_capacity is None else sum(at_capacity.sequences_failed.values()),
    )
    failed_above = math.nan if above is None else sum(above.sequences_failed.values())
    by_eviction = measured(
        f"broken off by 'evicted', {2 * capacity} sequences",
        math.nan if above is None else above.sequences_failed.get("evicted", 0),
    )
    by_other = measured(f"broken off by another error, {2 * capacity} sequences", failed_above - by_eviction.value)
    in_log = measured("evictions in the model's log", logged)
    return Expectation(
        "more live sequences than the cache holds break the least recently used ones, and say so",
        (
            condition(
                f"{capacity} sequences (the capacity): none broken off",
                broken_at_capacity.value == 0 and completed.value == capacity,
                broken_at_capacity,
                completed,
            ),
            condition(
                f"{2 * capacity} sequences: at least {capacity} broken off, every one by an evicted error",
                by_eviction.value >= capacity and by_other.value == 0,
                by_eviction,
                by_other,
                figure(above, "sequences_completed", f"completed of {2 * capacity}"),
            ),
            unless(
                not by_eviction.value == 0,
                "no sequence was evicted: the log has nothing to count",
                condition(
                    "the model logged as many evictions as the clients saw",
                    in_log.value == by_eviction.value,
                    in_log,
                    by_eviction,
                ),
            ),
        ),
        estimate=Estimate(f"the sequences broken off by 'evicted' of {2 * capacity}", by_eviction.value, "sequences"),
    )


def where_a_frame_waits(
    alone: RunResult | None, batched: RunResult | None, sequences: int, max_queue_delay_us: float
) -> Expectation:
    """Triton's queue time per frame (its statistics, not the client's latency): the wait for companions,
    up to the batcher's `max_queue_delay_us`, then for the execution running when the frame arrived. A
    lone frame never gets a companion, so it waits out the whole delay (0.8x to 1.5x of it); with
    `sequences` live sequences, all fitting one batch, a frame waits at most one execution (input to
    output) plus the delay, not several rounds. Plausible wrong outcomes: a lone frame sent at once
    (the batcher ignoring its delay), or frames queued behind a backlog of executions. The lone wait
    is NOT CHECKED where the config has no delay to wait for."""
    queue_alone = figure(alone, "triton_stats.avg_queue_us", "queue per frame, 1 sequence")
    queue_batched = figure(batched, "triton_stats.avg_queue_us", f"queue per frame, {sequences} sequences")
    delay = measured("max_queue_delay_microseconds (config)", max_queue_delay_us, "us")
    execution_us = sum(
        figure(batched, f"triton_stats.avg_compute_{stage}_us", f"compute {stage}").value
        for stage in ("input", "infer", "output")
    )
    execution = measured(f"one execution, {sequences} sequences (input to output)", execution_us, "us")
    return Expectation(
        "a frame waits for companions up to the queue delay, then for the execution ahead of it",
        (
            unless(
                max_queue_delay_us > 0,
                "the config sets no max_queue_delay_microseconds: a lone frame has no delay to wait out",
                condition(
                    "alone, a frame waits out the whole queue delay, and no more (0.8x to 1.5x of it)",
                    0.8 * max_queue_delay_us <= queue_alone.value <= 1.5 * max_queue_delay_us,
                    queue_alone,
                    delay,
                ),
            ),
            condition(
                f"with {sequences} sequences, a frame waits at most one execution plus the queue delay",
                queue_batched.value <= execution_us + max_queue_delay_us,
                queue_batched,
                execution,
                delay,
            ),
        ),
        estimate=Estimate(
            f"a frame's wait in Triton's queue with {sequences} sequences", queue_batched.value / 1000, "ms"
        ),
    )


# How Triton itself refuses a frame without START for a sequence it does not know (an ended one).
NOT_STARTED = "must specify the start flag"


def refusal(answer: object) -> str | None:
    """The message of a refused frame, lower-cased (an error: tritonclient's
    InferenceServerException has `message()`); None for an answered frame (its outputs)."""
    if not isinstance(answer, Exception):
        return None
    said = getattr(answer, "message", None)
    message = said() if callable(said) else str(answer)
    return str(message).strip().lower()


def _said(answer: object, start: str = "", anywhere: str = "") -> float:
    """1 where `answer` is a refusal whose message starts with `start` and contains `anywhere`, else 0."""
    message = refusal(answer)
    return float(message is not None and message.startswith(start) and anywhere in message)


def idle_and_cancelled_sequences(
    short_pause: object, long_pause: object, cancel: object, after_cancel: object, idle_s: float
) -> Expectation:
    """Each an answer (the frame's outputs) or the error that refused it: a sequence's frame after
    `idle_s` / 2 idle (`short_pause`) is answered; its frame after 2 x `idle_s` (`long_pause`) is
    refused as expired, by the model ("expired: ..."); another sequence's cancel (`cancel`, sent
    with sequence_end) is answered CANCELLED by the model ("cancelled: ..."); and that sequence's
    next frame (`after_cancel`) is refused by Triton as a frame without START for a sequence it
    does not know: the sequence is gone, NOT CHECKED where the cancel was not answered CANCELLED.
    Each judged on the specific refusal, never on any error."""
    answered = measured("frame after the short pause answered (1 yes, 0 no)", float(refusal(short_pause) is None))
    expired = measured("refused as expired (1 yes, 0 no)", _said(long_pause, "expired"))
    cancelled = measured("cancel answered CANCELLED (1 yes, 0 no)", _said(cancel, "cancelled"))
    gone = measured("next frame refused as not started (1 yes, 0 no)", _said(after_cancel, anywhere=NOT_STARTED))
    return Expectation(
        "an idle sequence expires after the idle timeout, and a cancelled sequence is gone",
        (
            condition(
                f"the frame after {idle_s / 2:g} s idle is answered",
                answered.value == 1,
                answered,
                detail=f"refused: {refusal(short_pause)}" if refusal(short_pause) else "",
            ),
            condition(f"the frame after {2 * idle_s:g} s idle is refused as expired", expired.value == 1, expired),
            condition("the cancel is answered CANCELLED", cancelled.value == 1, cancelled),
            unless(
                cancelled.value == 1,
                "the cancel was not answered CANCELLED: there is no cancelled sequence whose next frame to judge",
                condition(
                    "the cancelled sequence's next frame is refused as a frame without START: the sequence is gone",
                    gone.value == 1,
                    gone,
                ),
            ),
        ),
    )


def busy_sequence_times_out(
    kept_busy: list[object], past_limit: object, sequence_timeout_s: float, idle_timeout_s: float
) -> Expectation:
    """A sequence that never idles (frames closer together than `idle_timeout_s`) still loses its
    state once it is older than `sequence_timeout_s`: each frame of `kept_busy`, all sent before
    that age, is answered, and `past_limit`, the first sent after it, is refused as timed out by
    the model ("timed out: ..."). Plausible wrong outcomes: no total limit at all (the late frame
    answered), or the idle limit doing the job (refused as expired). NOT CHECKED where no frame
    was kept busy (nothing shows that the sequence lived up to the limit)."""
    answered = measured(
        f"frames answered of {len(kept_busy)} sent before {sequence_timeout_s:g} s",
        sum(refusal(answer) is None for answer in kept_busy),
    )
    timed_out = measured("refused as timed out (1 yes, 0 no)", _said(past_limit, "timed out"))
    return Expectation(
        "a sequence older than the sequence timeout loses its state, however busy it is",
        (
            unless(
                bool(kept_busy),
                "no frame was sent before the limit: nothing shows the sequence lived until then",
                condition(
                    f"every frame sent before {sequence_timeout_s:g} s, each under {idle_timeout_s:g} s after the "
                    "last, is answered",
                    answered.value == len(kept_busy),
                    answered,
                ),
            ),
            condition(
                f"the first frame after {sequence_timeout_s:g} s is refused as timed out, not expired",
                timed_out.value == 1,
                timed_out,
                detail=f"refused: {refusal(past_limit)}" if refusal(past_limit) else "answered",
            ),
        ),
    )
