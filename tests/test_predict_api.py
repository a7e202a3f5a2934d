"""The HTTP side of both FastAPI services in this process (each app writes its own), with a model that
answers at once (tests/helpers/). Real services, models and sockets: tests/test_fastapi_services.py and
tests/test_image_url.py.
"""

from __future__ import annotations

import asyncio
import base64
import difflib
import os
import re
import socket
import threading

import numpy as np
import pytest
from fastapi import HTTPException
from prometheus_client import values

from servelab import paths
from tests.helpers import (
    BAD_REQUESTS,
    FLAVORS,
    LIMIT_BYTES,
    WHERE,
    InstantModel,
    discard,
    make_image_bytes,
    service_module,
    service_settings,
    serving,
)

pytestmark = pytest.mark.anyio

PHOTO = base64.b64encode(paths.SAMPLE_IMAGE.read_bytes()).decode()
ONE_BATCH = ((1, 3, 224, 224), np.dtype(np.float32))  # what the model gets for a request


@pytest.fixture(params=FLAVORS)
def flavor(request) -> str:
    return request.param


@pytest.fixture
async def service(photo_host, flavor):
    async with serving(service_settings(photo_host.address), flavor=flavor) as client:
        yield client


@pytest.mark.parametrize("image_format", ["JPEG", "PNG"])
async def test_a_photo_is_answered_with_its_class_and_probability(image_format, flavor):
    model = InstantModel()
    photo = base64.b64encode(make_image_bytes(1, fmt=image_format)).decode()
    async with serving(service_settings(), model, flavor) as service:
        response = await service.post("/predict", json={"image": photo})
    assert response.status_code == 200
    assert response.json() == {"prediction": model.label, "probability": pytest.approx(model.probability)}
    assert model.batches == [ONE_BATCH]


@BAD_REQUESTS
async def test_a_bad_request_gets_its_status_never_reaches_the_model_and_the_service_goes_on(
    body, headers, status, flavor
):
    model = InstantModel()
    async with serving(service_settings(), model, flavor) as service:
        refused = await service.post("/predict", content=body, headers=headers)
        after = await service.post("/predict", json={"image": PHOTO})
    assert refused.status_code == status
    detail = refused.json()["detail"]
    assert detail, "the error must say what went wrong"
    if status == 400:
        assert "JPEG or PNG" in detail or "base64" in detail
    assert after.status_code == 200 and model.batches == [ONE_BATCH]


@pytest.mark.parametrize(
    "body, status",
    [
        ({}, 422),
        ({"image": PHOTO, "url": "http://127.0.0.1/soup.jpg"}, 422),
        ({"image": None, "url": None}, 422),
        ({"image": PHOTO, "url": None}, 200),
        ({"image": PHOTO, "note": "a field the request does not name"}, 200),
    ],
    ids=["neither", "both", "both-null", "null-url", "unknown-field"],
)
async def test_a_body_sends_one_of_image_and_url_a_null_is_not_sent_and_other_fields_are_ignored(service, body, status):
    response = await service.post("/predict", json=body)
    assert response.status_code == status
    if status == 422:
        assert "exactly one of `image`" in response.text


def body_of(size: int) -> bytes:
    """A JSON body of exactly `size` bytes, whose image is not one."""
    head, tail = b'{"image": "', b'"}'
    return head + b"A" * (size - len(head) - len(tail)) + tail


async def in_pieces(body: bytes):
    """The body streamed without a Content-Length (chunked): the limit is counted as it arrives."""
    for start in range(0, len(body), 65536):
        yield body[start : start + 65536]


