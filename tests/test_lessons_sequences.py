"""Notebook 10's checks, each fed a case it must pass and one it must fail."""

from servelab.lessons import sequences
from servelab.lessons.expectations import Outcome
from tests.helpers import synthetic_run


def frames(avg_batch: float, queue_us: float):
    stats = {"avg_batch_size": avg_batch, "avg_queue_us": queue_us}
    return synthetic_run("triton/food_sequence", 8, 40, 50, triton_stats=stats)


def test_the_batcher_check_holds_on_batches_and_fails_on_a_strategy_that_ran_frames_alone():
    assert sequences.batcher_merges_sequences(frames(5.5, 900), frames(7.9, 1500), 8).outcome is Outcome.HELD
    failed = sequences.batcher_merges_sequences(frames(5.5, 900), frames(1.1, 0), 8)
    assert [part.outcome for part in failed.conditions] == [Outcome.HELD, Outcome.NOT_HELD]


def test_the_wait_for_a_batch_is_judged_on_triton_s_queue_time():
    alone = frames(1.0, 60)
    assert sequences.frame_waits_for_its_batch(alone, frames(5.5, 900), 8).outcome is Outcome.HELD
    # A higher latency with 8 sequences would not do: no longer wait in the queue fails the claim.
    failed = sequences.frame_waits_for_its_batch(alone, frames(5.5, 40), 8)
    assert failed.outcome is Outcome.NOT_HELD
    assert [item.name for item in failed.conditions[0].figures] == ["queue per frame, 8 sequences",
                                                                     "queue per frame, 1 sequence"]  # fmt: skip
