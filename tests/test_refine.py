"""The streamed refinement (food11.py) on the three engines: the same answers step by step, bad input
refused with a message, and a client that leaves midway stops the stream at the next step (unless
cancellation is turned off), by each server's own account (/metrics; the Triton model's log).
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcclient_aio
import tritonclient.http as httpclient
from PIL import Image
from tritonclient.utils import InferenceServerException

from food11 import MAX_STEPS, RunningMean, Views, checked_steps, view_geometry
from servelab import loadgen, paths
from servelab.lab.triton_configs import MODEL_LOAD_TIMEOUT_S
from servelab.measure import service_stats
from servelab.stack.catalogue import fastapi_service
from servelab.stack.supervision import LocalStack, start_on_free_ports
from servelab.triton import stats as triton_stats
from tests.helpers import until

MODEL = "food_refine"
LONG = MAX_STEPS  # a stream long enough that a client leaving after a few steps leaves most of it
READ = 2  # steps a leaving client reads first
IMAGE = base64.b64encode(paths.SAMPLE_IMAGE.read_bytes()).decode()


# ---- the workload itself -----------------------------------------------------------------------


def test_views_are_crops_chosen_by_their_step_alone_and_every_other_one_is_mirrored():
    photo = Image.open(paths.SAMPLE_IMAGE)
    first, again = Views([photo]).batch(5), Views([photo]).batch(5)
    assert first.shape == (1, 3, 224, 224) and first.dtype == np.float32 and np.array_equal(first, again)
    assert view_geometry(1) == (16, 16, False)  # the centre of the 256 x 256 photo
    assert [view_geometry(step)[2] for step in (2, 3, 4, 5)] == [True, False, True, False]
    assert not np.array_equal(Views([photo]).batch(2), Views([photo]).batch(3))


def test_the_answer_is_the_running_mean_of_every_step_so_far():
    mean = RunningMean()
    logits = np.zeros((1, 11))
    logits[0, 3] = 10.0
    ((label, first),) = mean.add(logits)
    ((again, second),) = mean.add(np.zeros((1, 11)))  # a step with no opinion halves the certainty
    assert label == again == "Egg" and first > 0.99 and second == pytest.approx((first + 1 / 11) / 2)


@pytest.mark.parametrize("steps", [0, MAX_STEPS + 1, "3", 2.0, True, None])
def test_a_step_count_that_is_not_from_one_to_the_bound_is_refused_saying_what_to_send(steps):
    with pytest.raises(ValueError, match=f"steps must be a whole number from 1 to {MAX_STEPS}"):
        checked_steps(steps)


# ---- FastAPI ------------------------------------------------------------------------------------


def refine_lines(url: str, steps: int, image: str = IMAGE) -> list[dict]:
    response = requests.post(f"{url}/refine", json={"image": image, "steps": steps}, timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/x-ndjson"
    return [json.loads(line) for line in response.text.splitlines()]


def read_then_leave(url: str, steps: int, read: int) -> int:
    """POST /refine over a raw socket, read until `read` steps have arrived, and close the
    connection without reading more: a client that leaves. Returns the steps it had received."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"image": IMAGE, "steps": steps}).encode()
    received, step = b"", b'{"step": '
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        head = f"POST /refine HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        connection.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        while received.count(step) < read:
            chunk = connection.recv(65536)
            assert chunk, f"the server closed the stream after {received.count(step)} steps"
            received += chunk
    assert received.startswith(b"HTTP/1.1 200")
    return received.count(step)


def stream_ended(url: str, before: service_stats.Scrape) -> service_stats.ServiceDelta | None:
    """The service's account since `before`, once one stream has ended and none runs."""
    delta = service_stats.diff(url, before, now := service_stats.scrape(url))
    ended = sum(delta.refine_streams_by_outcome.values()) == 1 and now[("refine_running", ())] == 0
    return delta if ended else None


@pytest.mark.integration
def test_refine_streams_one_line_per_step_with_the_running_answer(fastapi_urls):
    lines = refine_lines(fastapi_urls["onnx"], 5)
    assert [line["step"] for line in lines] == [1, 2, 3, 4, 5] and {line["steps"] for line in lines} == {5}
    assert all(set(line) == {"step", "steps", "prediction", "probability"} for line in lines)
    assert all(1 / 11 - 1e-9 <= line["probability"] <= 1 for line in lines)


