"""Notebook 10's checks: the sequence batcher, judged on Triton's statistics of each run
(`RunResult.triton_stats`: executions by batch size, the time a frame waited in Triton's queue)."""

from __future__ import annotations

from servelab.lessons.expectations import Expectation, condition, figure
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
