"""Both FastAPI services as real processes (uvicorn, their own app.py and model) over real HTTP: what
the in-process tests of their HTTP side (tests/test_predict_api.py, tests/test_predict_schema.py, a
model that answers at once) cannot see. That each serves the API those tests check; the real
models' answers, and a bad request refused by the real decoder; /health as each process reports
its runtime, device and cores; settings read from the process's environment, a bad one stopping it.
"""

import base64

import pytest
import requests

from food11 import LABELS
from servelab.measure import service_stats
from servelab.service.cores import available_cores, service_plan, thread_plan
from servelab.stack.catalogue import fastapi_service
from servelab.stack.supervision import LocalStack, Ports, StackError
from tests.helpers import InstantModel, check_bad_request, service_app, service_settings

pytestmark = pytest.mark.integration

FLAVORS = ["pt", "onnx"]


@pytest.fixture(params=FLAVORS)
def service_url(request, fastapi_urls) -> str:
    return fastapi_urls[request.param]


def test_predict_returns_a_label_and_a_probability(service_url, image_b64):
    """The real model's answer, end to end."""
    response = requests.post(f"{service_url}/predict", json={"image": image_b64}, timeout=30)
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"prediction", "probability"}
    assert body["prediction"] in LABELS
    # Softmax over 11 classes: the top class has at least 1/11 of the mass.
    assert 1 / 11 - 1e-6 <= body["probability"] <= 1


def test_each_service_serves_the_api_tested_in_process(service_url):
    """The routes, their schemas and documented statuses are create_app's (the title is the service's)."""
    served = requests.get(f"{service_url}/openapi.json", timeout=5).json()
    in_process = service_app(service_settings(), InstantModel()).openapi()
    assert (served["paths"], served["components"]) == (in_process["paths"], in_process["components"])
    assert "swagger" in requests.get(f"{service_url}/docs", timeout=5).text.lower()


def test_bytes_that_are_not_an_image_are_refused_by_the_real_decoder_and_the_service_goes_on(service_url, image_b64):
    not_an_image = b'{"image": "' + base64.b64encode(b"hello, I am text") + b'"}'
    check_bad_request(service_url, image_b64, not_an_image, {"content-type": "application/json"}, 400)


def test_health_reports_model_weights_device_and_runtime(service_url):
    """As the process's runtime reports itself once its model has run."""
    body = requests.get(f"{service_url}/health", timeout=5).json()
    assert body["status"] == "ready"
    assert body["model_file"] in ("food11.pth", "food11.onnx")
    assert body["weights"] in ("trained", "untrained")
    assert body["device"] == "cpu" or body["device"].startswith("cuda")
    assert body["device_asked"] == body["device"].split()[0] and body["device_fallback"] is None  # auto: no fallback
    assert body["runtime"].split()[0] in ("torch", "onnxruntime")
    assert requests.get(f"{service_url}/healthz", timeout=5).json() == body


def test_health_states_the_thread_plan_and_the_default_never_crowds_the_cores(service_url):
    """The default plan for the cores this machine has, shared out among the service's processes."""
    body = requests.get(f"{service_url}/health", timeout=5).json()
    service = service_plan(available_cores(), on_gpu=body["device"].startswith("cuda"))
    cores = service.cores_each
    plan = thread_plan(device=body["device"], cores=cores, environ={})  # the default plan for the service's device
    assert body["processes"] == service.processes
    assert (body["cores"], body["slots"], body["inference_threads"]) == (cores, plan.slots, plan.threads)
    assert body["threads"] == plan.describe() and "(the defaults)" in body["threads"] and not plan.oversubscribed
    assert body["decode_ahead"] == max(2 * plan.slots, body["preprocess_workers"])
    if body["device"].startswith("cuda"):  # one slot on a GPU, and every core decodes
        assert body["preprocess_workers"] == cores and "elastic" not in body["threads"]
    else:  # one slot per core on a CPU, each inference with the cores divided by those running
        assert plan.slots == cores and plan.threads == cores and "elastic" in body["threads"]