@pytest.mark.integration
@pytest.mark.parametrize(
    "body, status, says",
    [
        ({"image": IMAGE, "steps": 0}, 422, "steps must be a whole number from 1 to"),
        ({"image": IMAGE, "steps": MAX_STEPS + 1}, 422, "steps must be a whole number from 1 to"),
        ({"image": IMAGE, "steps": "many"}, 422, "steps must be a whole number from 1 to"),
        ({"steps": 3}, 422, "image"),
        ({"image": base64.b64encode(b"hello, I am text").decode(), "steps": 3}, 400, "JPEG or PNG"),
    ],
    ids=["zero-steps", "too-many-steps", "steps-not-a-number", "no-image", "not-an-image"],
)
def test_bad_refine_requests_get_a_clear_error_and_the_service_keeps_streaming(fastapi_urls, body, status, says):
    url = fastapi_urls["onnx"]
    response = requests.post(f"{url}/refine", json=body, timeout=30)
    assert response.status_code == status
    assert says in json.dumps(response.json()["detail"])
    assert len(refine_lines(url, 2)) == 2


def one_slot_service(abandon: str, log_dir) -> tuple[LocalStack, str]:
    env = {"PREDICT_CONCURRENCY": "1", "ABANDON_ON_DISCONNECT": abandon}
    stack, ports = start_on_free_ports(lambda ports: [fastapi_service("onnx", ports.fastapi_onnx, env=env)], log_dir)
    return stack, f"http://127.0.0.1:{ports.fastapi_onnx}"


@pytest.mark.integration
@pytest.mark.parametrize("abandon", ["on", "off"])
def test_a_client_that_leaves_midway_stops_the_stream_at_the_next_step_unless_turned_off(abandon, tmp_path):
    stack, url = one_slot_service(abandon, tmp_path)
    try:
        assert requests.get(f"{url}/health", timeout=5).json()["abandon_on_disconnect"] is (abandon == "on")
        before = service_stats.scrape(url)
        received = read_then_leave(url, LONG, READ)
        delta = until(lambda: stream_ended(url, before), 60, "the stream to end on the server")
        with service_stats.counted_over(url) as next_stream:
            assert len(refine_lines(url, 3)) == 3  # and it serves the next stream
    finally:
        stack.stop()
    # A stream takes one slot for its steps, timed as /predict requests are: its photo decoded once,
    # its steps each an inference, all in the one slot it waited for.
    assert next_stream.delta.stage_counts == {"download": 0, "slot_wait": 1, "preprocess": 1, "inference": 3}
    assert next_stream.delta.refine_steps == 3 and next_stream.delta.requests == 0  # no /predict request
    if abandon == "on":
        assert delta.refine_streams_by_outcome == {"stopped": 1}
        assert delta.refine_steps < LONG and delta.refine_steps_for_gone_clients <= 1  # the step running, at most
    else:
        assert delta.refine_streams_by_outcome == {"completed": 1} and delta.refine_steps == LONG
        assert delta.refine_steps_for_gone_clients >= LONG // 2 > received  # computed for nobody


@pytest.mark.integration
def test_the_load_generator_counts_the_steps_each_stream_received_and_the_clients_who_left(fastapi_urls):
    result = loadgen.stream_loop(
        loadgen.Endpoint("fastapi", fastapi_urls["onnx"]),
        loadgen.Load(4, duration_s=2.0, impatient=2),
        6,
        leave_after_steps=READ,
        progress=False,
    )
    assert result.cancelled > 0 and len(result.latencies_ms) > 0 and not result.errors
    assert sorted(set(result.steps["received"])) == [READ, 6]
    assert result.steps["received"].count(READ) == result.cancelled
    assert result.patient_latency.p50_ms > 0 and result.steps["asked"] == 6


# ---- Triton -------------------------------------------------------------------------------------


def triton_log(model_servers):
    (triton,) = [managed for managed in model_servers.processes if managed.spec.name == "triton"]
    return triton.log_path


def image_input(image: bytes = paths.SAMPLE_IMAGE.read_bytes()):
    tensor = grpcclient.InferInput("INPUT_IMAGE", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[base64.b64encode(image)]], dtype=object))
    return [tensor]


async def triton_stream(address: str, steps, leave_after: int | None = None, image: bytes | None = None):
    """(steps received as (step, label, probability), the error if any) of one gRPC stream; with
    `leave_after`, the stream is cancelled once that many steps have arrived."""
    client = grpcclient_aio.InferenceServerClient(address)

    async def one_request():
        inputs = image_input(image) if image is not None else image_input()
        yield {"model_name": MODEL, "inputs": inputs, "parameters": {"steps": steps}}

    call, received, error = client.stream_infer(one_request()), [], None
    async for result, error in call:
        if error is not None:
            break
        label, probability = result.as_numpy("FOOD_LABEL")[0, 0].decode(), result.as_numpy("PROBABILITY")[0, 0]
        received.append((int(result.as_numpy("STEP")[0, 0]), label, float(probability)))
        if len(received) == leave_after:
            call.cancel()
            break
    await client.close()
    return received, error


