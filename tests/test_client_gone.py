"""A client that leaves: the FastAPI service abandons its request at the next stage (waiting for a slot,
before decoding, before inference), or (with ABANDON_ON_DISCONNECT=off) computes an answer nobody reads.
Real processes over real HTTP; the service's own /metrics say what it did.

To make requests wait for the predict slot (one), the slot is held by a request whose image is
downloaded inside the slot from a server in this process that answers only when the test releases
it: the slot stays busy until every client under test has arrived, however busy the machine.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import requests

from servelab import paths
from servelab.measure import service_stats
from servelab.stack.catalogue import fastapi_service
from servelab.stack.supervision import start_on_free_ports
from tests.helpers import PhotoHost, until

HOLD_LIMIT_S = 60  # the service's IMAGE_DOWNLOAD_TIMEOUT_S: a held download never times out in a test


@pytest.fixture
def held(photo_host, built_artifacts):  # the model files: every test here starts a service beside it
    """The photo host, whose /held answers once `held.closing` is set."""
    return photo_host


@contextmanager
def one_slot_service(held: PhotoHost, log_dir, abandon: str) -> Iterator[str]:
    """A FastAPI ONNX service with one predict slot that may download from `held`; its URL."""
    env = {
        "PREDICT_CONCURRENCY": "1",
        "INFERENCE_THREADS": "1",
        "IMAGE_DOWNLOAD_PLACEMENT": "inside_slot",
        "IMAGE_URL_ALLOWED_HOSTS": held.address,
        "IMAGE_DOWNLOAD_TIMEOUT_S": str(HOLD_LIMIT_S),
        "ABANDON_ON_DISCONNECT": abandon,
    }
    stack, ports = start_on_free_ports(lambda ports: [fastapi_service("onnx", ports.fastapi_onnx, env=env)], log_dir)
    try:
        yield f"http://127.0.0.1:{ports.fastapi_onnx}"
    finally:
        held.closing.set()  # a test that failed while holding the slot would keep the service from stopping
        stack.stop()


def hold_the_slot(url: str, held: PhotoHost) -> tuple[threading.Thread, list[requests.Response]]:
    """A request whose image is downloaded inside the slot: the slot is busy from the moment the
    download begins until the test sets `held.closing`."""
    answers: list[requests.Response] = []
    holding = threading.Thread(
        target=lambda: answers.append(
            requests.post(f"{url}/predict", json={"url": held.url("held")}, timeout=2 * HOLD_LIMIT_S)
        )
    )
    holding.start()
    until(lambda: "/held" in held.asked, 30, "the holder to begin downloading its image inside the slot")
    return holding, answers


def release(held: PhotoHost, holding: threading.Thread, holder: list[requests.Response]) -> None:
    """Free the slot, and check the holder was still in it (not answered early, by an error)."""
    assert not holder, f"the holder was answered before the test freed the slot: {holder[0].text}"
    held.closing.set()
    holding.join(timeout=30)


def in_flight(url: str) -> int:
    """The /predict requests the service is serving now (its own gauge)."""
    return round(service_stats.scrape(url)[("predict_in_flight", ())])


def answered(url: str, before: service_stats.Scrape) -> int:
    """The /predict requests the service has answered (any status) since `before`."""
    return service_stats.diff(url, before, service_stats.scrape(url)).requests


def send(url: str, body: bytes) -> socket.socket:
    """POST `body` to /predict over a raw socket that never reads the answer: closing it is the
    client leaving."""
    host, port = url.removeprefix("http://").split(":")
    connection = socket.create_connection((host, int(port)), timeout=5)
    head = f"POST /predict HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    connection.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return connection


def leave_once_in_flight(url: str, clients: list[socket.socket], in_flight_then: int) -> None:
    """Close every client's connection together, once the service serves `in_flight_then` requests:
    a client that left alone, as soon as it saw its own request arrive, would take that request out
    of flight before the others could see the count they wait for."""
    try:
        until(lambda: in_flight(url) >= in_flight_then, 30, f"{in_flight_then} requests in flight")
    finally:
        for client in clients:
            client.close()


def sample_body() -> dict[str, str]:
    return {"image": base64.b64encode(paths.SAMPLE_IMAGE.read_bytes()).decode()}


@pytest.mark.integration
@pytest.mark.parametrize("abandon", ["on", "off"])
def test_a_client_that_leaves_while_waiting_for_the_slot_costs_no_inference_unless_turned_off(abandon, held, tmp_path):
    with one_slot_service(held, tmp_path, abandon) as url:
        assert requests.get(f"{url}/health", timeout=5).json()["abandon_on_disconnect"] is (abandon == "on")
        with service_stats.counted_over(url) as stats:
            holding, holder = hold_the_slot(url, held)
            leave_once_in_flight(url, [send(url, json.dumps(sample_body()).encode())], in_flight_then=2)
            release(held, holding, holder)
            until(lambda: answered(url, stats.before) == 2, 30, "both requests answered (or abandoned)")
        assert holder and holder[0].status_code == 200, holder
        assert requests.post(f"{url}/predict", json=sample_body(), timeout=30).status_code == 200
    delta = stats.delta
    if abandon == "on":
        assert delta.abandoned_by_stage == {"slot_wait": 1}
        assert delta.inferences == 1  # the holder's only
        assert delta.inferences_for_gone_clients == 0
        assert delta.requests_by_status == {"200": 1, "499": 1}
    else:
        assert delta.abandoned_by_stage == {}
        assert delta.inferences == 2  # computed for nobody
        assert delta.inferences_for_gone_clients == 1
        assert delta.requests_by_status.get("200") == 2


@pytest.mark.integration
def test_requests_abandoned_while_waiting_leave_the_queue_and_the_next_one_is_served(held, tmp_path):
    # Jobs left in the slot's queue by clients who had gone would each take the slot before the next request.
    with one_slot_service(held, tmp_path, "on") as url:
        body = json.dumps(sample_body()).encode()
        with service_stats.counted_over(url) as stats:
            holding, holder = hold_the_slot(url, held)
            leavers = [send(url, body) for _ in range(3)]  # all three waiting in the slot's queue
            leave_once_in_flight(url, leavers, in_flight_then=4)
            until(lambda: answered(url, stats.before) == 3, 30, "the three leavers abandoned")
            release(held, holding, holder)
            answer = requests.post(f"{url}/predict", json=sample_body(), timeout=10)
    assert holder and holder[0].status_code == 200 and answer.status_code == 200
    assert stats.delta.abandoned_by_stage == {"slot_wait": 3}
    assert stats.delta.inferences == 2  # the holder's and the next one's
