"""Both FastAPI services as real processes (uvicorn, their own app.py and model) over real HTTP: what
the in-process tests of their HTTP side (tests/test_predict_api.py) cannot see.
"""

import base64

import pytest
import requests

from food11 import LABELS
from servelab.measure import service_stats
from servelab.service.cores import available_cores, service_plan
from servelab.service.start import planned_processes
from servelab.stack.catalogue import FASTAPI_FLAVORS, fastapi_service
from servelab.stack.supervision import LocalStack, Ports
from tests.helpers import FLAVORS, check_bad_request

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("flavor", FLAVORS)
def test_bytes_that_are_not_an_image_are_refused_by_the_real_process_which_goes_on(flavor, fastapi_urls, image_b64):
    """The in-process tests send every bad request to a stand-in model; this one, to the service as it runs."""
    not_an_image = b'{"image": "' + base64.b64encode(b"hello, I am text") + b'"}'
    check_bad_request(fastapi_urls[flavor], image_b64, not_an_image, {"content-type": "application/json"}, 400)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_health_reports_model_weights_runtime_device_and_the_plan_its_app_made(flavor, fastapi_urls, built_artifacts):
    """As the process's runtime reports itself once its model has run; its weights from the record
    `make artifacts` placed beside the model file; the processes `python app.py` plans for this machine
    (uvicorn's workers), each with a slot of one thread per core of its share, as the lab's own copy of
    the rule (cores.service_plan) says."""
    body = requests.get(f"{fastapi_urls[flavor]}/health", timeout=5).json()
    assert body["status"] == "ready" and body["model_file"] == FASTAPI_FLAVORS[flavor][1]
    assert body["weights"] == built_artifacts.weights_info["weights"]
    assert body["weights"] == "trained" or "UNTRAINED" in body["weights_note"]
    assert body["device"] == "cpu" or body["device"].startswith("cuda")
    assert body["device_asked"] == body["device"].split()[0] and body["device_fallback"] is None  # auto: no fallback
    assert body["runtime"].split()[0] == {"pt": "torch", "onnx": "onnxruntime"}[flavor]
    processes = planned_processes(FASTAPI_FLAVORS[flavor][0], "")
    cores = max(1, available_cores() // processes)
    assert (body["processes"], body["cores"], body["slots"], body["inference_threads"]) == (processes, cores, cores, 1)
    assert (
        body["threads"] == f"{cores} inference slot(s) x 1 thread(s): at most {cores} busy threads on {cores} core(s)"
    )
    assert processes == service_plan(available_cores(), on_gpu=body["device"].startswith("cuda")).processes


def test_thread_settings_come_from_the_environment_and_a_crowded_plan_is_reported(tmp_path, test_images):
    port = Ports.found_free().fastapi_pt
    settings = {"PREDICT_CONCURRENCY": "3", "INFERENCE_THREADS": "2"}
    with LocalStack([fastapi_service("pt", port, env=settings)], log_dir=tmp_path) as stack:
        body = requests.get(f"http://127.0.0.1:{port}/health", timeout=5).json()
        image = base64.b64encode(test_images[0]).decode()
        answer = requests.post(f"http://127.0.0.1:{port}/predict", json={"image": image}, timeout=30)
        log = stack.processes[0].log_path.read_text()
    assert (body["slots"], body["inference_threads"]) == (3, 2)
    assert body["threads"].startswith("3 inference slot(s) x 2 thread(s)")
    crowded = 3 * 2 > body["cores"]
    assert ("MORE THREADS THAN CORES" in body["threads"]) == crowded
    (started,) = [line for line in log.splitlines() if "3 inference slot(s) x 2 thread(s)" in line]
    assert (" WARNING " in started) == crowded  # logged as a warning
    assert answer.status_code == 200


@pytest.mark.parametrize("flavor", FLAVORS)
def test_a_gpu_the_runtime_cannot_use_is_reported_as_the_cpu_with_its_reason(tmp_path, flavor, image_b64):
    """Asked for the GPU where none can be used (none is visible, even on a GPU machine), the
    service runs on the CPU and says so in /health and its log, with the runtime's reason, and
    its threads are planned for the CPU: a slot per core, not the GPU's one."""
    port = Ports.found_free().fastapi_pt
    settings = {"INFERENCE_DEVICE": "cuda", "CUDA_VISIBLE_DEVICES": ""}
    with LocalStack([fastapi_service(flavor, port, env=settings)], log_dir=tmp_path) as stack:
        body = requests.get(f"http://127.0.0.1:{port}/health", timeout=5).json()
        answer = requests.post(f"http://127.0.0.1:{port}/predict", json={"image": image_b64}, timeout=30)
        log = stack.processes[0].log_path.read_text()
    assert (body["device"], body["device_asked"]) == ("cpu", "cuda")
    reason = body["device_fallback"].removeprefix("the model did not run on cuda: ")
    assert reason and reason != body["device_fallback"]
    if flavor == "onnx":
        assert body["runtime"].endswith("(CPUExecutionProvider)")
    assert (body["slots"], body["inference_threads"]) == (available_cores(), 1)  # the CPU's plan
    (warning,) = [line for line in log.splitlines() if "for the GPU (cuda); it runs on the CPU instead" in line]
    assert " WARNING " in warning and warning.endswith(f"Its reason: {reason}")
    assert " on cpu (" in log
    assert answer.status_code == 200


def test_a_service_of_two_processes_answers_from_both_and_its_metrics_add_up(tmp_path, image_b64):
    """WEB_CONCURRENCY=2: two uvicorn workers share the port, each on its share of the cores, and
    /metrics, whichever answers it, counts every prediction of both. Each request opens a new
    connection, so the kernel hands them to both workers; metrics kept per process would give
    different totals from the two. Each process also counts its own share: the requests it
    answered and the connections they came on (a kept-alive one counted once)."""
    port = Ports.found_free().fastapi_onnx
    sent, kept_alive = 16, 5
    with LocalStack([fastapi_service("onnx", port, env={"WEB_CONCURRENCY": "2"})], log_dir=tmp_path):
        url = f"http://127.0.0.1:{port}"
        healths = [requests.get(f"{url}/health", timeout=5).json() for _ in range(24)]
        before = service_stats.scrape(url)
        for _ in range(sent):
            assert requests.post(f"{url}/predict", json={"image": image_b64}, timeout=30).status_code == 200
        middle = service_stats.scrape(url)
        with requests.Session() as one_connection:
            for _ in range(kept_alive):
                answer = one_connection.post(f"{url}/predict", json={"image": image_b64}, timeout=30)
                assert answer.status_code == 200
        after = service_stats.scrape(url)
        totals = {predictions_counted(requests.get(f"{url}/metrics", timeout=5).text) for _ in range(12)}
    workers = {str(health["process_id"]) for health in healths}
    assert len(workers) == 2, "both workers answer"
    assert {health["processes"] for health in healths} == {2}
    assert {health["cores"] for health in healths} == {max(1, available_cores() // 2)}
    assert totals == {sent + kept_alive}
    new_connections = service_stats.diff(url, before, middle).by_process
    assert set(new_connections) == workers, "each live worker shows, an idle one with 0"
    assert sum(counts["requests"] for counts in new_connections.values()) == sent
    assert sum(counts["connections"] for counts in new_connections.values()) == sent, "a connection a request"
    one = service_stats.diff(url, middle, after).by_process
    (serving,) = [counts for counts in one.values() if counts["requests"]]
    assert serving == {"requests": kept_alive, "connections": 1}, "a kept-alive connection stays with its worker"


def predictions_counted(exposition: str) -> float:
    (line,) = [line for line in exposition.splitlines() if line.startswith('predict_requests_total{status="200"}')]
    return float(line.split()[-1])


@pytest.mark.parametrize(
    "flavor, setting, says",
    [
        # Its app says so as soon as it plans its processes (StackError is a RuntimeError too) ...
        ("pt", {"INFERENCE_DEVICE": "gpu"}, "INFERENCE_DEVICE='gpu' is not one of auto, cuda, cpu"),
        # ... or, for a setting the plan does not read, as its process starts.
        ("onnx", {"INFERENCE_THREADS": "many"}, "INFERENCE_THREADS='many' is not a whole number"),
    ],
)
def test_a_bad_setting_stops_the_service_with_what_to_do(tmp_path, flavor, setting, says):
    port = Ports.found_free().fastapi_pt
    with pytest.raises(RuntimeError, match=says):
        LocalStack([fastapi_service(flavor, port, env=setting)], log_dir=tmp_path).start()


def test_both_real_models_answer_a_label_and_a_probability_and_agree_on_every_image(fastapi_urls, test_images):
    for raw in test_images:
        payload = {"image": base64.b64encode(raw).decode()}
        pt, onnx = (requests.post(f"{fastapi_urls[f]}/predict", json=payload, timeout=30).json() for f in FLAVORS)
        assert set(pt) == {"prediction", "probability"} and pt["prediction"] in LABELS
        assert 1 / 11 - 1e-6 <= pt["probability"] <= 1  # softmax over 11 classes: the top has at least 1/11
        assert onnx["prediction"] == pt["prediction"]
        assert onnx["probability"] == pytest.approx(pt["probability"], abs=1e-4)
