"""Notebook 11's checks, each fed a case it must pass and one it must fail."""

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from servelab import paths
from servelab.lessons import sequences
from servelab.lessons.expectations import Outcome
from servelab.results import LatencySummary, SequenceRunResult
from servelab.triton.models import ModelRepository
from tests.helpers import synthetic_run
from tests.helpers.lessons import outcomes


def frames(avg_batch: float, queue_us: float):
    stats = {"avg_batch_size": avg_batch, "avg_queue_us": queue_us}
    return synthetic_run("triton/food_sequence", 8, 40, 50, triton_stats=stats)


def test_the_batcher_check_holds_on_batches_and_fails_on_a_strategy_that_ran_frames_alone():
    merged = sequences.batcher_merges_sequences(frames(5.5, 900), frames(7.9, 1500), 8)
    assert merged.outcome is Outcome.HELD and merged.estimate is not None and merged.estimate.value == 5.5  # oldest's
    failed = sequences.batcher_merges_sequences(frames(5.5, 900), frames(1.1, 0), 8)
    assert outcomes(failed) == [Outcome.HELD, Outcome.NOT_HELD]
    alone = sequences.batcher_merges_sequences(frames(1.0, 900), frames(1.0, 0), 1)
    assert outcomes(alone) == [Outcome.NOT_CHECKED] * 2
    assert alone.conditions[0].detail == "1 sequence(s) live: no two sequences to merge"


def queued(queue_us: float, execution_us: float = 0.0):
    """A run of frames whose executions took `execution_us` each, input to output."""
    stats = {
        "avg_batch_size": 5.0,
        "avg_queue_us": queue_us,
        "avg_compute_input_us": 0.1 * execution_us,
        "avg_compute_infer_us": 0.8 * execution_us,
        "avg_compute_output_us": 0.1 * execution_us,
    }
    return synthetic_run("triton/food_sequence", 8, 40, 50, triton_stats=stats)


def test_a_frame_waits_out_the_delay_alone_and_at_most_one_execution_plus_it_with_company():
    # Both directions of the batched wait hold: full-profile runs measured 544 us (batches filled
    # at once) and 26,700 us (frames arriving behind a 90 ms execution), against 2,180 us alone.
    for batched in (queued(544, 90_000), queued(26_700, 90_000)):
        assert sequences.where_a_frame_waits(queued(2_180), batched, 8, 2_000).outcome is Outcome.HELD
    # Wrong: a lone frame sent at once, as if the batcher had no delay to wait out.
    sent_at_once = sequences.where_a_frame_waits(queued(60), queued(544, 90_000), 8, 2_000)
    assert outcomes(sent_at_once) == [Outcome.NOT_HELD, Outcome.HELD]
    # Wrong: frames held behind a backlog of three executions.
    backlog = sequences.where_a_frame_waits(queued(2_180), queued(270_000, 90_000), 8, 2_000)
    assert outcomes(backlog) == [Outcome.HELD, Outcome.NOT_HELD]
    assert backlog.estimate is not None and (backlog.estimate.value, backlog.estimate.unit) == (270.0, "ms")
    assert [item.name for item in backlog.conditions[1].figures] == [
        "queue per frame, 8 sequences",
        "one execution, 8 sequences (input to output)",
        "max_queue_delay_microseconds (config)",
    ]
    # No delay configured: the lone wait has nothing to be judged against.
    no_delay = sequences.where_a_frame_waits(queued(40), queued(5_000, 90_000), 8, 0)
    assert outcomes(no_delay) == [Outcome.NOT_CHECKED, Outcome.HELD]
    assert "no max_queue_delay_microseconds" in no_delay.conditions[0].detail


class Refused(Exception):
    """An error as tritonclient raises it: its text through `message()`."""

    def message(self) -> str:
        return str(self.args[0])


ANSWERED = {"SEQUENCE_LABEL": b"Soup", "FRAMES_SEEN": 2}
EXPIRED = Refused("expired: sequence 7 sent no frame for longer than the idle timeout (1 s)")
CANCELLED = Refused("cancelled: sequence 9 was cancelled by its client; its state was dropped")
NOT_STARTED = Refused(
    "[StatusCode.INVALID_ARGUMENT] inference request for sequence 9 to model 'food_sequence' must "
    "specify the START flag on the first request of the sequence"
)


