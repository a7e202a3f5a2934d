"""The real Triton 2.51 server serving both models, read through its own APIs, and perf_analyzer."""

import base64
import contextlib
import re

import numpy as np
import psutil
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import food11
from servelab.lab.run_accounts import TritonAccount
from servelab.service.cores import available_cores

pytestmark = pytest.mark.integration


@pytest.fixture
def client(triton_http_url) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(triton_http_url)


def _image_inputs(encoded: list[str]):
    inputs = [httpclient.InferInput("INPUT_IMAGE", [len(encoded), 1], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([[item] for item in encoded], dtype=object))
    return inputs


def test_both_models_are_ready(client):
    assert client.is_server_ready()
    for model in ("food_classifier", "food_classifier_onnx"):
        assert client.is_model_ready(model)


def test_model_metadata_shows_what_actually_serves_each_model(client):
    onnx_config = client.get_model_config("food_classifier_onnx")
    # The shipped config says onnxruntime; locally the Python backend serves it, and says so.
    assert onnx_config["backend"] == "python"
    assert "ONNX Runtime" in onnx_config["parameters"]["served_by"]["string_value"]
    assert client.get_model_metadata("food_classifier_onnx")["platform"] == "python"
    for model in ("food_classifier", "food_classifier_onnx"):
        config = client.get_model_config(model)
        assert config["instance_group"][0]["kind"] == "KIND_CPU"
        assert config["max_batch_size"] == 16
        assert config["parameters"]["weights"]["string_value"] in ("trained", "untrained")


def test_food_classifier_batches_a_multi_image_request_and_agrees_with_fastapi(client, fastapi_urls, test_images):
    encoded = [base64.b64encode(raw).decode() for raw in test_images[:4]]
    result = client.infer("food_classifier", _image_inputs(encoded))
    labels = [item.decode() for item in result.as_numpy("FOOD_LABEL").reshape(-1)]
    probabilities = result.as_numpy("PROBABILITY").reshape(-1)
    assert len(labels) == 4 and set(labels) <= set(food11.LABELS)
    assert ((probabilities >= 1 / 11 - 1e-6) & (probabilities <= 1)).all()
    for image, label, probability in zip(encoded, labels, probabilities, strict=True):
        answer = requests.post(f"{fastapi_urls['pt']}/predict", json={"image": image}, timeout=30).json()
        assert answer["prediction"] == label
        assert answer["probability"] == pytest.approx(float(probability), abs=1e-4)


def test_the_model_times_its_decoding_apart_from_its_forward_pass_and_the_lab_reads_both(
    client, triton_http_url, ports, test_images
):
    """model.py's own clock (Triton's custom metric) read around two requests, as the lab's account of
    a run reads it: a request of 4 images decodes 4 images, one after another, where one decodes one."""
    metrics = f"http://127.0.0.1:{ports.triton_metrics}/metrics"
    # An instance's first decoding loads Pillow's decoder (about 10 ms here): not in either reading.
    client.infer("food_classifier", _image_inputs([base64.b64encode(test_images[0]).decode()]))
    per_request = {}
    for count in (1, 4):
        account = TritonAccount(triton_http_url, "food_classifier", None, metrics)
        account.start()
        encoded = [base64.b64encode(raw).decode() for raw in test_images[:count]]
        client.infer("food_classifier", _image_inputs(encoded))
        per_request[count] = account.read()["stage_mean_ms"]
    assert set(per_request[1]) == {"decode", "forward"} and all(ms > 0 for ms in per_request[1].values())
    # Decoding goes image by image: 4 cost more than 2 of one (a loose bound on a busy machine).
    assert per_request[4]["decode"] > 2 * per_request[1]["decode"], per_request
    unclocked = TritonAccount(triton_http_url, "food_classifier_onnx", None, metrics)
    unclocked.start()
    tensor = httpclient.InferInput("input", [1, 3, 224, 224], "FP32")
    tensor.set_data_from_numpy(food11.preprocess(food11.decode_image_bytes(test_images[0]))[None])
    client.infer("food_classifier_onnx", [tensor])
    read = unclocked.read()
    assert read["execution_count"] == 1 and read["stage_mean_ms"] == {}  # a model that times no stages


def test_a_bad_image_fails_only_its_own_request(client, image_b64):
    with pytest.raises(InferenceServerException, match="not an image"):
        client.infer("food_classifier", _image_inputs([base64.b64encode(b"no image here").decode()]))
    result = client.infer("food_classifier", _image_inputs([image_b64]))
    assert result.as_numpy("FOOD_LABEL")[0, 0].decode() in food11.LABELS


def test_onnx_model_over_grpc_matches_the_onnx_fastapi_service(triton_grpc_url, fastapi_urls, test_images):
    client = grpcclient.InferenceServerClient(triton_grpc_url)
    batch = np.stack([food11.preprocess(food11.decode_image_bytes(raw)) for raw in test_images[:3]])
    model_input = grpcclient.InferInput("input", list(batch.shape), "FP32")
    model_input.set_data_from_numpy(batch)
    logits = client.infer("food_classifier_onnx", [model_input]).as_numpy("output")
    assert logits.shape == (3, 11)
    for raw, (label, probability) in zip(test_images[:3], food11.top_prediction(logits), strict=True):
        answer = requests.post(
            f"{fastapi_urls['onnx']}/predict", json={"image": base64.b64encode(raw).decode()}, timeout=30
        ).json()
        assert (answer["prediction"], answer["probability"]) == (label, pytest.approx(probability, abs=1e-4))


def test_unknown_model_is_an_error_not_a_crash(client):
    with pytest.raises(InferenceServerException):
        client.get_model_metadata("no_such_model")
    assert client.is_server_live()


def test_explicit_model_control_reloads_one_model_while_the_other_serves(client, image_b64):
    client.unload_model("food_classifier_onnx")
    assert not client.is_model_ready("food_classifier_onnx")
    assert client.infer("food_classifier", _image_inputs([image_b64])).as_numpy("FOOD_LABEL").shape == (1, 1)
    client.load_model("food_classifier_onnx")
    assert client.is_model_ready("food_classifier_onnx")


def test_each_model_logs_where_its_runtime_runs_it_and_its_threads_from_its_instance_count(model_servers):
    (triton,) = [managed for managed in model_servers.processes if managed.spec.name == "triton"]
    log = triton.log_path.read_text()
    cores = available_cores()
    # What the runtime reports once the model is loaded and has run once: PyTorch's device, ONNX
    # Runtime's provider.
    runs_on = {
        "food_classifier": r"\(torch ",
        "food_sequence": r"\(torch ",
        "food_refine": r"\(onnxruntime \S+ \(CPUExecutionProvider\)\)",
        "food_classifier_onnx": r"\(onnxruntime \S+ \(CPUExecutionProvider\)\)",
    }
    plan = f"{cores} thread(s) each, 1 instance(s) on {cores} core(s) (the cores divided by the instances)"
    for model, where in runs_on.items():
        found = re.search(rf"{model} instance {model}_0_0 on cpu {where}.*, first inference (\S+) ms", log)
        assert found and float(found[1]) > 0, model
        assert re.search(rf"{model} instance .*threads: {re.escape(plan)}", log), model


def test_pytorch_s_threads_wait_without_spinning_in_every_model_s_process(model_servers):
    """Every Python-backend stub (an instance's process) has OpenMP's passive wait: a spinning team
    holds the cores that the other instances, and the rest of the machine, need."""
    (triton,) = [managed for managed in model_servers.processes if managed.spec.name == "triton"]
    stubs = [
        child
        for child in psutil.Process(triton.started_process.pid).children(recursive=True)
        if child.name().startswith("triton_python")
    ]
    waits = {}
    for stub in stubs:
        # An instance of a model that an earlier test reloaded may exit between the listing and this
        # read (seen on a busy machine, 2026-11-28): it has no environment left to check.
        with contextlib.suppress(psutil.NoSuchProcess):
            waits[stub.pid] = stub.environ().get("OMP_WAIT_POLICY")
    assert waits, "the models run in Python-backend stubs, children of tritonserver"
    assert set(waits.values()) == {"PASSIVE"}, waits
