"""A client that leaves: the FastAPI service abandons its request at the next stage, or (with
ABANDON_ON_DISCONNECT=off) computes an answer nobody reads. Real processes over real HTTP; the
service's own /metrics say what it did.

To make requests wait for the predict slot (one), the slot is held by a request whose image is
downloaded inside the slot from a server in this process that answers only when the test releases
it: the slot stays busy until every client under test has arrived, however busy the machine.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from servelab import paths
from servelab.measure import service_stats
from servelab.service.client_gone import ClientGone, DisconnectWatch
from servelab.stack.catalogue import fastapi_service
from servelab.stack.supervision import start_on_free_ports
from tests.helpers import until

HOLD_LIMIT_S = 60  # the service's IMAGE_DOWNLOAD_TIMEOUT_S: a held download never times out in a test


class HeldImage(ThreadingHTTPServer):
    """GET / answers the sample photo once `released` is set; `asked` is set when a download begins."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _AnswerWhenReleased)
        self.asked, self.released = threading.Event(), threading.Event()
        self.photo = paths.SAMPLE_IMAGE.read_bytes()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


class _AnswerWhenReleased(BaseHTTPRequestHandler):
    server: HeldImage

    def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
        self.server.asked.set()
        self.server.released.wait(HOLD_LIMIT_S)
        self.send_response(200)
        self.send_header("Content-Type", "image/jpeg")
        self.send_header("Content-Length", str(len(self.server.photo)))
        self.end_headers()
        self.wfile.write(self.server.photo)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def held_image(built_artifacts):  # the model files: every test here starts a service beside it
    server = HeldImage()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server  # one_slot_service releases any held download before the service stops
    server.shutdown()
    server.server_close()


@contextmanager
def one_slot_service(held: HeldImage, log_dir, abandon: str, **settings: str) -> Iterator[str]:
    """A FastAPI ONNX service with one predict slot that may download from `held`; its URL."""
    env = {
        "PREDICT_CONCURRENCY": "1",
        "INFERENCE_THREADS": "1",
        "IMAGE_DOWNLOAD_PLACEMENT": "inside_slot",
        "IMAGE_URL_ALLOWED_HOSTS": held.host,
        "IMAGE_DOWNLOAD_TIMEOUT_S": str(HOLD_LIMIT_S),
        "ABANDON_ON_DISCONNECT": abandon,
        **settings,
    }
    stack, ports = start_on_free_ports(lambda ports: [fastapi_service("onnx", ports.fastapi_onnx, env=env)], log_dir)
    try:
        yield f"http://127.0.0.1:{ports.fastapi_onnx}"
    finally:
        held.released.set()  # a test that failed while holding the slot would keep the service from stopping
        stack.stop()


def hold_the_slot(url: str, held: HeldImage) -> tuple[threading.Thread, list[requests.Response]]:
    """A request whose image is downloaded inside the slot: the slot is busy from the moment the
    download begins until the test sets `held.released`."""
    answers: list[requests.Response] = []
    holding = threading.Thread(
        target=lambda: answers.append(
            requests.post(f"{url}/predict", json={"url": f"http://{held.host}/"}, timeout=2 * HOLD_LIMIT_S)
        )
    )
    holding.start()
    assert held.asked.wait(30), "the holder never began downloading its image inside the slot"
    return holding, answers


def release(held: HeldImage, holding: threading.Thread, holder: list[requests.Response]) -> None:
    """Free the slot, and check the holder was still in it (not answered early, by an error)."""
    assert not holder, f"the holder was answered before the test freed the slot: {holder[0].text}"
    held.released.set()
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
def test_a_client_that_leaves_while_waiting_for_the_slot_costs_no_inference_unless_turned_off(
    abandon, held_image, tmp_path
):
    with one_slot_service(held_image, tmp_path, abandon) as url:
        assert requests.get(f"{url}/health", timeout=5).json()["abandon_on_disconnect"] is (abandon == "on")
        with service_stats.counted_over(url) as stats:
            holding, holder = hold_the_slot(url, held_image)
            leave_once_in_flight(url, [send(url, json.dumps(sample_body()).encode())], in_flight_then=2)
            release(held_image, holding, holder)
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
def test_decoding_runs_at_most_decode_ahead_requests_ahead_of_a_busy_slot(held_image, tmp_path):
    with one_slot_service(held_image, tmp_path, "on", DECODE_AHEAD="2", PREPROCESS_WORKERS="2") as url:
        assert requests.get(f"{url}/health", timeout=5).json()["decode_ahead"] == 2
        before = service_stats.scrape(url)
        holding, holder = hold_the_slot(url, held_image)
        with ThreadPoolExecutor(6) as senders:
            answers = [
                senders.submit(requests.post, f"{url}/predict", json=sample_body(), timeout=60) for _ in range(6)
            ]
            until(lambda: in_flight(url) == 7, 30, "the six senders and the holder in flight")
            decoded = lambda: service_stats.diff(url, before, service_stats.scrape(url)).stage_counts["preprocess"]  # noqa: E731
            until(lambda: decoded() >= 2, 30, "two requests decoded ahead")
            time.sleep(0.3)  # time enough to decode more, were decoding not held back
            while_held = service_stats.diff(url, before, service_stats.scrape(url))
            release(held_image, holding, holder)
            statuses = [answer.result().status_code for answer in answers]
        after = service_stats.diff(url, before, service_stats.scrape(url))
    assert holder and holder[0].status_code == 200 and statuses == [200] * 6
    assert while_held.stage_counts["preprocess"] == 2  # not 6: the others wait undecoded
    assert after.stage_counts["preprocess"] == 7  # the holder's image, decoded in its slot, and the six


