"""Images by URL, end to end: the real image host, a FastAPI service that downloads from it, and
every way a URL can be refused; the service's /metrics as requests are served; the 413 that
Python's urllib must be able to read.

The services run as real processes on 127.0.0.1. A small redirecting server, in this process,
stands in for an allowed host that sends the service elsewhere.
"""

from __future__ import annotations

import base64
import json
import shutil
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from servelab import paths
from servelab.measure import service_stats
from servelab.service.food11 import LABELS
from servelab.service.image_fetch import AllowList, DownloadError
from servelab.stack.catalogue import fastapi_service, image_host_service
from servelab.stack.supervision import LocalStack, Ports, ServiceSpec
from tests.helpers import TEST_MAX_REQUEST_BYTES

LIMIT_BYTES = 1_000_000  # MAX_REQUEST_BYTES of the services here: the soup photo fits, big.bin does not
TIMEOUT_S = 1.5  # IMAGE_DOWNLOAD_TIMEOUT_S


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("images")
    shutil.copy(paths.SAMPLE_IMAGE, folder / "soup.jpg")
    (folder / "big.bin").write_bytes(b"\xff" * (LIMIT_BYTES + 1))
    (folder / "notes.txt").write_text("a shopping list, not a photo")
    return folder


@pytest.fixture(scope="module")
def image_host(image_folder, tmp_path_factory, built_artifacts):
    port = Ports.found_free().image_host
    spec = image_host_service(port, latency_ms=0)
    spec.command[spec.command.index("--images") + 1] = str(image_folder)
    with LocalStack([spec], log_dir=tmp_path_factory.mktemp("image-host-logs")):
        yield f"http://127.0.0.1:{port}"


class Redirects(BaseHTTPRequestHandler):
    """GET /to?<url> answers 302 to <url>; GET /loop redirects to itself."""

    def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
        location = self.path.partition("?")[2] if self.path.startswith("/to?") else "/loop"
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def redirector():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirects)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def start_service(image_host: str, redirector: str, log_dir, **settings: str) -> tuple[LocalStack, str]:
    port = Ports.found_free().fastapi_onnx
    env = {
        "IMAGE_URL_ALLOWED_HOSTS": ",".join(url.removeprefix("http://") for url in (image_host, redirector)),
        "IMAGE_DOWNLOAD_TIMEOUT_S": str(TIMEOUT_S),
        "MAX_REQUEST_BYTES": str(LIMIT_BYTES),
        **settings,
    }
    stack = LocalStack([fastapi_service("onnx", port, env=env)], log_dir=log_dir).start()
    return stack, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def service(image_host, redirector, tmp_path_factory):
    stack, url = start_service(image_host, redirector, tmp_path_factory.mktemp("service-logs"))
    yield url
    stack.stop()


def predict_url(service: str, url: str) -> requests.Response:
    return requests.post(f"{service}/predict", json={"url": url}, timeout=30)


def test_the_allow_list_takes_hosts_with_any_port_or_one_port():
    allowed = AllowList.parse(" Images.example.org , 127.0.0.1:8400,")
    for url in ("https://images.example.org/a.jpg", "http://IMAGES.example.org:8080/a.jpg", "http://127.0.0.1:8400/x"):
        allowed.check(url)
    for url in ("http://127.0.0.1:8401/x", "http://127.0.0.1/x", "http://example.org/a.jpg"):
        with pytest.raises(DownloadError) as refused:
            allowed.check(url)
        assert refused.value.status == 403, url
    with pytest.raises(ValueError, match="not `host` or `host:port`"):
        AllowList.parse("127.0.0.1:http")


def test_the_image_host_serves_photos_after_its_emulated_latency(image_host):
    health = requests.get(f"{image_host}/health", timeout=5).json()
    assert health["emulated_latency_ms"] == 0 and health["images"]["soup.jpg"] == paths.SAMPLE_IMAGE.stat().st_size
    started = time.perf_counter()
    answer = requests.get(f"{image_host}/images/soup.jpg?latency_ms=300", timeout=10)
    assert time.perf_counter() - started >= 0.3  # the emulated latency is a wait, never skipped
    assert answer.content == paths.SAMPLE_IMAGE.read_bytes() and answer.headers["X-Emulated-Latency-Ms"] == "300"
    assert requests.get(f"{image_host}/images/nope.jpg", timeout=5).status_code == 404
    assert requests.get(f"{image_host}/images/soup.jpg?latency_ms=soon", timeout=5).status_code == 400


