"""GourmetGram as a real process, against each real backend, through real HTTP (form upload included),
and as its image runs it, under gunicorn.

One GourmetGram per backend serves every test here (tests/lab_servers.py); each test's checks hold
whatever the tests before it asked.
"""

import dataclasses
import html
import re
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from food11 import LABELS
from servelab import paths
from servelab.stack.catalogue import gourmetgram_service
from servelab.stack.supervision import Ports, start_on_free_ports
from tests.helpers import make_image_bytes, until

pytestmark = pytest.mark.integration

BACKENDS = ["fastapi_pt", "fastapi_onnx", "food_classifier", "food_classifier_onnx"]
# What /healthz reports for each: the backend kind, and what the page sends the model. For Triton
# both are read from the model's metadata, not from its name.
EXPECTED_HEALTH = {
    "fastapi_pt": ("fastapi", "image file (base64)"),
    "fastapi_onnx": ("fastapi", "image file (base64)"),
    "food_classifier": ("triton", "image file (base64)"),
    "food_classifier_onnx": ("triton", "preprocessed tensor"),
}


def _predicted_label(page: str) -> str:
    match = re.search(r"<h1>(.*?)</h1>", page)
    assert match, "the result page has no prediction heading"
    return html.unescape(match.group(1))


def metric(exposition: str, name: str) -> float:
    """A sample of GourmetGram's /metrics, by its name and labels as written there; 0 where absent."""
    match = re.search(rf"^{re.escape(name)} (\S+)$", exposition, re.M)
    return float(match.group(1)) if match else 0.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_upload_form_classifies_an_image_through_each_backend(gourmetgram, backend, built_artifacts):
    url = gourmetgram(backend)  # its form: test_gourmetgram_pages
    kind, model_input = EXPECTED_HEALTH[backend]
    before = gourmetgram.first_health[url]  # as it answered at start, before any request
    assert before["backend"] == kind
    assert before["model_input"] == (model_input if kind == "fastapi" else None)  # Triton: not asked yet

    upload = {"file": ("my lunch.jpg", make_image_bytes(3), "image/jpeg")}
    result = requests.post(f"{url}/predict", files=upload, timeout=60)
    assert result.status_code == 200, result.text[-1000:]
    assert _predicted_label(result.text) in LABELS
    assert re.search(r"\d+\.\d% probability", result.text)
    assert f"answered by {kind} in" in result.text and f"request: {model_input}" in html.unescape(result.text)
    if built_artifacts.weights_info["weights"] == "untrained":
        banner = re.search(r'role="alert">(.*?)</div>', result.text, re.S).group(1)
        assert banner.count("UNTRAINED weights") == 1 and "not meaningful" in banner and "random" not in banner

    health = requests.get(f"{url}/healthz", timeout=10).json()
    assert health["backend_reachable"] is True
    assert health["weights"] == built_artifacts.weights_info["weights"]
    assert (health["backend"], health["model_input"]) == (kind, model_input)


def test_all_backends_give_the_same_answer_for_the_same_upload(gourmetgram):
    upload = make_image_bytes(4)
    labels = set()
    for backend in BACKENDS:
        url = gourmetgram(backend)
        page = requests.post(f"{url}/predict", files={"file": ("dish.jpg", upload, "image/jpeg")}, timeout=60).text
        labels.add(_predicted_label(page))
    assert len(labels) == 1, f"backends disagree: {labels}"


def test_a_non_image_upload_is_refused_the_app_keeps_serving_and_metrics_count_both(gourmetgram):
    url = gourmetgram("fastapi_onnx")
    before = requests.get(f"{url}/metrics", timeout=10).text
    bad = {"file": ("fake.jpg", b"%PDF-1.4 not an image", "image/jpeg")}
    refused = requests.post(f"{url}/predict", files=bad, timeout=60)
    assert refused.status_code == 400 and "JPEG or PNG" in refused.text
    upload = {"file": ("ok.png", make_image_bytes(5, fmt="PNG"), "image/png")}
    assert requests.post(f"{url}/predict", files=upload, timeout=60).status_code == 200
    after = requests.get(f"{url}/metrics", timeout=10).text
    for name, grew in (
        ('gourmetgram_requests_total{page="predict",status="200"}', 1),
        ('gourmetgram_requests_total{page="predict",status="400"}', 1),
        ('gourmetgram_backend_seconds_count{outcome="predicted"}', 1),  # the bad upload never reached it
    ):
        assert metric(after, name) - metric(before, name) == grew, name
    assert metric(after, 'gourmetgram_backend_seconds_sum{outcome="predicted"}') > 0