def test_thread_settings_come_from_the_environment_and_a_crowded_plan_is_reported(tmp_path, test_images):
    port = Ports.found_free().fastapi_pt
    settings = {"PREDICT_CONCURRENCY": "3", "INFERENCE_THREADS": "2"}
    with LocalStack([fastapi_service("pt", port, env=settings)], log_dir=tmp_path) as stack:
        body = requests.get(f"http://127.0.0.1:{port}/health", timeout=5).json()
        image = base64.b64encode(test_images[0]).decode()
        answer = requests.post(f"http://127.0.0.1:{port}/predict", json={"image": image}, timeout=30)
        log = stack.processes[0].log_path.read_text()
    assert (body["slots"], body["inference_threads"]) == (3, 2)
    assert "PREDICT_CONCURRENCY=3, INFERENCE_THREADS=2" in body["threads"]
    crowded = 3 * 2 > available_cores()
    assert ("MORE THREADS THAN CORES" in body["threads"]) == crowded
    assert ("WARNING" in log.split("threads:")[0].splitlines()[-1]) == crowded  # logged as a warning
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
    reason = body["device_fallback"]
    assert reason and "printed no reason" not in reason
    if flavor == "onnx":
        assert body["runtime"].endswith("(CPUExecutionProvider)")
    plan = thread_plan(device="cpu", environ={})  # a slot per core, elastic threads
    assert (body["slots"], body["inference_threads"]) == (plan.slots, plan.threads)
    assert plan.slots == available_cores() and body["threads"] == plan.describe()
    assert body["preprocess_workers"] == 1  # a GPU's service decodes on every core
    (warning,) = [line for line in log.splitlines() if "for the GPU (cuda); it runs on the CPU instead" in line]
    assert " WARNING " in warning and warning.endswith(f"Its reason: {reason}")
    assert "on cpu (" in log and "INSTEAD OF THE GPU ASKED FOR (cuda)" in log
    assert answer.status_code == 200


def test_a_service_of_two_processes_answers_from_both_and_its_metrics_add_up(tmp_path, image_b64):
    """SERVICE_PROCESSES=2: two uvicorn workers share the port, each on its share of the cores, and
    /metrics, whichever answers it, counts every prediction of both. Each request opens a new
    connection, so the kernel hands them to both workers; metrics kept per process would give
    different totals from the two. Each process also counts its own share: the requests it
    answered and the connections they came on (a kept-alive one counted once)."""
    port = Ports.found_free().fastapi_onnx
    sent, kept_alive = 16, 5
    with LocalStack([fastapi_service("onnx", port, env={"SERVICE_PROCESSES": "2"})], log_dir=tmp_path) as stack:
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
        log = stack.processes[0].log_path.read_text()
    workers = {str(health["process_id"]) for health in healths}
    assert len(workers) == 2, "both workers answer"
    assert {health["processes"] for health in healths} == {2}
    assert {health["cores"] for health in healths} == {max(1, available_cores() // 2)}
    assert totals == {sent + kept_alive}
    assert "2 process(es)" in log and "(set by SERVICE_PROCESSES=2)" in log
    new_connections = service_stats.diff(url, before, middle).by_process
    assert set(new_connections) == workers, "each live worker shows, an idle one with 0"
    assert sum(counts["requests"] for counts in new_connections.values()) == sent
    assert sum(counts["connections"] for counts in new_connections.values()) == sent, "a connection a request"
    one = service_stats.diff(url, middle, after).by_process
    (serving,) = [counts for counts in one.values() if counts["requests"]]
    assert serving == {"requests": kept_alive, "connections": 1}, "a kept-alive connection stays with its worker"


def predictions_counted(exposition: str) -> float:
    (line,) = [
        line for line in exposition.splitlines() if line.startswith('predict_requests_total{outcome="predicted"')
    ]
    return float(line.split()[-1])


def test_a_bad_device_setting_stops_the_service_with_what_to_do(tmp_path):
    port = Ports.found_free().fastapi_pt
    with pytest.raises(StackError, match="INFERENCE_DEVICE='gpu': use auto, cuda, cpu"):
        LocalStack([fastapi_service("pt", port, env={"INFERENCE_DEVICE": "gpu"})], log_dir=tmp_path).start()


def test_a_bad_thread_setting_stops_the_service_with_what_to_do(tmp_path):
    port = Ports.found_free().fastapi_pt
    with pytest.raises(StackError, match="INFERENCE_THREADS='many' is not a whole number"):
        LocalStack([fastapi_service("onnx", port, env={"INFERENCE_THREADS": "many"})], log_dir=tmp_path).start()


def test_health_says_loudly_when_weights_are_untrained(service_url, built_artifacts):
    """From the record `make artifacts` placed beside the model file each service loads."""
    body = requests.get(f"{service_url}/health", timeout=5).json()
    assert body["weights"] == built_artifacts.weights_info["weights"]
    if body["weights"] == "untrained":
        assert "UNTRAINED" in body["weights_note"]


def test_pytorch_and_onnx_services_agree_on_every_image(fastapi_urls, test_images):
    for raw in test_images:
        payload = {"image": base64.b64encode(raw).decode()}
        answers = [requests.post(f"{fastapi_urls[f]}/predict", json=payload, timeout=30).json() for f in FLAVORS]
        assert answers[0]["prediction"] == answers[1]["prediction"]
        assert answers[0]["probability"] == pytest.approx(answers[1]["probability"], abs=1e-4)