def test_a_photo_by_url_gets_the_same_prediction_as_the_photo_itself(service, image_host):
    by_url = predict_url(service, f"{image_host}/images/soup.jpg")
    image = base64.b64encode(paths.SAMPLE_IMAGE.read_bytes()).decode()
    sent = requests.post(f"{service}/predict", json={"image": image}, timeout=30)
    assert by_url.status_code == 200, by_url.text
    assert by_url.json()["prediction"] in LABELS and by_url.json() == sent.json()


@pytest.mark.parametrize("payload", [{}, {"image": "aGk=", "url": "http://127.0.0.1/x.jpg"}], ids=["neither", "both"])
def test_exactly_one_of_image_and_url(service, payload):
    answer = requests.post(f"{service}/predict", json=payload, timeout=10)
    assert answer.status_code == 422 and "exactly one of `image`" in answer.text


def test_urls_the_server_must_not_fetch_are_refused_with_what_to_do(service, image_host):
    host_port = image_host.removeprefix("http://").split(":")[1]
    service_port = service.rsplit(":", 1)[1]
    cases = {
        f"ftp://127.0.0.1:{host_port}/images/soup.jpg": (400, "Only http and https"),
        "file:///etc/passwd": (400, "Only http and https"),
        # another local service, not on the list: the server must not be a way in to it
        f"http://127.0.0.1:{service_port}/health": (403, "not in IMAGE_URL_ALLOWED_HOSTS"),
        # the image host under another name is another host as far as the list goes
        f"http://localhost:{host_port}/images/soup.jpg": (403, "Send the image itself as base64"),
        f"http://user:secret@127.0.0.1:{host_port}/images/soup.jpg": (400, "user name or password"),
        "http://[::1/x.jpg": (400, "not a valid URL"),
    }
    for url, (status, message) in cases.items():
        answer = predict_url(service, url)
        assert (answer.status_code, message in answer.json()["detail"]) == (status, True), (url, answer.text)


def test_redirects_are_checked_against_the_list_each_time(service, image_host, redirector):
    good = f"{image_host}/images/soup.jpg"
    assert predict_url(service, f"{redirector}/to?{good}").status_code == 200
    elsewhere = predict_url(service, f"{redirector}/to?{service}/health")
    assert elsewhere.status_code == 403 and service.removeprefix("http://") in elsewhere.json()["detail"]
    looping = predict_url(service, f"{redirector}/loop")
    assert looping.status_code == 502 and "redirects" in looping.json()["detail"]


def test_upstream_failures_get_gateway_errors_and_bad_content_a_400(service, image_host, redirector):
    missing = predict_url(service, f"{image_host}/images/nope.jpg")
    assert missing.status_code == 502 and "answered 404" in missing.json()["detail"]
    notes = predict_url(service, f"{image_host}/images/notes.txt")
    assert notes.status_code == 400
    too_big = predict_url(service, f"{image_host}/images/big.bin")
    assert too_big.status_code == 413 and f"larger than {LIMIT_BYTES} bytes" in too_big.json()["detail"]
    started = time.perf_counter()
    slow = predict_url(service, f"{image_host}/images/soup.jpg?latency_ms=10000")
    assert slow.status_code == 504 and f"within {TIMEOUT_S:g} s" in slow.json()["detail"]
    assert time.perf_counter() - started < TIMEOUT_S + 5  # bounded: the server gave up, it did not hang


@pytest.mark.integration
def test_a_host_that_is_down_gets_a_502_and_the_service_keeps_serving(image_host, redirector, tmp_path):
    down = f"http://127.0.0.1:{Ports.found_free().image_host}"  # nothing listens there
    stack, url = start_service(down, redirector, tmp_path)
    try:
        answer = predict_url(url, f"{down}/images/soup.jpg")
        assert answer.status_code == 502 and "Could not download" in answer.json()["detail"]
        image = base64.b64encode(paths.SAMPLE_IMAGE.read_bytes()).decode()
        assert requests.post(f"{url}/predict", json={"image": image}, timeout=30).status_code == 200
    finally:
        stack.stop()


