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


class Refused(Exception):
    """An error as tritonclient raises it: its text through `message()`."""

    def message(self) -> str:
        return str(self.args[0])


ANSWERED = {"SEQUENCE_LABEL": b"Soup", "FRAMES_SEEN": 2}
EXPIRED = Refused("expired: sequence 7 sent no frame for longer than the idle timeout (1 s)")
CANCELLED = Refused("cancelled: sequence 9 was cancelled by its client; its state was dropped")
NOT_STARTED = Refused("[StatusCode.INVALID_ARGUMENT] inference request for sequence 9 to model 'food_sequence' must "
                      "specify the START flag on the first request of the sequence")  # fmt: skip


def test_idle_and_cancelled_sequences_hold_on_their_specific_refusals():
    held = sequences.idle_and_cancelled_sequences(ANSWERED, EXPIRED, CANCELLED, NOT_STARTED, 1.0)
    assert [part.outcome for part in held.conditions] == [Outcome.HELD] * 4
    assert held.conditions[3].figures[0].name == "next frame refused as not started (1 yes, 0 no)"


def test_idle_and_cancelled_sequences_fail_on_any_other_error():
    """The wrong outcomes the former check passed: the next frame refused for another reason (the
    server down, a bad input), and a long pause refused as evicted rather than expired."""
    down = Refused("[StatusCode.UNAVAILABLE] failed to connect to all addresses")
    evicted = Refused("evicted: sequence 7 was the least recently used")
    failed = sequences.idle_and_cancelled_sequences(EXPIRED, evicted, down, down, 1.0)
    assert [part.outcome for part in failed.conditions] == [Outcome.NOT_HELD] * 3 + [Outcome.NOT_CHECKED]
    assert failed.conditions[0].detail.startswith("refused: expired")
    assert failed.conditions[3].detail.startswith("the cancel was not answered CANCELLED")
    wrong_refusal = sequences.idle_and_cancelled_sequences(ANSWERED, EXPIRED, CANCELLED, down, 1.0)
    assert [part.outcome for part in wrong_refusal.conditions] == [Outcome.HELD] * 3 + [Outcome.NOT_HELD]
    # An answer where a refusal was due fails too.
    kept = sequences.idle_and_cancelled_sequences(ANSWERED, ANSWERED, CANCELLED, ANSWERED, 1.0)
    assert [part.outcome for part in kept.conditions] == [Outcome.HELD, Outcome.NOT_HELD, Outcome.HELD,
                                                          Outcome.NOT_HELD]  # fmt: skip
    # A cancel that was answered instead: the next frame is not judged as the refusal of a cancelled sequence.
    uncancelled = sequences.idle_and_cancelled_sequences(ANSWERED, EXPIRED, ANSWERED, NOT_STARTED, 1.0)
    assert [part.outcome for part in uncancelled.conditions][2:] == [Outcome.NOT_HELD, Outcome.NOT_CHECKED]
