"""Notebook 10's checks: the sequence batcher, judged on Triton's statistics of each run
(`RunResult.triton_stats`: executions by batch size, the time a frame waited in Triton's queue)."""

from __future__ import annotations

from servelab.lessons.expectations import Expectation, condition, figure, measured, unless
from servelab.results import RunResult


def batcher_merges_sequences(oldest: RunResult | None, direct: RunResult | None, sequences: int) -> Expectation:
    """With `sequences` live sequences, each strategy runs at least 2 frames per execution on
    average. (One sequence at a time cannot be a condition: its client keeps one frame in flight,
    so each of its executions has one frame by construction.)"""
    return Expectation(
        "the sequence batcher puts frames of different sequences into one execution",
        tuple(
            condition(
                f"with {sequences} sequences, {name}: average batch at least 2",
                average.value >= 2,
                average,
            )
            for name, run in (("oldest", oldest), ("direct", direct))
            for average in [figure(run, "triton_stats.avg_batch_size", f"average batch, {name}, {sequences} sequences")]
        ),
    )


def where_a_frame_waits(
    alone: RunResult | None, batched: RunResult | None, sequences: int, max_queue_delay_us: float
) -> Expectation:
    """Triton's queue time per frame (its statistics, not the client's latency) has two parts: the
    wait for companions, up to the batcher's `max_queue_delay_us`, and the wait for the instance
    to finish the execution running when the frame arrived. A frame of a sequence alone never gets
    a companion, so it waits the whole delay, and no more (0.8x to 1.5x of it). With `sequences`
    live sequences, all fitting one batch, a frame waits at most the one execution before it
    (the compute time of a frame's execution, input to output) plus the delay: it is not held for
    several rounds. Plausible wrong outcomes: a lone frame sent at once (the batcher ignoring its
    delay), or frames of the batched run queued behind a backlog of executions. The bound on the
    lone wait is NOT CHECKED where the config has no delay to wait for."""
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
