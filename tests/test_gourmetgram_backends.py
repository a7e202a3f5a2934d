"""GourmetGram's backends (tests/helpers/gourmetgram.py): the weights banner, the choice of backend
from the settings, and how the page calls a Triton model, recognised from the model's metadata as
Triton reports it, through a stand-in Triton client that answers from that metadata."""

from __future__ import annotations

import html
from typing import Any

import numpy as np
import pytest
from PIL import Image
from tritonclient.utils import InferenceServerException

from tests.helpers import closed_port
from tests.helpers.gourmetgram import (
    BACKEND_CONFIGS,
    FOOD_CLASSIFIER_METADATA,
    FOOD_CLASSIFIER_ONNX_METADATA,
    bk,
    forget_backend_env,
    gg,
    jpeg_bytes,
    make_app,
    model,
    tensor,
)


@pytest.fixture
def port() -> int:
    return closed_port()


def test_banner_text_for_each_weights_status() -> None:
    assert bk.WeightsStatus("trained", "", reachable=True).banner is None
    untrained = bk.WeightsStatus("untrained", "Seeded, never trained: labels are not meaningful.", True).banner
    assert untrained == "Seeded, never trained: labels are not meaningful."  # the backend's note, once
    assert "not meaningful" in bk.WeightsStatus("untrained", "", reachable=True).banner
    unreported = bk.WeightsStatus("unknown", "", reachable=True).banner
    assert unreported is not None and "did not say" in unreported and "not meaningful" in unreported


def backend_for(source: dict[str, str]) -> Any:
    settings = gg.load_settings(source)
    return bk.make_backend(settings.backend, settings.backend_timeout_s, settings.weights_timeout_s)


def test_weights_parsed_from_fastapi_health_and_triton_config() -> None:
    fastapi = backend_for({})
    untrained = fastapi._parse_weights({"weights": "untrained", "weights_note": "n"})
    assert untrained == bk.WeightsStatus("untrained", "n", True)
    assert fastapi._parse_weights({"status": "ready"}).weights == "unknown"

    triton = backend_for({"TRITON_SERVER_URL": "localhost:8200"})
    config = {
        "name": "food_classifier",
        "parameters": {"weights": {"string_value": "trained"}, "weights_note": {"string_value": "Food-11 fine-tuned"}},
    }
    assert triton._parse_weights(config) == bk.WeightsStatus("trained", "Food-11 fine-tuned", True)
    assert triton._parse_weights({"name": "food_classifier"}).weights == "unknown"
    assert triton._parse_weights({"parameters": {"weights": {"string_value": "bogus"}}}).weights == "unknown"


class CountingBackend:
    """Stands in for a Backend in WeightsCache: counts lookups, contacts nothing."""

    def __init__(self) -> None:
        self.calls = 0

    def fetch_weights(self) -> Any:
        self.calls += 1
        return bk.WeightsStatus("untrained", "", reachable=True)


def test_weights_cache_asks_once_within_ttl_and_unreachable_overrides() -> None:
    backend = CountingBackend()
    cache = bk.WeightsCache(backend, ttl_s=60)  # type: ignore[arg-type]
    assert cache.get().weights == "untrained"
    assert cache.get().weights == "untrained"
    assert backend.calls == 1
    cache.mark_unreachable("connection refused")
    assert cache.get().reachable is False
    assert backend.calls == 1
    cache.backend_answered()  # a prediction succeeded: "unreachable" is stale, ask again
    assert cache.get().reachable is True
    assert backend.calls == 2
    cache.backend_answered()  # while reachable, the cached answer stands
    cache.get()
    assert backend.calls == 2
    expired = bk.WeightsCache(backend, ttl_s=1e-9)  # type: ignore[arg-type]
    expired.get()
    expired.get()
    assert backend.calls == 4


# --- Backend selection -------------------------------------------------------------------------


TRITON = "127.0.0.1:8200"


