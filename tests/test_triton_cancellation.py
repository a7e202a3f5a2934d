"""Cancelled requests against the real local Triton: a gRPC cancel of a request that waits behind
others is never computed. Triton drops it before the model (a failed request in its statistics)
or, once the request is in a batch the model holds, the model sees `is_cancelled()` and answers
CANCELLED, which it logs. The session's Triton serves `food_classifier` with dynamic batching for
these tests, then as its file says again.
"""

from __future__ import annotations

import json
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from servelab.lab.triton_configs import MODEL_LOAD_TIMEOUT_S
from servelab.polling import settled
from servelab.triton import stats as triton_stats
from tests.helpers import until
from tests.helpers.triton_stats import pending_requests

pytestmark = pytest.mark.integration

MODEL = "food_classifier"


def image_inputs(module, images: list[str]):
    tensor = module.InferInput("INPUT_IMAGE", [len(images), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[image.encode()] for image in images], dtype=object))
    return [tensor]


def cancelled_in_log(model_servers) -> int:
    (triton,) = [managed for managed in model_servers.processes if managed.spec.name == "triton"]
    return triton_stats.cancelled_by_model(triton.log_path.read_text(), MODEL)


@pytest.fixture
def metrics_url(ports) -> str:
    return f"http://127.0.0.1:{ports.triton_metrics}/metrics"


BLOCKERS = 2  # requests of a full batch (16 images) each, ahead of the ones cancelled


def busy_with_blockers(grpc, metrics_url: str, image_b64: str, on_answer) -> None:
    """Two requests of 16 images each, sent together: once Triton's own gauge counts one waiting,
    the first is in the one instance, running, and the second waits behind it."""
    for _ in range(BLOCKERS):
        grpc.async_infer(MODEL, image_inputs(grpcclient, [image_b64] * 16), on_answer)
    until(lambda: pending_requests(metrics_url, MODEL) == BLOCKERS - 1, 30, "one blocker waiting")


def wait_until_waiting(metrics_url: str, count: int, answers: queue.Queue) -> None:
    """Until `count` more requests wait behind the blockers, which are not answered yet."""
    until(lambda: pending_requests(metrics_url, MODEL) == BLOCKERS - 1 + count, 30, f"{count} more waiting")
    assert answers.empty(), "a blocker was answered before the requests queued: it was too quick"


@pytest.fixture
def batched_model(triton_http_url):
    """`food_classifier` with one instance and dynamic batching, for the length of a test."""
    client = httpclient.InferenceServerClient(triton_http_url, network_timeout=MODEL_LOAD_TIMEOUT_S)
    served = client.get_model_config(MODEL)
    config = {**served, "dynamic_batching": {}, "instance_group": [{"count": 1, "kind": "KIND_CPU"}]}
    client.load_model(MODEL, config=json.dumps(config))
    yield client
    # Given back explicitly: a load with no config after one with a config keeps the override
    # when the files have not changed (Triton 2.51).
    client.load_model(MODEL, config=json.dumps(served))


def test_a_grpc_cancel_of_a_waiting_request_means_it_is_never_computed(
    batched_model, model_servers, metrics_url, triton_http_url, triton_grpc_url, image_b64
):
    grpc = grpcclient.InferenceServerClient(triton_grpc_url)
    before = cancelled_in_log(model_servers)
    answers: queue.Queue = queue.Queue()
    with triton_stats.counted_over(triton_http_url, MODEL) as stats:

        def on_answer(result, error) -> None:
            answers.put((result, error))

        # Full batches keep the one instance busy while the next requests wait in the queue.
        busy_with_blockers(grpc, metrics_url, image_b64, on_answer)
        contexts = [grpc.async_infer(MODEL, image_inputs(grpcclient, [image_b64]), on_answer) for _ in range(3)]
        wait_until_waiting(metrics_url, 3, answers)
        for context in contexts:
            context.cancel()
        outcomes = [answers.get(timeout=60) for _ in range(BLOCKERS + 3)]
    cancelled = [error for result, error in outcomes if result is None]
    assert len(cancelled) == 3 and all(error.status() == "StatusCode.CANCELLED" for error in cancelled), outcomes
    # None of the three was computed: Triton dropped it (a failure in its statistics), or the
    # model answered it CANCELLED (Triton's statistics count that as a success; the log says).
    assert stats.delta.fail_count + cancelled_in_log(model_servers) - before == 3
    assert stats.delta.execution_count <= BLOCKERS + 1  # the blockers' batches, and at most one for the three
    assert grpc.is_model_ready(MODEL)


def test_the_verbose_log_names_the_step_at_which_each_cancellation_was_handled(
    batched_model, model_servers, metrics_url, triton_grpc_url, image_b64
):
    """What notebook 10's probe of Triton 2.51's cancellation race reads: the real server's verbose
    log, turned on and off through its logging API, says where each cancelled request was."""
    (triton,) = [managed for managed in model_servers.processes if managed.spec.name == "triton"]
    start = triton.log_path.stat().st_size
    batched_model.update_log_settings({"log_verbose_level": 1})
    try:
        grpc = grpcclient.InferenceServerClient(triton_grpc_url)
        answers: queue.Queue = queue.Queue()

        def on_answer(result, error):
            answers.put((result, error))

        busy_with_blockers(grpc, metrics_url, image_b64, on_answer)
        waiting = grpc.async_infer(MODEL, image_inputs(grpcclient, [image_b64]), on_answer)
        wait_until_waiting(metrics_url, 1, answers)
        waiting.cancel()
        for _ in range(BLOCKERS + 1):
            answers.get(timeout=60)
        steps = settled(lambda: triton_stats.cancellation_steps(triton_stats.log_since(triton.log_path, start)))
    finally:
        batched_model.update_log_settings({"log_verbose_level": 0})
    assert steps == {"ISSUED": 1}, steps  # it waited in the queue: not yet answered, not being written