def test_idle_and_cancelled_sequences_hold_on_their_specific_refusals():
    held = sequences.idle_and_cancelled_sequences(ANSWERED, EXPIRED, CANCELLED, NOT_STARTED, 1.0)
    assert outcomes(held) == [Outcome.HELD] * 4
    assert held.conditions[3].figures[0].name == "next frame refused as not started (1 yes, 0 no)"


def test_idle_and_cancelled_sequences_fail_on_any_other_error():
    """The wrong outcomes the former check passed: the next frame refused for another reason (the
    server down, a bad input), and a long pause refused as evicted rather than expired."""
    down = Refused("[StatusCode.UNAVAILABLE] failed to connect to all addresses")
    evicted = Refused("evicted: sequence 7 was the least recently used")
    failed = sequences.idle_and_cancelled_sequences(EXPIRED, evicted, down, down, 1.0)
    assert outcomes(failed) == [Outcome.NOT_HELD] * 3 + [Outcome.NOT_CHECKED]
    assert failed.conditions[0].detail.startswith("refused: expired")
    assert failed.conditions[3].detail.startswith("the cancel was not answered CANCELLED")
    wrong_refusal = sequences.idle_and_cancelled_sequences(ANSWERED, EXPIRED, CANCELLED, down, 1.0)
    assert outcomes(wrong_refusal) == [Outcome.HELD] * 3 + [Outcome.NOT_HELD]
    # An answer where a refusal was due fails too.
    kept = sequences.idle_and_cancelled_sequences(ANSWERED, ANSWERED, CANCELLED, ANSWERED, 1.0)
    assert outcomes(kept) == [Outcome.HELD, Outcome.NOT_HELD, Outcome.HELD, Outcome.NOT_HELD]
    # A cancel that was answered instead: the next frame is not judged as the refusal of a cancelled sequence.
    uncancelled = sequences.idle_and_cancelled_sequences(ANSWERED, EXPIRED, ANSWERED, NOT_STARTED, 1.0)
    assert outcomes(uncancelled)[2:] == [Outcome.NOT_HELD, Outcome.NOT_CHECKED]


TIMED_OUT = Refused("timed out: sequence 11 ran longer than the sequence timeout (3 s, parameter sequence_timeout_s)")


def test_a_busy_sequence_times_out_on_its_age_and_not_on_idling():
    held = sequences.busy_sequence_times_out([ANSWERED] * 5, TIMED_OUT, 3.0, 2.0)
    assert held.outcome is Outcome.HELD, held
    # Wrong: no total limit (the late frame answered), or the idle limit fired instead.
    for late in (ANSWERED, EXPIRED):
        failed = sequences.busy_sequence_times_out([ANSWERED] * 5, late, 3.0, 2.0)
        assert outcomes(failed) == [Outcome.HELD, Outcome.NOT_HELD]
    # Wrong: the sequence lost its state before the limit.
    early = sequences.busy_sequence_times_out([ANSWERED, ANSWERED, TIMED_OUT], TIMED_OUT, 3.0, 2.0)
    assert outcomes(early) == [Outcome.NOT_HELD, Outcome.HELD]
    # Nothing sent before the limit: whether it lived until then is not shown.
    unseen = sequences.busy_sequence_times_out([], TIMED_OUT, 3.0, 2.0)
    assert outcomes(unseen) == [Outcome.NOT_CHECKED, Outcome.HELD]


def compute(avg_batch: float, ms_per_frame: float, frames_per_s: float):
    stats = {"avg_batch_size": avg_batch, "compute_ms_per_inference": ms_per_frame}
    return synthetic_run("triton/food_sequence", 8, frames_per_s, 50, triton_stats=stats)