@pytest.mark.integration
def test_requests_abandoned_while_waiting_give_their_room_to_decode_back(held_image, tmp_path):
    # With room for one, a room kept by an abandoned request would leave the next one waiting forever.
    with one_slot_service(held_image, tmp_path, "on", DECODE_AHEAD="1") as url:
        body = json.dumps(sample_body()).encode()
        with service_stats.counted_over(url) as stats:
            holding, holder = hold_the_slot(url, held_image)
            leavers = [send(url, body) for _ in range(3)]  # one decoded and queued, two waiting for room
            leave_once_in_flight(url, leavers, in_flight_then=4)
            release(held_image, holding, holder)
            answer = requests.post(f"{url}/predict", json=sample_body(), timeout=10)
    assert holder and holder[0].status_code == 200 and answer.status_code == 200
    assert sum(stats.delta.abandoned_by_stage.values()) == 3
    assert set(stats.delta.abandoned_by_stage) <= {"before_preprocess", "slot_wait"}


def _one_busy_slot() -> tuple[ThreadPoolExecutor, threading.Event]:
    """A pool of one inference thread, held by a job until the returned event is set."""
    slots = ThreadPoolExecutor(1)
    release = threading.Event()
    slots.submit(release.wait, 10)
    return slots, release


def test_a_handler_cancelled_while_waiting_for_a_slot_takes_its_job_out_of_the_queue():
    async def scenario() -> list[str]:
        never: asyncio.Future = asyncio.get_running_loop().create_future()

        async def receive() -> dict:  # a client that stays until the end
            await never
            return {"type": "http.disconnect"}

        slots, release = _one_busy_slot()
        watch = DisconnectWatch(receive, abandon=True)
        ran = []
        cancelled = asyncio.create_task(watch.result_of(slots.submit(ran.append, "cancelled")))
        await asyncio.sleep(0.01)
        cancelled.cancel()  # Ray Serve does this when a client leaves
        await asyncio.sleep(0.01)
        next_one = watch.result_of(slots.submit(ran.append, "next"))
        release.set()
        await asyncio.wait_for(next_one, 5)
        watch.stop()
        slots.shutdown()
        return ran + [f"handler cancelled: {cancelled.cancelled()}"]

    assert asyncio.run(scenario()) == ["next", "handler cancelled: True"]


@pytest.mark.parametrize("abandon", [True, False])
def test_a_client_that_leaves_while_its_job_is_queued_is_abandoned_at_slot_wait_only_when_abandoning(abandon):
    async def scenario() -> tuple[str, list[str]]:
        leaves = asyncio.get_running_loop().create_future()

        async def receive() -> dict:
            await leaves
            return {"type": "http.disconnect"}

        slots, release = _one_busy_slot()
        watch = DisconnectWatch(receive, abandon=abandon)
        ran: list[str] = []
        waiting = asyncio.create_task(watch.result_of(slots.submit(ran.append, "queued job")))
        await asyncio.sleep(0.01)
        leaves.set_result(None)
        await asyncio.sleep(0.01)
        release.set()
        try:
            await asyncio.wait_for(waiting, 5)
            outcome = "computed"
        except ClientGone as gone:
            outcome = gone.stage
        watch.stop()
        slots.shutdown()
        return outcome, ran

    assert asyncio.run(scenario()) == (("slot_wait", []) if abandon else ("computed", ["queued job"]))


def test_a_client_gone_before_preprocessing_is_abandoned_there_and_only_when_abandoning():
    async def scenario(abandon: bool) -> str:
        async def receive() -> dict:
            return {"type": "http.disconnect"}

        watch = DisconnectWatch(receive, abandon=abandon)
        await asyncio.sleep(0)  # the watch hears the disconnect
        try:
            watch.check("before_preprocess")
            return "went on"
        except ClientGone as gone:
            return gone.stage
        finally:
            watch.stop()

    assert asyncio.run(scenario(True)) == "before_preprocess"
    assert asyncio.run(scenario(False)) == "went on"