@pytest.mark.parametrize(
    ("source", "choice"),
    [
        ({}, ("fastapi", "http://127.0.0.1:8000", "food11")),
        ({"FASTAPI_SERVER_URL": "http://fastapi:8100/"}, ("fastapi", "http://fastapi:8100", "food11")),
        ({"FASTAPI_SERVER_URL": "fastapi:8100"}, ("fastapi", "http://fastapi:8100", "food11")),
        ({"FASTAPI_SERVER_URL": "http://f:1", "FOOD11_MODEL_NAME": "resnet"}, ("fastapi", "http://f:1", "food11")),
        ({"TRITON_SERVER_URL": f"http://{TRITON}/"}, ("triton", TRITON, "food_classifier")),
        ({"TRITON_SERVER_URL": TRITON, "FASTAPI_SERVER_URL": "http://f:1"}, ("triton", TRITON, "food_classifier")),
        # Any name: whether Triton has the model, and how to call it, is only known once Triton is asked.
        *[
            ({"TRITON_SERVER_URL": TRITON, "FOOD11_MODEL_NAME": f" {model} "}, ("triton", TRITON, model))
            for model in ("food_classifier_onnx", "resnet", "a_model_added_later")
        ],
    ],
)
def test_the_backend_is_triton_if_its_url_is_set_else_fastapi(source: dict[str, str], choice: tuple) -> None:
    assert gg.select_backend(source) == bk.BackendChoice(*choice)


@pytest.mark.parametrize(
    "source",
    [
        {"TRITON_SERVER_URL": "https://t:8000"},
        {"MAX_UPLOAD_BYTES": "lots"},
        {"BACKEND_TIMEOUT_S": "0"},
    ],
)
def test_bad_settings_raise_config_error(source: dict[str, str]) -> None:
    with pytest.raises(gg.ConfigError):
        gg.load_settings(source)


