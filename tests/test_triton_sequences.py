"""The stateful `food_sequence` model against the real local Triton: state is real, sequences do
not mix, every way a sequence loses its state is named to its next frame, and the sequence
batcher puts frames of several sequences into one execution. Its cancels:
test_triton_sequences_cancel.py.

For these tests the session's Triton serves `food_sequence` with a tiny state cache (TINY_CACHE,
tests/helpers/triton_sequences.py), with short timeouts for the two tests of timeouts only
(QUICK_TIMEOUTS: a busy machine can hold a frame for seconds), then its shipped config again.

What Triton 2.51 itself answers, checked here: a frame without START for a sequence its batcher
does not hold (never started, or after END, or after Triton's own idle limit) is refused before
the model, INVALID_ARGUMENT (HTTP 400) "must specify the START flag on the first request of the
sequence". A sequence request must have batch size 1.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from food11 import LABELS
from servelab.triton import stats as triton_stats
from tests.helpers.triton_sequences import (
    MODEL,
    TRITON_REFUSES,
    Sequences,
    load,
    sequence_ids,
    served_with_tiny_cache,
    with_parameters,
)

# The sequence timeout below the idle timeout: a sequence times out while it is not idle, and an
# idle one has expired (the model checks idleness first). Triton's backstop is longer than both.
QUICK_TIMEOUTS = {"idle_timeout_s": "4", "sequence_timeout_s": "2"}
QUICK_TRITON_IDLE_US = 30_000_000  # far beyond both, so that a slow frame still meets the model's


def test_sequence_events_are_counted_from_the_model_log():
    log = "\n".join(
        [
            'I1123 model.py:284] "food_sequence: evicted 3 sequence(s) (state capacity 32)"',
            'I1123 model.py:284] "food_sequence: expired 1 sequence(s) (idle over 30 s)"',
            'I1123 model.py:284] "food_sequence: evicted 2 sequence(s) (state capacity 32)"',
            'I1123 model.py:286] "food_sequence: refused 4 request(s) of sequences without state"',
            'I1123 model.py:284] "other_model: evicted 7 sequence(s) (state capacity 32)"',
            'I1123 model.py:99] "food_classifier: 2 cancelled request(s) answered CANCELLED, not computed"',
        ]
    )
    assert triton_stats.sequence_events(log, MODEL) == {
        "evicted": 5,
        "expired": 1,
        "timed out": 0,
        "cancelled": 0,
        "refused": 4,
    }


@pytest.fixture(scope="module")
def sequences(model_servers, ports, triton_http_url, triton_grpc_url) -> Iterator[Sequences]:
    with served_with_tiny_cache(model_servers, ports, triton_http_url, triton_grpc_url) as served:
        yield served


def running_means(probabilities: list[np.ndarray]) -> list[np.ndarray]:
    return [np.mean(probabilities[: count + 1], axis=0) for count in range(len(probabilities))]


@pytest.mark.integration
def test_a_sequence_answers_with_the_mean_of_its_frames_and_interleaved_sequences_do_not_mix(sequences, test_images):
    alone = [
        sequences.send(next(sequence_ids), image, sequence_start=True, sequence_end=True)["probabilities"]
        for image in test_images[:3]
    ]
    first, second = next(sequence_ids), next(sequence_ids)
    plan = [(first, 0), (second, 2), (first, 1), (second, 1), (first, 2), (second, 2)]
    answers: dict[int, list[dict]] = {first: [], second: []}
    for step, (sequence_id, image) in enumerate(plan):
        options = {"sequence_start": step < 2, "sequence_end": step >= len(plan) - 2}
        answers[sequence_id].append(sequences.send(sequence_id, test_images[image], **options))
    for sequence_id, images in ((first, [0, 1, 2]), (second, [2, 1, 2])):
        got = answers[sequence_id]
        assert [answer["frames_seen"] for answer in got] == [1, 2, 3]
        for answer, expected in zip(got, running_means([alone[image] for image in images]), strict=True):
            np.testing.assert_allclose(answer["probabilities"], expected, atol=1e-5)
            assert answer["label"] == LABELS[int(expected.argmax())]
            assert answer["probability"] == pytest.approx(float(expected.max()), abs=1e-5)
    # The same frame (image 1), second in both sequences, is answered from each one's history.
    assert not np.allclose(answers[first][1]["probabilities"], answers[second][1]["probabilities"], atol=1e-4)
    assert answers[first][1]["frame_label"] == answers[second][1]["frame_label"]


@pytest.mark.integration
def test_a_frame_without_start_is_refused_by_triton_before_the_model(sequences, image_b64, test_images):
    before = sequences.events()
    never_started = sequences.refusal(next(sequence_ids), test_images[0])
    ended = next(sequence_ids)
    sequences.send(ended, test_images[0], sequence_start=True)
    sequences.send(ended, test_images[1], sequence_end=True)
    after_end = sequences.refusal(ended, test_images[2])
    for refused in (never_started, after_end):
        assert refused.status() == "StatusCode.INVALID_ARGUMENT" and TRITON_REFUSES in refused.message()
    with pytest.raises(InferenceServerException, match=TRITON_REFUSES) as over_http:
        httpclient.InferenceServerClient(sequences.http_url).infer(
            MODEL, Sequences.frame(test_images[0], httpclient), sequence_id=ended
        )
    assert over_http.value.status() == "400"
    assert sequences.events() == before, "the model saw none of them"


@pytest.mark.integration
def test_an_evicted_sequence_is_named_and_the_others_go_on(sequences, test_images):
    before = sequences.events()
    started = [next(sequence_ids) for _ in range(4)]  # one more than the cache holds
    for sequence_id in started:
        sequences.send(sequence_id, test_images[0], sequence_start=True)
    refused = sequences.refusal(started[0], test_images[1])
    assert refused.status() == "StatusCode.NOT_FOUND"
    assert refused.message().startswith(f"evicted: sequence {started[0]} was evicted from the state cache (capacity 3")
    assert "start it again with sequence_start" in refused.message()
    for sequence_id in started[1:]:
        assert sequences.send(sequence_id, test_images[1], sequence_end=True)["frames_seen"] == 2
    after = sequences.events()
    assert (after["evicted"] - before["evicted"], after["refused"] - before["refused"]) == (1, 1)
    sequences.still_serving(test_images[2])


@pytest.fixture(scope="class")
def quick_timeouts(sequences, triton_http_url):
    served = httpclient.InferenceServerClient(triton_http_url).get_model_config(MODEL)
    quick = with_parameters(served, QUICK_TIMEOUTS)
    quick["sequence_batching"]["max_sequence_idle_microseconds"] = QUICK_TRITON_IDLE_US
    load(triton_http_url, quick)
    yield {key: float(value) for key, value in QUICK_TIMEOUTS.items()}
    load(triton_http_url, served)


@pytest.mark.integration
class TestTimeouts:
    def test_an_idle_sequence_expires_in_the_model_before_triton_forgets_it(
        self, sequences, quick_timeouts, test_images
    ):
        before = sequences.events()
        sequence_id = next(sequence_ids)
        sequences.send(sequence_id, test_images[0], sequence_start=True)
        time.sleep(quick_timeouts["idle_timeout_s"] + 0.5)  # idle that long (well inside Triton's own 30 s)
        refused = sequences.refusal(sequence_id, test_images[1], sequence_end=True)
        assert refused.status() == "StatusCode.NOT_FOUND"
        assert refused.message().startswith(f"expired: sequence {sequence_id} sent no frame for longer than the idle")
        assert sequences.events()["expired"] - before["expired"] == 1
        sequences.still_serving(test_images[2])

    def test_a_sequence_older_than_the_sequence_timeout_is_timed_out(self, sequences, quick_timeouts, test_images):
        """Frames keep coming, a quarter of a second apart (never idle long), until one arrives after
        the sequence timeout: that one is refused, and none before it."""
        before = sequences.events()
        sequence_id = next(sequence_ids)
        started = time.monotonic()
        sequences.send(sequence_id, test_images[0], sequence_start=True)
        refused = None
        while refused is None:
            assert time.monotonic() - started < 60, "the sequence never timed out"
            time.sleep(0.25)
            try:
                sequences.send(sequence_id, test_images[1])
            except InferenceServerException as error:
                refused = error
        assert time.monotonic() - started > quick_timeouts["sequence_timeout_s"], "refused before its timeout"
        # Its last frame, with END, frees Triton's slot; the model names the same loss again.
        assert sequences.refusal(sequence_id, test_images[2], sequence_end=True).message() == refused.message()
        assert refused.status() == "StatusCode.NOT_FOUND"
        assert refused.message().startswith(f"timed out: sequence {sequence_id} ran longer than the sequence timeout")
        assert sequences.events()["timed out"] - before["timed out"] == 1
        sequences.still_serving(test_images[2])


def run_concurrently(sequences: Sequences, test_images, count: int, frames: int) -> list[list[dict]]:
    """`count` sequences of `frames` frames, each from its own thread and client, all at once."""
    ids = [next(sequence_ids) for _ in range(count)]
    answers: list[list[dict]] = [[] for _ in ids]
    barrier = threading.Barrier(count)

    def run(position: int) -> None:
        client = grpcclient.InferenceServerClient(sequences.grpc_url)
        barrier.wait()
        for frame in range(frames):
            options = {"sequence_start": frame == 0, "sequence_end": frame == frames - 1}
            image = test_images[frame % len(test_images)]
            answers[position].append(sequences.send(ids[position], image, client=client, **options))

    threads = [threading.Thread(target=run, args=(position,)) for position in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return answers


@pytest.mark.integration
def test_the_sequence_batcher_runs_frames_of_several_sequences_in_one_execution(sequences, test_images):
    with triton_stats.counted_over(sequences.http_url, MODEL) as stats:
        answers = run_concurrently(sequences, test_images, count=3, frames=4)
    assert [[answer["frames_seen"] for answer in answered] for answered in answers] == [[1, 2, 3, 4]] * 3
    assert stats.delta.inference_count == 12
    assert stats.delta.execution_count < stats.delta.inference_count, stats.delta
    assert max(stats.delta.executions_by_batch_size) > 1


@pytest.mark.integration
def test_the_direct_strategy_answers_empty_slots_without_computing_them(sequences, triton_http_url, test_images):
    served = httpclient.InferenceServerClient(triton_http_url).get_model_config(MODEL)
    direct = json.loads(json.dumps(served))
    del direct["sequence_batching"]["oldest"]
    direct["sequence_batching"]["direct"] = {}
    load(triton_http_url, direct)
    try:
        before = sequences.events()
        first, second = next(sequence_ids), next(sequence_ids)
        with triton_stats.counted_over(triton_http_url, MODEL) as stats:
            sequences.send(first, test_images[0], sequence_start=True)  # slot 0
            sequences.send(second, test_images[0], sequence_start=True)  # slot 1: slot 0 comes along empty
            assert sequences.send(second, test_images[1])["frames_seen"] == 2
            assert sequences.send(first, test_images[1], sequence_end=True)["frames_seen"] == 2
            assert sequences.send(second, test_images[2], sequence_end=True)["frames_seen"] == 3
        # The empty slots were in the batches Triton ran, but the model computed no request for
        # them: a READY 0 request taken for a frame would have been refused (no state for ID 0).
        assert stats.delta.executions_by_batch_size.get(2, 0) >= 2, stats.delta
        assert stats.delta.inference_count == 5, stats.delta
        assert sequences.events() == before
    finally:
        load(triton_http_url, served)
