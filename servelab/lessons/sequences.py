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


def frame_waits_for_its_batch(alone: RunResult | None, batched: RunResult | None, sequences: int) -> Expectation:
    """A frame of one of `sequences` sequences waits longer in Triton's queue than a frame of a
    sequence alone: Triton's own queue time, not the client's latency (which also counts the
    longer execution of a batch)."""
    queue_batched = figure(batched, "triton_stats.avg_queue_us", f"queue per frame, {sequences} sequences")
    queue_alone = figure(alone, "triton_stats.avg_queue_us", "queue per frame, 1 sequence")
    return Expectation(
        "a frame waits for the batch it rides in",
        (
            condition(
                f"a frame waits longer in Triton's queue with {sequences} sequences than alone",
                queue_batched.value > queue_alone.value,
                queue_batched,
                queue_alone,
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