@pytest.mark.parametrize(
    ("config", "kind", "backend_class"),
    [
        ("fastapi", "fastapi", "FastAPIBackend"),
        ("triton", "triton", "TritonBackend"),
        ("triton_onnx", "triton", "TritonBackend"),
    ],
)
def test_create_app_builds_the_backend_from_env_and_contacts_no_server(
    config: str, kind: str, backend_class: str, port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("create_app must not contact a server")

    monkeypatch.setattr(bk.requests.Session, "request", refuse)
    monkeypatch.setattr(bk.triton_http, "InferenceServerClient", refuse)
    forget_backend_env(monkeypatch)
    for name, value in BACKEND_CONFIGS[config](port).items():
        monkeypatch.setenv(name, value)
    app = gg.create_app()
    state = app.extensions["gourmetgram"]
    assert type(state.backend) is getattr(bk, backend_class) and state.settings.backend.kind == kind
    assert app.config["MAX_CONTENT_LENGTH"] == 8 * 1024 * 1024
    assert "_app" in vars(gg) and gg._app is None  # the module-level app is built only on demand


# --- How the page calls a Triton model, from the model's metadata ------------------------------


def test_the_python_model_is_recognised_as_taking_an_image_file() -> None:
    call = bk.recognise_model(FOOD_CLASSIFIER_METADATA)
    assert call == bk.ImageFileCall("INPUT_IMAGE", label_output="FOOD_LABEL", probability_output="PROBABILITY")
    assert call.takes == "image file (base64)"
    [sent] = call.inputs(jpeg_bytes(), Image.new("RGB", (8, 8)))
    assert (sent.name(), sent.datatype(), sent.shape()) == ("INPUT_IMAGE", "BYTES", [1, 1])


def test_the_onnx_model_is_recognised_as_taking_a_preprocessed_tensor() -> None:
    call = bk.recognise_model(FOOD_CLASSIFIER_ONNX_METADATA)
    assert call == bk.TensorCall("input", logits_output="output")
    assert call.takes == "preprocessed tensor"
    [sent] = call.inputs(jpeg_bytes(), Image.new("RGB", (300, 200)))
    assert (sent.name(), sent.datatype(), sent.shape()) == ("input", "FP32", [1, 3, 224, 224])


def test_recognition_goes_by_datatype_and_shape_not_by_name() -> None:
    # A model added later, with its own tensor names and an extra output the page does not read.
    outputs = [tensor("top5", "BYTES", -1, 5), tensor("score", "FP32", -1, 1), tensor("label", "BYTES", -1, 1)]
    renamed = model("food_classifier_v2", [tensor("jpeg_b64", "BYTES", -1, 1)], outputs)
    expected = bk.ImageFileCall("jpeg_b64", label_output="label", probability_output="score")
    assert bk.recognise_model(renamed) == expected
    pixels = model("food11_tensorrt", [tensor("pixels", "FP32", -1, 3, 224, 224)], [tensor("logits", "FP32", -1, 11)])
    assert bk.recognise_model(pixels) == bk.TensorCall("pixels", logits_output="logits")


# A third kind of model: token ids in, something else out.
TEXT_MODEL = model("text_model", [tensor("input_ids", "INT64", -1, 128)], [tensor("logits", "FP32", -1, 2)])


@pytest.mark.parametrize(
    "metadata",
    [
        TEXT_MODEL,
        # The right inputs, but not the outputs the page reads.
        model("text_model", [tensor("input_ids", "BYTES", -1, 1)], [tensor("embedding", "FP32", -1, 512)]),
        model("text_model", [tensor("input_ids", "FP32", -1, 3, 224, 224)], [tensor("features", "FP32", -1, 1000)]),
        # No batch dimension (max_batch_size 0) and a second input: neither shape either.
        model("text_model", [tensor("input_ids", "FP32", 3, 224, 224)], [tensor("output", "FP32", 11)]),
        model(
            "text_model",
            [tensor("input_ids", "BYTES", -1, 1), tensor("mask", "BYTES", -1, 1)],
            FOOD_CLASSIFIER_METADATA["outputs"],
        ),
    ],
)
def test_a_model_of_another_shape_is_refused_with_what_it_takes(metadata: dict[str, Any]) -> None:
    with pytest.raises(bk.BackendFailed) as refused:
        bk.recognise_model(metadata)
    message = str(refused.value)
    assert "model 'text_model' takes inputs input_ids (" in message
    first = metadata["inputs"][0]
    assert f"input_ids ({first['datatype']} {first['shape']})" in message
    # ...and says which two kinds of model the page can call.
    assert "two kinds of model" in message
    assert "BYTES input of shape [-1, 1]" in message and "FP32 input of shape [-1, 3, 224, 224]" in message


class FakeTriton:
    """Stands in for tritonclient.http.InferenceServerClient: answers from metadata dicts, counts calls."""

    def __init__(self, *models: dict[str, Any], unavailable: tuple[str, ...] = ()) -> None:
        self.models = {model["name"]: model for model in models}
        self.unavailable = unavailable  # in the repository, but failed to load
        self.metadata_calls = 0
        self.sent: list[Any] = []

    def __call__(self, url: str, **kwargs: Any) -> FakeTriton:  # the constructor's place
        return self

    def get_model_metadata(self, model: str) -> dict[str, Any]:
        self.metadata_calls += 1
        if model not in self.models:
            raise InferenceServerException(f"Request for unknown model: '{model}' is not found", status="400")
        return self.models[model]

    def get_model_repository_index(self) -> list[dict[str, Any]]:
        ready = [{"name": name, "version": "1", "state": "READY"} for name in self.models]
        failed = [
            {"name": name, "version": "1", "state": "UNAVAILABLE", "reason": "load failed"} for name in self.unavailable
        ]
        return ready + failed

    def infer(self, model: str, inputs: list[Any], outputs: list[Any]) -> Any:
        self.sent = inputs
        if inputs[0].datatype() == "BYTES":
            return FakeResult({"FOOD_LABEL": np.array([[b"Soup"]], dtype=object), "PROBABILITY": np.array([[0.75]])})
        logits = np.zeros((1, 11), dtype=np.float32)
        logits[0, 3] = 5.0  # Egg
        return FakeResult({"output": logits})

    def close(self) -> None:
        pass


class FakeResult:
    def __init__(self, arrays: dict[str, Any]) -> None:
        self.arrays = arrays

    def as_numpy(self, name: str) -> Any:
        return self.arrays.get(name)


def triton_app(monkeypatch: pytest.MonkeyPatch, port: int, model: str, fake: FakeTriton) -> Any:
    """An app whose Triton client is `fake`; the weights lookup still goes to the closed port."""
    monkeypatch.setattr(bk.triton_http, "InferenceServerClient", fake)
    return make_app(TRITON_SERVER_URL=f"127.0.0.1:{port}", FOOD11_MODEL_NAME=model).test_client()


@pytest.mark.parametrize(
    ("model", "takes", "label", "sent"),
    [
        ("food_classifier", "image file (base64)", "Soup", ("INPUT_IMAGE", "BYTES", [1, 1])),
        ("food_classifier_onnx", "preprocessed tensor", "Egg", ("input", "FP32", [1, 3, 224, 224])),
    ],
)
def test_triton_model_is_looked_up_on_the_first_request_and_remembered(
    model: str, takes: str, label: str, sent: tuple[Any, ...], port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeTriton(FOOD_CLASSIFIER_METADATA, FOOD_CLASSIFIER_ONNX_METADATA)
    client = triton_app(monkeypatch, port, model, fake)
    assert client.get("/healthz").get_json()["model_input"] is None
    assert fake.metadata_calls == 0  # start-up and /healthz do not ask Triton about the model

    for _ in range(2):
        response = client.get("/test", query_string={"sample": "soup.jpg"})
        body = response.get_data(as_text=True)
        assert response.status_code == 200, body
        assert f"<h1>{label}</h1>" in body
        assert "answered by triton" in body and f"request: {takes}" in body
    assert fake.metadata_calls == 1
    [tensor] = fake.sent
    assert (tensor.name(), tensor.datatype(), tensor.shape()) == sent
    data = client.get("/healthz").get_json()
    assert (data["backend"], data["model"], data["model_input"]) == ("triton", model, takes)


def test_unknown_triton_model_gets_502_naming_it_and_the_models_triton_has(
    port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeTriton(FOOD_CLASSIFIER_METADATA, FOOD_CLASSIFIER_ONNX_METADATA)
    client = triton_app(monkeypatch, port, "no_such_model", fake)
    for _ in range(2):  # nothing bad is remembered: each request asks again, and gets the same answer
        response = client.get("/test", query_string={"sample": "soup.jpg"})
        body = html.unescape(response.get_data(as_text=True))
        assert response.status_code == 502
        assert "has no model 'no_such_model'" in body
        assert "Models in its repository: food_classifier, food_classifier_onnx." in body
        assert "Set FOOD11_MODEL_NAME" in body
    assert fake.metadata_calls == 2
    assert client.get("/").status_code == 200
    assert client.get("/healthz").get_json()["model_input"] is None


@pytest.mark.parametrize(
    ("model", "fake", "says"),
    [
        (
            "food_classifier_onnx",
            FakeTriton(FOOD_CLASSIFIER_METADATA, unavailable=("food_classifier_onnx",)),
            "has model 'food_classifier_onnx' in its repository but cannot serve it (UNAVAILABLE: load failed)",
        ),
        ("text_model", FakeTriton(TEXT_MODEL), "model 'text_model' takes inputs input_ids (INT64 [-1, 128])"),
    ],
    ids=["failed-to-load", "another-shape"],
)
def test_a_triton_model_the_page_cannot_call_gets_502_saying_why(
    model: str, fake: FakeTriton, says: str, port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    response = triton_app(monkeypatch, port, model, fake).get("/test")
    assert response.status_code == 502 and says in html.unescape(response.get_data(as_text=True))