def test_batching_pays_on_cheaper_frames_and_is_not_checked_where_no_batch_formed():
    alone = compute(1.0, 40.0, 22.0)
    pays = sequences.batching_pays(alone, compute(4.1, 26.5, 36.8), 8, "cpu")
    assert pays.outcome is Outcome.HELD and pays.estimate is not None and pays.estimate.value == 36.8 / 22.0
    # Wrong: no parallel work to spare, a batch costs its frames' sum, and throughput barely moves.
    flat = sequences.batching_pays(alone, compute(4.1, 39.0, 23.0), 8, "cpu")
    assert outcomes(flat) == [Outcome.NOT_HELD, Outcome.NOT_HELD]
    assert "no parallel work to spare" in flat.reason
    # A gain without cheaper compute: said to come from overlapping the work around the model.
    overlapped = sequences.batching_pays(alone, compute(4.1, 39.0, 30.0), 8, "cpu")
    assert outcomes(overlapped) == [Outcome.NOT_HELD, Outcome.HELD]
    assert "overlapping the work around the model" in overlapped.reason
    # No batch formed: nothing was batched, so neither condition can be judged.
    unbatched = sequences.batching_pays(alone, compute(1.3, 39.0, 23.0), 8, "cpu")
    assert outcomes(unbatched) == [Outcome.NOT_CHECKED] * 2
    assert "no batch formed" in unbatched.conditions[0].detail


def live(started: int, completed: int, **failed: int) -> SequenceRunResult:
    return SequenceRunResult(
        "food_sequence",
        "loadgen",
        "sequences",
        10 * started,
        20.0,
        LatencySummary.of([50.0]),
        2.0,
        concurrency=started,
        sequence_length=10,
        sequences=started,
        sequences_completed=completed,
        sequences_failed=failed,
    )


def test_evictions_break_the_oldest_and_the_log_counts_them():
    held = sequences.evictions_break_the_oldest(live(4, 4), live(8, 4, evicted=4), 4, 4.0)
    assert held.outcome is Outcome.HELD, held
    assert held.estimate is not None and held.estimate.value == 4  # of 8 sequences, 4 evicted: the number asked
    # Wrong: an unbounded cache breaks nothing at twice the capacity.
    unbounded = sequences.evictions_break_the_oldest(live(4, 4), live(8, 8), 4, 0.0)
    assert outcomes(unbounded) == [Outcome.HELD, Outcome.NOT_HELD, Outcome.NOT_CHECKED]
    assert "no sequence was evicted" in unbounded.conditions[2].detail
    # Wrong: sequences broken by another error, and a model that evicts without a word in its log.
    other = sequences.evictions_break_the_oldest(live(4, 4), live(8, 2, evicted=4, expired=2), 4, 0.0)
    assert outcomes(other) == [Outcome.HELD, Outcome.NOT_HELD, Outcome.NOT_HELD]
    # Wrong: a sequence broken off at the capacity.
    tight = sequences.evictions_break_the_oldest(live(4, 3, evicted=1), live(8, 4, evicted=4), 4, 4.0)
    assert tight.conditions[0].outcome is Outcome.NOT_HELD
    # No log to read here: the count is NOT CHECKED, the rest judged.
    unread = sequences.evictions_break_the_oldest(live(4, 4), live(8, 4, evicted=4), 4, math.nan)
    assert outcomes(unread) == [Outcome.HELD, Outcome.HELD, Outcome.NOT_CHECKED]


# ---- StatefulModel: the notebook's frames, runs, log and configs, against fakes of Triton and the lab ----


class FakeTriton:
    def __init__(self, log: Path | None = None) -> None:
        self.log_file, self.calls = log, []
        self.configs = self  # its apply_config and restore_config answer as the served configs'

    def log(self) -> Path | None:
        return self.log_file

    def apply_config(self, model: str, config: str) -> None:
        self.calls.append(("apply", model, config))

    def restore_config(self, model: str) -> None:
        self.calls.append(("restore", model))


class FakeLab:
    """What StatefulModel uses of the lab: its models, its load generator's sequences, its Triton side."""

    models = ModelRepository()
    profile = SimpleNamespace(duration_s=12.0)

    def __init__(self, log: Path | None = None) -> None:
        self.triton, self.asked = FakeTriton(log), []
        self.measurer = self  # its sequences answer as the Lab's measurer

    def sequences(self, model: str, concurrency: int, length: int, **load):
        self.asked.append((model, concurrency, length, load))
        stats = {"inference_count": 40, "execution_count": 8, "avg_batch_size": 5.0, "compute_ms_per_inference": 9.5}
        return synthetic_run(load["name"], concurrency, 40, 50, triton_stats=stats)