def logged_since(log, start: int):
    """food_refine's account since `start`, once every stream it started has ended."""
    counts = triton_stats.refine_steps(triton_stats.log_since(log, start), MODEL)
    return counts if counts.running == 0 and counts.computed else None


@pytest.fixture
def refine_off(triton_http_url):
    """food_refine with abandon_on_cancel off, for the length of a test."""
    client = httpclient.InferenceServerClient(triton_http_url, network_timeout=MODEL_LOAD_TIMEOUT_S)
    served = client.get_model_config(MODEL)
    parameters = {**served["parameters"], "abandon_on_cancel": {"string_value": "off"}}
    client.load_model(MODEL, config=json.dumps({**served, "parameters": parameters}))
    yield
    client.load_model(MODEL, config=json.dumps(served))


@pytest.mark.integration
def test_triton_s_decoupled_model_streams_the_same_answers_as_fastapi(model_servers, triton_grpc_url, fastapi_urls):
    received, error = asyncio.run(triton_stream(triton_grpc_url, 4))
    assert error is None and [step for step, _, _ in received] == [1, 2, 3, 4]
    lines = refine_lines(fastapi_urls["onnx"], 4)
    assert [label for _, label, _ in received] == [line["prediction"] for line in lines]
    assert [p for _, _, p in received] == pytest.approx([line["probability"] for line in lines], abs=1e-5)


@pytest.mark.integration
@pytest.mark.parametrize("abandon", ["on", "off"])
def test_triton_stops_the_stream_at_the_next_step_when_the_client_cancels_unless_turned_off(
    model_servers, triton_grpc_url, abandon, request
):
    if abandon == "off":
        request.getfixturevalue("refine_off")
    log = triton_log(model_servers)
    start = log.stat().st_size
    received, error = asyncio.run(triton_stream(triton_grpc_url, LONG, leave_after=READ))
    counts = until(lambda: logged_since(log, start), 60, "food_refine to log the stream's end")
    assert error is None and len(received) == READ
    if abandon == "on":
        assert counts.computed < LONG and counts.for_gone_clients <= 1  # the step running when the cancel came
    else:
        assert counts.computed == LONG and counts.for_gone_clients >= LONG // 2  # every step, for nobody


@pytest.mark.integration
@pytest.mark.parametrize(
    "steps, image, says",
    [
        (0, None, "steps must be a whole number"),
        ("many", None, "steps must be a whole number"),
        (3, b"hello, I am text", "JPEG or PNG"),
    ],
    ids=["zero-steps", "steps-not-a-number", "not-an-image"],
)
def test_triton_refuses_bad_input_in_the_stream_with_a_message(model_servers, triton_grpc_url, steps, image, says):
    received, error = asyncio.run(triton_stream(triton_grpc_url, steps, image=image))
    assert received == [] and error is not None and says in error.message()
    assert asyncio.run(triton_stream(triton_grpc_url, 1))[0]  # and it serves the next stream


@pytest.mark.integration
def test_triton_s_http_infer_refuses_the_decoupled_model_saying_so(model_servers, triton_http_url):
    tensor = httpclient.InferInput("INPUT_IMAGE", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[base64.b64encode(paths.SAMPLE_IMAGE.read_bytes())]], dtype=object))
    with pytest.raises(InferenceServerException, match="decoupled"):
        httpclient.InferenceServerClient(triton_http_url).infer(MODEL, [tensor])


# ---- Ray Serve ----------------------------------------------------------------------------------


@pytest.mark.integration
def test_ray_serve_stops_the_stream_when_the_client_leaves(ray_serve, fastapi_urls):
    url = ray_serve.serve.url
    assert ray_serve.serve.replicas() == {"RUNNING": 1}, "one replica: its /metrics are the deployment's"
    lines = refine_lines(url, 4)
    assert [line["prediction"] for line in lines] == [
        line["prediction"] for line in refine_lines(fastapi_urls["onnx"], 4)
    ]
    before = service_stats.scrape(url)
    read_then_leave(url, LONG, READ)
    delta = until(lambda: stream_ended(url, before), 60, "the stream to end in the replica")
    assert delta.refine_streams_by_outcome == {"stopped": 1}
    assert delta.refine_steps < LONG and delta.refine_steps_for_gone_clients <= 2
