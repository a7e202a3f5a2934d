"""Images by URL, end to end: the lab's image host and a FastAPI service that downloads from it, as
real processes, for what needs them. Every way a URL is refused, redirects and the host's failures:
tests/test_predict_api.py, in process.
"""

from __future__ import annotations

import base64
import json
import shutil
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from food11 import LABELS
from servelab import paths
from servelab.measure import service_stats
from servelab.stack.catalogue import fastapi_service, image_host_service
from servelab.stack.supervision import LocalStack, Ports, ServiceSpec

pytestmark = pytest.mark.integration

LIMIT_BYTES = 1_000_000  # MAX_REQUEST_BYTES of the services here: the soup photo fits


@pytest.fixture(scope="module")
def image_host(tmp_path_factory, built_artifacts):
    folder = tmp_path_factory.mktemp("images")
    shutil.copy(paths.SAMPLE_IMAGE, folder / "soup.jpg")
    port = Ports.found_free().image_host
    spec = image_host_service(port, latency_ms=0)
    spec.command[spec.command.index("--images") + 1] = str(folder)
    with LocalStack([spec], log_dir=tmp_path_factory.mktemp("image-host-logs")):
        yield f"http://127.0.0.1:{port}"


def start_service(image_host: str, log_dir, **settings: str) -> tuple[LocalStack, str]:
    port = Ports.found_free().fastapi_onnx
    env = {
        "IMAGE_URL_ALLOWED_HOSTS": image_host.removeprefix("http://"),
        "MAX_REQUEST_BYTES": str(LIMIT_BYTES),
        **settings,
    }
    stack = LocalStack([fastapi_service("onnx", port, env=env)], log_dir=log_dir).start()
    return stack, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def service(image_host, tmp_path_factory):
    stack, url = start_service(image_host, tmp_path_factory.mktemp("service-logs"))
    yield url
    stack.stop()


def predict_url(service: str, url: str) -> requests.Response:
    return requests.post(f"{service}/predict", json={"url": url}, timeout=30)


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


def test_a_download_slower_than_http_client_defaults_is_waited_for_up_to_the_setting(image_host, tmp_path):
    # httpx gives up on a read after 5 s unless told otherwise: the setting, not the library, decides.
    stack, url = start_service(image_host, tmp_path, IMAGE_DOWNLOAD_TIMEOUT_S="9")
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
    assert 'predict_requests_total{status="403"}' in text and "predict_in_flight" in text


def test_a_download_inside_the_slot_holds_the_model_and_outside_it_does_not(image_host, tmp_path):
    """One slot, four photos by URL sent at once, each download 300 ms: inside the slot, each request
    waits for the downloads of those ahead of it (at least 300 + 600 + 900 ms of waiting in all);
    outside, the downloads overlap and only inferences are waited for."""
    latency_ms, senders = 300, 4
    waits = {}
    for placement in ("inside_slot", "outside_slot"):
        stack, url = start_service(
            image_host, tmp_path / placement, IMAGE_DOWNLOAD_PLACEMENT=placement, PREDICT_CONCURRENCY="1"
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


def test_the_413_reaches_a_client_that_sends_its_whole_body_first(service):
    """Python's urllib writes the whole body before reading: the server must read it (and throw it
    away) before answering, or this client sees a reset connection instead of the 413."""
    body = json.dumps({"image": "A" * (20 * LIMIT_BYTES)}).encode()  # 20 MB
    request = urllib.request.Request(
        f"{service}/predict", data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 413
    assert "MAX_REQUEST_BYTES" in json.loads(refused.value.read())["detail"]
    assert requests.get(f"{service}/health", timeout=5).status_code == 200


def test_the_image_host_spec_serves_the_lab_samples(built_artifacts):
    spec: ServiceSpec = image_host_service(8400)
    assert spec.command[spec.command.index("--images") + 1] == str(paths.SAMPLE_IMAGE.parent)
    assert "--host" in spec.command and spec.command[spec.command.index("--host") + 1] == "127.0.0.1"