@pytest.mark.parametrize("streamed", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("size, status", [(LIMIT_BYTES, 400), (LIMIT_BYTES + 1, 413)], ids=["at-limit", "over"])
async def test_a_body_over_max_request_bytes_is_refused_with_413_whether_declared_or_streamed(
    service, size, status, streamed
):
    body = body_of(size)
    response = await service.post(
        "/predict", content=in_pieces(body) if streamed else body, headers={"content-type": "application/json"}
    )
    assert response.status_code == status  # at the limit, it is read and judged: not an image
    if status == 413:
        assert f"larger than {LIMIT_BYTES} bytes" in response.json()["detail"]
        assert "MAX_REQUEST_BYTES" in response.json()["detail"]
    assert (await service.post("/predict", json={"image": PHOTO})).status_code == 200


async def test_a_model_that_fails_is_a_500_that_says_so(flavor):
    async with serving(service_settings(), InstantModel(fails=True), flavor) as service:
        response = await service.post("/predict", json={"image": PHOTO})
    assert response.status_code == 500
    assert response.json() == {"detail": "Inference failed (RuntimeError); the server log has the traceback."}


class ThreadRecordingModel(InstantModel):
    def __init__(self) -> None:
        super().__init__()
        self.threads: list[int] = []

    def run(self, model, batch):
        self.threads.append(threading.get_ident())
        return super().run(model, batch)


async def test_the_slots_run_at_most_their_count_at_once_and_a_lone_request_after_a_load_keeps_to_one_thread(flavor):
    """The thread idle the shortest takes the next job: a lone request after a load does not go round every
    slot's thread (its caches cold: measured about 20% slower)."""
    model = ThreadRecordingModel()
    async with serving(service_settings(PREDICT_CONCURRENCY="3"), model, flavor) as service:
        loaded = await asyncio.gather(*[service.post("/predict", json={"image": PHOTO}) for _ in range(9)])
        under_load, model.threads = set(model.threads), []
        for _ in range(6):
            assert (await service.post("/predict", json={"image": PHOTO})).status_code == 200
    assert all(answer.status_code == 200 for answer in loaded)
    assert 1 <= len(under_load) <= 3, "never more threads running the model than slots"
    assert len(set(model.threads)) == 1 and model.threads[0] in under_load


# ---- images sent by URL --------------------------------------------------------------------------


def test_the_allow_list_takes_hosts_with_any_port_or_one_port(flavor):
    service = service_module(flavor, service_settings(" Images.example.org , 127.0.0.1:8400,"))
    discard(service)
    for url in ("https://images.example.org/a.jpg", "http://IMAGES.example.org:8080/a.jpg", "http://127.0.0.1:8400/x"):
        assert service.allowed(url) == url
    for url in ("http://127.0.0.1:8401/x", "http://127.0.0.1/x", "http://example.org/a.jpg"):
        with pytest.raises(HTTPException) as refused:
            service.allowed(url)
        assert refused.value.status_code == 403, url
    with pytest.raises(SystemExit, match="not `host` or `host:port`"):
        service_module(flavor, service_settings("127.0.0.1:http"))


@pytest.mark.parametrize(
    "url, status, says",
    [
        ("ftp://{host}/soup.jpg", 400, "Only http and https"),
        ("file:///etc/passwd", 400, "Only http and https"),
        ("not a url", 400, "Only http and https"),
        ("http://user:secret@{host}/soup.jpg", 400, "user name or password"),
        ("http://[::1/x.jpg", 400, "not a valid URL"),
        # another port of the same machine (another local service): the server is no way in to it
        ("http://127.0.0.1:1/health", 403, "not in IMAGE_URL_ALLOWED_HOSTS"),
        # the photo host under another name is another host, as far as the list goes
        ("http://localhost:{port}/soup.jpg", 403, "Send the image itself as base64"),
    ],
    ids=["ftp", "file", "no-scheme", "user-and-password", "invalid", "port-not-listed", "host-not-listed"],
)
async def test_a_url_the_server_must_not_fetch_is_refused_before_any_connection(service, photo_host, url, status, says):
    port = photo_host.address.rsplit(":", 1)[1]
    response = await service.post("/predict", json={"url": url.format(host=photo_host.address, port=port)})
    assert response.status_code == status and says in response.json()["detail"]
    assert photo_host.asked == []


async def test_redirects_are_checked_against_the_list_each_time(service, photo_host):
    to_photo = await service.post("/predict", json={"url": photo_host.url(f"to?{photo_host.url('soup.jpg')}")})
    assert to_photo.status_code == 200 and photo_host.asked == [f"/to?{photo_host.url('soup.jpg')}", "/soup.jpg"]
    elsewhere = await service.post("/predict", json={"url": photo_host.url("to?http://127.0.0.1:1/health")})
    assert elsewhere.status_code == 403 and "127.0.0.1:1" in elsewhere.json()["detail"]
    looping = await service.post("/predict", json={"url": photo_host.url("loop")})
    assert looping.status_code == 502 and "redirects" in looping.json()["detail"]


@pytest.mark.parametrize(
    "name, status, says",
    [
        ("missing.jpg", 502, "answered 404"),
        ("notes.txt", 400, "JPEG or PNG"),
        ("big.bin", 413, f"larger than {LIMIT_BYTES} bytes"),
    ],
)
async def test_what_the_host_sends_back_is_judged(service, photo_host, name, status, says):
    response = await service.post("/predict", json={"url": photo_host.url(name)})
    assert response.status_code == status and says in response.json()["detail"]


async def test_a_download_past_its_time_limit_is_a_504(photo_host, flavor):
    settings = service_settings(photo_host.address, IMAGE_DOWNLOAD_TIMEOUT_S="0.2")
    async with serving(settings, flavor=flavor) as service:
        response = await service.post("/predict", json={"url": photo_host.url("held")})
    assert response.status_code == 504 and "within 0.2 s" in response.json()["detail"]


async def test_a_host_that_is_down_is_a_502(flavor):
    with socket.socket() as bound:  # bound, never listening: a connection is refused
        bound.bind(("127.0.0.1", 0))
        down = f"127.0.0.1:{bound.getsockname()[1]}"
        async with serving(service_settings(down), flavor=flavor) as service:
            response = await service.post("/predict", json={"url": f"http://{down}/soup.jpg"})
    assert response.status_code == 502 and "Could not download" in response.json()["detail"]


# ---- what the service says about itself ----------------------------------------------------------


async def test_health_says_where_the_model_runs_and_every_setting_it_serves_with(flavor):
    settings = service_settings(
        "images.example.org",
        PREDICT_CONCURRENCY="3",
        INFERENCE_THREADS="2",
        IMAGE_DOWNLOAD_PLACEMENT="inside_slot",
        ABANDON_ON_DISCONNECT="off",
    )
    async with serving(settings, flavor=flavor) as service:
        health = await service.get("/health")
    assert health.status_code == 200
    cores = len(os.sched_getaffinity(0))
    busy = {"pt": 3 * 2, "onnx": 3 + 2 - 1}[flavor]  # a team per slot's thread; one pool the slots share
    plan = f"3 inference slot(s) x 2 thread(s): at most {busy} busy threads on {cores} core(s)"
    assert health.json() == {
        "status": "ready",
        "model_file": "instant-model.onnx",
        "weights": "unknown",
        "weights_note": "no instant-model.onnx.weights.json beside the model file",
        **WHERE,
        "first_inference_ms": 0.1,
        "processes": 1,
        "process_id": os.getpid(),  # served in this process
        "cores": cores,
        "slots": 3,
        "inference_threads": 2,
        "threads": plan + ": MORE THREADS THAN CORES, so every inference is slowed by the others" * (busy > cores),
        "max_request_bytes": LIMIT_BYTES,
        "download_placement": "inside_slot",
        "image_url_allowed_hosts": "images.example.org",
        "abandon_on_disconnect": False,
    }


@pytest.mark.parametrize(
    "variable, value, says",
    [
        ("INFERENCE_DEVICE", "gpu", "INFERENCE_DEVICE='gpu' is not one of auto, cuda, cpu"),
        ("INFERENCE_THREADS", "many", "INFERENCE_THREADS='many' is not a whole number above 0"),
        ("PREDICT_CONCURRENCY", "0", "PREDICT_CONCURRENCY='0' is not a whole number above 0"),
        ("IMAGE_DOWNLOAD_TIMEOUT_S", "soon", "IMAGE_DOWNLOAD_TIMEOUT_S='soon' is not a number above 0"),
        ("IMAGE_DOWNLOAD_PLACEMENT", "inside", "is not one of outside_slot, inside_slot"),
        ("ABANDON_ON_DISCONNECT", "maybe", "is not one of on, off"),
        ("WEB_CONCURRENCY", "2", "set PROMETHEUS_MULTIPROC_DIR to an empty folder"),
    ],
)
def test_a_setting_the_service_cannot_use_stops_it_saying_what_to_set(flavor, variable, value, says):
    with pytest.raises(SystemExit, match=re.escape(says)):
        service_module(flavor, service_settings(**{variable: value}))


async def test_health_says_loudly_when_the_weights_are_untrained(tmp_path, flavor):
    model_file = tmp_path / "food11.onnx"
    note = "UNTRAINED weights: the labels mean nothing"
    (tmp_path / "food11.onnx.weights.json").write_text(f'{{"weights": "untrained", "note": "{note}"}}')
    async with serving(service_settings(FOOD11_MODEL_PATH=str(model_file)), flavor=flavor) as service:
        health = (await service.get("/health")).json()
    assert (health["model_file"], health["weights"], health["weights_note"]) == ("food11.onnx", "untrained", note)


async def test_the_api_is_documented_and_other_methods_and_paths_are_refused(service):
    openapi = (await service.get("/openapi.json")).json()
    documented = set(openapi["paths"]["/predict"]["post"]["responses"])
    assert documented == {"200", "400", "403", "413", "422", "499", "500", "502", "504"}
    assert "swagger" in (await service.get("/docs")).text.lower()
    assert (await service.get("/predict")).status_code == 405
    assert (await service.get("/no-such-endpoint")).status_code == 404


async def test_health_is_503_until_every_process_of_the_service_serves(tmp_path, monkeypatch, flavor):
    """A service of two processes where only this one has started: not ready, and predictions served
    meanwhile. Its metrics go to PROMETHEUS_MULTIPROC_DIR, as in a process of several (prometheus_client
    chooses how it keeps them when it is first imported: here, before the app)."""
    monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue())
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    settings = service_settings(WEB_CONCURRENCY="2", PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    async with serving(settings, flavor=flavor) as service:
        health = await service.get("/health")
        answer = await service.post("/predict", json={"image": PHOTO})
        metrics = (await service.get("/metrics")).text
    assert health.status_code == 503
    assert health.json()["detail"] == "Starting: 1 of 2 processes serve. Ask again in a few seconds."
    assert answer.status_code == 200 and 'predict_requests_total{status="200"} 1.0' in metrics


def test_both_apps_write_the_same_http_side():
    """Each app is a file of its own, read top to bottom: from its metrics on (the HTTP side), the two may
    differ only in their title."""
    sides = {
        flavor: (paths.REPO_ROOT / f"fastapi_{flavor}" / "app.py").read_text().split("\n# ---- metrics")[1]
        for flavor in FLAVORS
    }
    differing = [
        line[0] + line[2:].split("(")[0]
        for line in difflib.ndiff(sides["pt"].splitlines(), sides["onnx"].splitlines())
        if line[0] in "+-"
    ]
    assert differing == ["-app = FastAPI", "+app = FastAPI"]