def test_unknown_triton_model_gets_a_clear_error_and_the_app_keeps_serving(model_servers, ports, tmp_path):
    def unknown_model(own: Ports) -> list:
        spec = gourmetgram_service(own.gourmetgram, "food_classifier", ports)
        return [dataclasses.replace(spec, env={**spec.env, "FOOD11_MODEL_NAME": "no_such_model"})]

    stack, own = start_on_free_ports(unknown_model, tmp_path / "logs")
    with stack:
        url = f"http://127.0.0.1:{own.gourmetgram}"
        for _ in range(2):  # the same clear answer each time, not a crash or a stale state
            upload = {"file": ("a.jpg", make_image_bytes(7), "image/jpeg")}
            response = requests.post(f"{url}/predict", files=upload, timeout=60)
            page = html.unescape(response.text)
            assert response.status_code == 502, page[-1000:]
            assert "has no model 'no_such_model'" in page
            available = re.search(r"Models in its repository: ([^.]*)\.", page)
            assert available, page[-1000:]
            assert {"food_classifier", "food_classifier_onnx"} <= set(available.group(1).split(", "))
            assert "FOOD11_MODEL_NAME" in page
        health = requests.get(f"{url}/healthz", timeout=10)
        assert health.status_code == 200
        data = health.json()
        assert (data["backend"], data["model"], data["model_input"]) == ("triton", "no_such_model", None)
        assert data["backend_reachable"] is True
        assert requests.get(f"{url}/", timeout=10).status_code == 200


def test_under_gunicorn_every_worker_serves_and_metrics_add_up_whichever_worker_answers(model_servers, ports, tmp_path):
    """As its image runs it: under gunicorn, with gourmetgram/gunicorn.conf.py (whose workers the image
    runs: tests/test_dockerfiles.py). Its worker processes each build their own app; /metrics must add
    up what every one of them served, whichever worker answers it."""
    metrics_dir, config = tmp_path / "metrics", tmp_path / "gunicorn.conf.py"
    # The image's settings, but workers that take one request at a time (a threaded worker may take
    # them all), so that requests at once spread over the workers. (Gunicorn runs threads > 1 as gthread.)
    shipped = (paths.GOURMETGRAM_DIR / "gunicorn.conf.py").read_text()
    config.write_text(shipped + '\nworker_class = "sync"\nthreads = 1\n')

    def under_gunicorn(own) -> list:
        spec = gourmetgram_service(own.gourmetgram, "fastapi_pt", ports)
        command = [sys.executable, "-m", "gunicorn", "--config", str(config), "app:app"]
        return [
            dataclasses.replace(spec, command=command, env={**spec.env, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)})
        ]

    stack, own = start_on_free_ports(under_gunicorn, tmp_path / "logs")
    with stack:
        url = f"http://127.0.0.1:{own.gourmetgram}"
        log = tmp_path / "logs" / "gourmetgram.log"
        until(lambda: log.read_text().count("INFO gourmetgram: backend=fastapi") >= 2, 60, "both workers' apps")

        def upload(seed: int) -> requests.Response:
            files = {"file": (f"dish{seed}.jpg", make_image_bytes(seed), "image/jpeg")}
            return requests.post(f"{url}/predict", files=files, timeout=120)

        def workers_counted() -> set[str]:
            return {path.name.split("_")[1] for path in metrics_dir.glob("counter_*.db")}

        uploads, at_once = 0, 8
        for _ in range(3):  # each a burst of uploads at once, until two workers have served
            with ThreadPoolExecutor(at_once) as pool:
                pages = list(pool.map(upload, range(at_once)))
            uploads += at_once
            assert [page.status_code for page in pages] == [200] * at_once
            assert all(_predicted_label(page.text) in LABELS for page in pages)
            if len(workers_counted()) >= 2:
                break
        assert len(workers_counted()) >= 2, f"every upload went to one worker: {sorted(metrics_dir.iterdir())}"
        for _ in range(4):  # /metrics from whichever worker answers: the same sums
            metrics = requests.get(f"{url}/metrics", timeout=10).text
            assert metric(metrics, 'gourmetgram_requests_total{page="predict",status="200"}') == uploads
            assert metric(metrics, 'gourmetgram_backend_seconds_count{outcome="predicted"}') == uploads
        health = requests.get(f"{url}/healthz", timeout=10).json()
        assert health["backend_reachable"] is True and health["backend"] == "fastapi"
