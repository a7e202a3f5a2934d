"""A client that leaves: the FastAPI service abandons its request at the next stage, or (with
ABANDON_ON_DISCONNECT=off) computes an answer nobody reads. Real processes over real HTTP; the
service's own /metrics say what it did.

To make a request wait for the predict slot, the slot (one) is held by a request whose image is
downloaded inside the slot from the image host, which answers after an emulated latency.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from servelab import paths
from servelab.measure import service_stats
from servelab.service.client_gone import ClientGone, DisconnectWatch
from servelab.stack.local import LocalStack, fastapi_service, image_host_service, start_on_free_ports
from tests.helpers import until

HOLD_MS = 1500  # how long the image host takes: the slot is held that long
# A hold long enough for several clients to arrive, each polling /metrics, on a busy 2-core
# machine: were the slot free before they all arrived, the state under test would never form.
HOLD_FOR_MANY_MS = 4000  # under the services' HTTP client's 5 s read timeout


@pytest.fixture(scope="module")
def slow_image_host(built_artifacts, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("host-logs")
    stack, ports = start_on_free_ports(
        lambda ports: [image_host_service(ports.image_host, latency_ms=HOLD_MS)], log_dir
    )
    with stack:
        yield f"http://127.0.0.1:{ports.image_host}"


def start_one_slot_service(image_host: str, log_dir, abandon: str, **settings: str) -> tuple[LocalStack, str]:
    env = {
        "PREDICT_CONCURRENCY": "1",
        "INFERENCE_THREADS": "1",
        "IMAGE_DOWNLOAD_PLACEMENT": "inside_slot",
        "IMAGE_URL_ALLOWED_HOSTS": image_host.removeprefix("http://"),
        "ABANDON_ON_DISCONNECT": abandon,
        **settings,
    }
    stack, ports = start_on_free_ports(lambda ports: [fastapi_service("onnx", ports.fastapi_onnx, env=env)], log_dir)
    return stack, f"http://127.0.0.1:{ports.fastapi_onnx}"


def hold_the_slot(
    url: str, image_host: str, hold_ms: float = HOLD_MS
) -> tuple[threading.Thread, list[requests.Response]]:
    """A request whose image is downloaded inside the slot: the slot is busy for `hold_ms` from the
    moment the image host sees the download begin."""
    answers: list[requests.Response] = []
    photo = f"{image_host}/images/{paths.SAMPLE_IMAGE.name}?latency_ms={hold_ms:g}"
    holding = threading.Thread(target=lambda: answers.append(requests.post(f"{url}/predict", json={"url": photo})))
    holding.start()
    until(lambda: downloads_under_way(image_host) == 1, 30, "the holder downloading its image inside the slot")
    return holding, answers


def downloads_under_way(image_host: str) -> int:
    return requests.get(f"{image_host}/health", timeout=5).json()["downloads_under_way"]


def in_flight(url: str) -> int:
    """The /predict requests the service is serving now (its own gauge)."""
    return round(service_stats.scrape(url)[("predict_in_flight", ())])


def answered(url: str, before: service_stats.Scrape) -> int:
    """The /predict requests the service has answered (any status) since `before`."""
    return service_stats.diff(url, before, service_stats.scrape(url)).requests


def send_and_leave(url: str, body: bytes, arrived: int) -> None:
    """POST `body` to /predict over a raw socket, wait until the service serves `arrived`
    requests (this one among them), and close without reading."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as connection:
        head = f"POST /predict HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        connection.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        until(lambda: in_flight(url) >= arrived, 30, f"{arrived} requests in flight")


@pytest.mark.parametrize("abandon", ["on", "off"])
def test_a_client_that_leaves_while_waiting_for_the_slot_costs_no_inference_unless_turned_off(
    abandon, slow_image_host, tmp_path
):
    stack, url = start_one_slot_service(slow_image_host, tmp_path, abandon)
    try:
        assert requests.get(f"{url}/health", timeout=5).json()["abandon_on_disconnect"] is (abandon == "on")
        image = base64.b64encode(paths.SAMPLE_IMAGE.read_bytes()).decode()
        with service_stats.counted_over(url) as stats:
            holding, holder = hold_the_slot(url, slow_image_host)
            send_and_leave(url, json.dumps({"image": image}).encode(), arrived=2)
            assert downloads_under_way(slow_image_host) == 1, "the slot was free before the client left"
            holding.join(timeout=30)
            until(lambda: answered(url, stats.before) == 2, 30, "both requests answered (or abandoned)")
        assert holder and holder[0].status_code == 200, holder
        assert requests.post(f"{url}/predict", json={"image": image}, timeout=30).status_code == 200
    finally:
        stack.stop()
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


def test_decoding_runs_at_most_decode_ahead_requests_ahead_of_a_busy_slot(slow_image_host, tmp_path):
    stack, url = start_one_slot_service(slow_image_host, tmp_path, "on", DECODE_AHEAD="2", PREPROCESS_WORKERS="2")
    try:
        assert requests.get(f"{url}/health", timeout=5).json()["decode_ahead"] == 2
        body = {"image": base64.b64encode(paths.SAMPLE_IMAGE.read_bytes()).decode()}
        before = service_stats.scrape(url)
        holding, holder = hold_the_slot(url, slow_image_host, HOLD_FOR_MANY_MS)
        with ThreadPoolExecutor(6) as senders:
            answers = [senders.submit(requests.post, f"{url}/predict", json=body, timeout=30) for _ in range(6)]
            until(lambda: in_flight(url) == 7, 30, "the six senders and the holder in flight")
            decoded = lambda: service_stats.diff(url, before, service_stats.scrape(url)).stage_counts["preprocess"]  # noqa: E731
            until(lambda: decoded() >= 2, 30, "two requests decoded ahead")
            time.sleep(0.3)  # time enough to decode more, were decoding not held back
            while_held = service_stats.diff(url, before, service_stats.scrape(url))
            assert downloads_under_way(slow_image_host) == 1, "the slot was free before the decoding was read"
            statuses = [answer.result().status_code for answer in answers]
        holding.join(timeout=30)
        after = service_stats.diff(url, before, service_stats.scrape(url))
    finally:
        stack.stop()
    assert holder and holder[0].status_code == 200 and statuses == [200] * 6
    assert while_held.stage_counts["preprocess"] == 2  # not 6: the others wait undecoded
    assert after.stage_counts["preprocess"] == 7  # the holder's image, decoded in its slot, and the six


def test_requests_abandoned_while_waiting_give_their_room_to_decode_back(slow_image_host, tmp_path):
    # With room for one, a room kept by an abandoned request would leave the next one waiting forever.
    stack, url = start_one_slot_service(slow_image_host, tmp_path, "on", DECODE_AHEAD="1")
    try:
        body = {"image": base64.b64encode(paths.SAMPLE_IMAGE.read_bytes()).decode()}
        with service_stats.counted_over(url) as stats:
            holding, holder = hold_the_slot(url, slow_image_host, HOLD_FOR_MANY_MS)
            with ThreadPoolExecutor(3) as leavers:  # one decoded and queued, two waiting for room
                list(leavers.map(lambda _: send_and_leave(url, json.dumps(body).encode(), arrived=4), range(3)))
            assert downloads_under_way(slow_image_host) == 1, "the slot was free before the clients left"
            holding.join(timeout=30)
            answer = requests.post(f"{url}/predict", json=body, timeout=10)
    finally:
        stack.stop()
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
