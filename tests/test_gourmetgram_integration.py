"""GourmetGram as a real process, against each real backend, through real HTTP (form upload included)."""

import html
import re

import pytest
import requests

from servelab.food11 import LABELS
from servelab.stack import Ports
from tests.conftest import make_image_bytes

BACKENDS = ["fastapi_pt", "fastapi_onnx", "food_classifier", "food_classifier_onnx"]


def _predicted_label(page: str) -> str:
    match = re.search(r"<h1>(.*?)</h1>", page)
    assert match, "the result page has no prediction heading"
    return html.unescape(match.group(1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_upload_form_classifies_an_image_through_each_backend(start_gourmetgram, backend, built_artifacts):
    url = start_gourmetgram(backend)
    form = requests.get(f"{url}/", timeout=10)
    assert form.status_code == 200 and 'type="file"' in form.text and 'name="file"' in form.text

    upload = {"file": ("my lunch.jpg", make_image_bytes(3), "image/jpeg")}
    result = requests.post(f"{url}/predict", files=upload, timeout=60)
    assert result.status_code == 200, result.text[-1000:]
    assert _predicted_label(result.text) in LABELS
    assert re.search(r"\d+\.\d% probability", result.text)
    if built_artifacts.weights_info["weights"] == "untrained":
        assert "Untrained weights" in result.text and "not meaningful" in result.text

    health = requests.get(f"{url}/healthz", timeout=10).json()
    assert health["backend_reachable"] is True
    assert health["weights"] == built_artifacts.weights_info["weights"]


@pytest.mark.parametrize("backend", ["fastapi_pt", "food_classifier_onnx"])
def test_bundled_sample_route_classifies_a_sample(start_gourmetgram, backend):
    url = start_gourmetgram(backend)
    response = requests.get(f"{url}/test", timeout=60)
    assert response.status_code == 200
    assert _predicted_label(response.text) in LABELS


def test_all_backends_give_the_same_answer_for_the_same_upload(start_gourmetgram):
    upload = make_image_bytes(4)
    labels = set()
    for backend in BACKENDS:
        url = start_gourmetgram(backend)
        page = requests.post(f"{url}/predict", files={"file": ("dish.jpg", upload, "image/jpeg")}, timeout=60).text
        labels.add(_predicted_label(page))
    assert len(labels) == 1, f"backends disagree: {labels}"


def test_non_image_upload_is_refused_and_the_app_keeps_serving(start_gourmetgram):
    url = start_gourmetgram("fastapi_onnx")
    bad = requests.post(f"{url}/predict", files={"file": ("fake.jpg", b"%PDF-1.4 not an image", "image/jpeg")}, timeout=30)
    assert bad.status_code == 400 and "JPEG or PNG" in bad.text
    good = requests.post(f"{url}/predict", files={"file": ("ok.png", make_image_bytes(5, fmt="PNG"), "image/png")}, timeout=60)
    assert good.status_code == 200


@pytest.mark.parametrize("backend", ["fastapi_pt", "food_classifier"])
def test_backend_down_shows_a_clear_message_and_the_app_keeps_running(start_gourmetgram, backend):
    nobody_listens = Ports.free()
    url = start_gourmetgram(backend, backend_ports=nobody_listens)
    for _ in range(2):
        response = requests.post(f"{url}/predict", files={"file": ("a.jpg", make_image_bytes(6), "image/jpeg")}, timeout=60)
        assert response.status_code == 503
        assert "make up" in response.text
    assert requests.get(f"{url}/healthz", timeout=10).json()["backend_reachable"] is False