@pytest.mark.integration
def test_a_download_slower_than_http_client_defaults_is_waited_for_up_to_the_setting(image_host, redirector, tmp_path):
    # httpx gives up on a read after 5 s unless told otherwise: the setting, not the library, decides.
    stack, url = start_service(image_host, redirector, tmp_path, IMAGE_DOWNLOAD_TIMEOUT_S="9")
    try:
        answer = predict_url(url, f"{image_host}/images/soup.jpg?latency_ms=6000")
    finally:
        stack.stop()
    assert answer.status_code == 200, answer.text


def test_metrics_count_every_request_and_time_every_stage(service, image_host):
    with service_stats.counted_over(service) as stats:
        for _ in range(3):
            assert predict_url(service, f"{image_host}/images/soup.jpg?latency_ms=50").status_code == 200
        assert predict_url(service, "http://example.com/soup.jpg").status_code == 403
        assert requests.post(f"{service}/predict", json={}, timeout=10).status_code == 422
    delta = stats.delta
    assert delta.requests_by_status == {"200": 3, "403": 1, "422": 1}
    assert delta.stage_counts == {"download": 4, "slot_wait": 3, "preprocess": 3, "inference": 3}
    assert delta.mean_ms("download") >= 50 * 3 / 4  # three downloads waited at least 50 ms each
    assert delta.mean_ms("inference") > 0
    text = requests.get(f"{service}/metrics", timeout=5).text
    assert 'predict_requests_total{outcome="refused",status="403"}' in text and "predict_in_flight" in text


@pytest.mark.integration
def test_a_download_inside_the_slot_holds_the_model_and_outside_it_does_not(image_host, redirector, tmp_path):
    """One slot, four photos by URL sent at once, each download 300 ms: inside the slot, each request
    waits for the downloads of those ahead of it (at least 300 + 600 + 900 ms of waiting in all);
    outside, the downloads overlap and only inferences are waited for."""
    latency_ms, senders = 300, 4
    waits = {}
    for placement in ("inside_slot", "outside_slot"):
        stack, url = start_service(
            image_host, redirector, tmp_path / placement, IMAGE_DOWNLOAD_PLACEMENT=placement, PREDICT_CONCURRENCY="1"
        )
        try:
            assert requests.get(f"{url}/health", timeout=5).json()["download_placement"] == placement
            photo = f"{image_host}/images/soup.jpg?latency_ms={latency_ms}"
            predict_url(url, photo)  # warm-up
            with service_stats.counted_over(url) as stats, ThreadPoolExecutor(senders) as pool:
                answers = [pool.submit(predict_url, url, photo) for _ in range(senders)]
                statuses = [answer.result().status_code for answer in answers]
            assert statuses == [200] * senders
            waits[placement] = stats.delta.mean_ms("slot_wait") * senders
        finally:
            stack.stop()
    assert waits["inside_slot"] >= latency_ms * (1 + 2 + 3) * 0.9
    assert waits["outside_slot"] < waits["inside_slot"] / 2


def test_the_413_reaches_a_client_that_sends_its_whole_body_first(fastapi_urls):
    """Python's urllib writes the whole body before reading: the server must read it (and throw it
    away) before answering, or this client sees a reset connection instead of the 413."""
    body = json.dumps({"image": "A" * (20 * TEST_MAX_REQUEST_BYTES)}).encode()  # 40 MB
    for url in fastapi_urls.values():
        request = urllib.request.Request(
            f"{url}/predict", data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60)
        assert refused.value.code == 413
        assert "MAX_REQUEST_BYTES" in json.loads(refused.value.read())["detail"]
        assert requests.get(f"{url}/health", timeout=5).status_code == 200


@pytest.mark.integration
def test_the_image_host_spec_serves_the_lab_samples(built_artifacts):
    spec: ServiceSpec = image_host_service(8400)
    assert spec.command[spec.command.index("--images") + 1] == str(paths.SAMPLE_IMAGE.parent)
    assert "--host" in spec.command and spec.command[spec.command.index("--host") + 1] == "127.0.0.1"