class FakeClient:
    """tritonclient's gRPC client as far as a frame goes: the request it was sent, an answer or a refusal."""

    def __init__(self, refused: str | None = None) -> None:
        self.refused, self.sent = refused, []

    def infer(self, model: str, inputs: list, **options):
        self.sent.append((model, inputs, options))
        if self.refused:
            raise InferenceServerException(self.refused)
        outputs = {"SEQUENCE_LABEL": b"Soup", "SEQUENCE_PROBABILITY": 0.8125, "FRAME_LABEL": b"Bread", "FRAMES_SEEN": 2}
        return SimpleNamespace(as_numpy=lambda name: np.array([[outputs[name]]]))


PHOTO = paths.SAMPLE_IMAGE.read_bytes()


def test_a_frame_carries_its_sequence_and_flags_and_its_answer_is_described():
    client = FakeClient()
    model = sequences.StatefulModel(FakeLab(), "food_sequence", client=client)
    answer = model.frame(7, PHOTO, start=True, cancel=True)
    ((name, inputs, options),) = client.sent
    assert name == "food_sequence" and [tensor.name() for tensor in inputs] == ["FRAME"]
    assert options == {"sequence_id": 7, "sequence_start": True, "sequence_end": False, "parameters": {"cancel": True}}
    assert sequences.describe(answer) == ("frame says Bread; the sequence so far says Soup (0.812) after 2 frame(s)")


def test_a_refused_frame_is_returned_and_described_by_its_message(capsys):
    model = sequences.StatefulModel(FakeLab(), "food_sequence", client=FakeClient(refused="expired: sequence 7"))
    refused = model.frame(7, PHOTO)
    assert isinstance(refused, InferenceServerException)
    assert sequences.refusal(refused) == "expired: sequence 7"
    model.show("frame 3", refused)
    assert capsys.readouterr().out == "frame 3: ERROR expired: sequence 7\n"


def test_a_run_lasts_the_profiles_duration_and_prints_tritons_account(capsys):
    lab = FakeLab()
    run = sequences.StatefulModel(lab, "food_sequence", client=FakeClient()).run("oldest, 8 sequences", 8, 10)
    assert run.name == "oldest, 8 sequences"
    asked = {"name": "oldest, 8 sequences", "duration_s": 12.0, "warmup_sequences": 1, "triton_stats": True}
    assert lab.asked == [("food_sequence", 8, 10, asked)]
    assert "40 frames in 8 executions: average batch 5.00, 9.5 ms of compute per frame" in capsys.readouterr().out


def test_evictions_are_counted_from_the_models_log_and_unknown_without_one(tmp_path):
    log = tmp_path / "triton.log"
    log.write_text(
        "food_sequence: evicted 3 sequence(s)\nfood_sequence: expired 1 sequence(s)\n"
        "other_model: evicted 5 sequence(s)\nfood_sequence: evicted 1 sequence(s)\n"
    )
    assert sequences.StatefulModel(FakeLab(log), "food_sequence", client=FakeClient()).evictions_logged() == 4
    assert math.isnan(sequences.StatefulModel(FakeLab(), "food_sequence", client=FakeClient()).evictions_logged())


def test_a_config_tried_in_a_with_block_is_restored_even_when_the_block_fails():
    lab = FakeLab()
    model = sequences.StatefulModel(lab, "food_sequence", client=FakeClient())
    with pytest.raises(RuntimeError), model.configured("state_capacity 4"):
        raise RuntimeError("a cell failed")
    assert lab.triton.calls == [("apply", "food_sequence", "state_capacity 4"), ("restore", "food_sequence")]


def test_the_photos_are_the_labs_samples():
    photos = sequences.StatefulModel.photos(3)
    assert len(photos) == 3 and all(photo.parent == paths.SAMPLE_IMAGE.parent for photo in photos)
