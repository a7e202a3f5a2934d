"""Unit tests for the GourmetGram web UI (gourmetgram/app.py, gourmetgram/backends.py), with no backend running.

Every app here points its backend at a closed port, so each backend call fails fast with
"connection refused". That is enough to test the page itself: forms, upload validation, limits,
the /test whitelist, error statuses and the weights banner. How the page calls a Triton model is
tested from metadata dicts like the ones Triton reports, and through a stand-in Triton client
that answers from those dicts. Tests against real servers live elsewhere.

Run from the repository root:  .venv/bin/python -m pytest tests/test_gourmetgram_unit.py
GourmetGram imports food11, the model module at the repository root.
"""

from __future__ import annotations

import html
import importlib.util
import io
import socket
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from tritonclient.utils import InferenceServerException

GOURMETGRAM_DIR = Path(__file__).resolve().parents[1] / "gourmetgram"

# app.py imports its sibling backends.py, so its folder goes on sys.path. The
# module itself is loaded under a unique name: other services also have an `app.py`, and a plain
# `import app` could pick up whichever one another test imported first.
sys.path.insert(0, str(GOURMETGRAM_DIR))
_spec = importlib.util.spec_from_file_location("gourmetgram_app", GOURMETGRAM_DIR / "app.py")
assert _spec is not None and _spec.loader is not None
gg = importlib.util.module_from_spec(_spec)
sys.modules["gourmetgram_app"] = gg
_spec.loader.exec_module(gg)
bk = sys.modules["backends"]  # the very module app.py imported
assert Path(bk.__file__).resolve().parent == GOURMETGRAM_DIR

BACKEND_ENV = (
    "FASTAPI_SERVER_URL",
    "TRITON_SERVER_URL",
    "FOOD11_MODEL_NAME",
    "MAX_UPLOAD_BYTES",
    "BACKEND_TIMEOUT_S",
    "WEIGHTS_TIMEOUT_S",
    "WEIGHTS_CACHE_S",
    "SAMPLES_DIR",
)


def closed_port() -> int:
    """A local port nothing listens on: bind to get a free one, then close it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def jpeg_bytes(size: tuple[int, int] = (64, 48)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (200, 120, 40)).save(buffer, format="JPEG")
    return buffer.getvalue()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ignore whatever backend settings the shell running the tests happens to have."""
    for name in BACKEND_ENV:
        monkeypatch.delenv(name, raising=False)


def make_app(**config: Any) -> Any:
    return gg.create_app({"TESTING": True, **config})


BACKEND_CONFIGS = {
    "fastapi": lambda port: {"FASTAPI_SERVER_URL": f"http://127.0.0.1:{port}"},
    "triton": lambda port: {"TRITON_SERVER_URL": f"127.0.0.1:{port}"},
    "triton_onnx": lambda port: {"TRITON_SERVER_URL": f"127.0.0.1:{port}", "FOOD11_MODEL_NAME": "food_classifier_onnx"},
}

# What Triton's GET /v2/models/{model} answers for the lab's two models (max_batch_size 16).
FOOD_CLASSIFIER_METADATA = {
    "name": "food_classifier",
    "versions": ["1"],
    "platform": "python",
    "inputs": [{"name": "INPUT_IMAGE", "datatype": "BYTES", "shape": [-1, 1]}],
    "outputs": [
        {"name": "FOOD_LABEL", "datatype": "BYTES", "shape": [-1, 1]},
        {"name": "PROBABILITY", "datatype": "FP32", "shape": [-1, 1]},
    ],
}
FOOD_CLASSIFIER_ONNX_METADATA = {
    "name": "food_classifier_onnx",
    "versions": ["1"],
    "platform": "onnxruntime_onnx",
    "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 224, 224]}],
    "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, 11]}],
}


@pytest.fixture
def port() -> int:
    return closed_port()


@pytest.fixture
def client(port: int) -> Any:
    return make_app(FASTAPI_SERVER_URL=f"http://127.0.0.1:{port}").test_client()


# --- Pages and upload validation ---------------------------------------------------------------


def test_upload_form_renders(client: Any) -> None:
    response = client.get("/")
    body = response.get_data(as_text=True)
    assert response.status_code == 200
    assert 'enctype="multipart/form-data"' in body
    assert 'action="/predict"' in body
    assert 'type="file" name="file"' in body
    assert "/test?sample=bread.jpg" in body  # the bundled samples are offered


def test_non_image_bytes_are_rejected_with_400(client: Any) -> None:
    response = client.post("/predict", data={"file": (io.BytesIO(b"this is not a picture"), "food.jpg")})
    assert response.status_code == 400
    assert "not an image Pillow can read" in response.get_data(as_text=True)


def test_empty_file_is_rejected_with_400(client: Any) -> None:
    response = client.post("/predict", data={"file": (io.BytesIO(b""), "food.jpg")})
    assert response.status_code == 400
    assert "The image is empty" in response.get_data(as_text=True)


def test_oversize_upload_gets_413_page(port: int) -> None:
    client = make_app(FASTAPI_SERVER_URL=f"http://127.0.0.1:{port}", MAX_UPLOAD_BYTES=2048).test_client()
    response = client.post("/predict", data={"file": (io.BytesIO(b"\xff" * 10_000), "big.jpg")})
    body = response.get_data(as_text=True)
    assert response.status_code == 413
    assert "too large" in body and "2048 bytes" in body
    # A body under the limit is parsed normally (and here refused as not an image, not as too big).
    response = client.post("/predict", data={"file": (io.BytesIO(b"\xff" * 100), "small.jpg")})
    assert response.status_code == 400


def test_missing_file_field_gets_400(client: Any) -> None:
    response = client.post("/predict", data={"other": "value"})
    assert response.status_code == 400
    assert "No file chosen" in response.get_data(as_text=True)


def test_empty_filename_gets_400(client: Any) -> None:
    response = client.post("/predict", data={"file": (io.BytesIO(jpeg_bytes()), "")})
    assert response.status_code == 400
    assert "No file chosen" in response.get_data(as_text=True)


@pytest.mark.parametrize("filename", ["food.exe", "food.svg", "food", "food.jpg.html"])
def test_disallowed_extension_gets_400(client: Any, filename: str) -> None:
    response = client.post("/predict", data={"file": (io.BytesIO(jpeg_bytes()), filename)})
    assert response.status_code == 400
    assert "not accepted" in response.get_data(as_text=True)


def test_displayed_filename_is_sanitised(client: Any) -> None:
    response = client.post("/predict", data={"file": (io.BytesIO(b"nope"), "../../<b>evil</b>.exe")})
    body = response.get_data(as_text=True)
    assert response.status_code == 400
    assert "<b>evil" not in body and "../" not in body


# --- /test and its whitelist -------------------------------------------------------------------


def test_sample_path_traversal_is_404(client: Any) -> None:
    response = client.get("/test", query_string={"sample": "../../etc/passwd"})
    body = response.get_data(as_text=True)
    assert response.status_code == 404
    assert "Valid names: bread.jpg, fried_egg.jpg, soup.jpg" in body
    assert "root:" not in body


def test_unknown_sample_is_404(client: Any) -> None:
    response = client.get("/test", query_string={"sample": "pizza.jpg"})
    assert response.status_code == 404
    assert "No such sample" in response.get_data(as_text=True)


def test_samples_whitelist_lists_only_images(tmp_path: Path) -> None:
    (tmp_path / "a.jpg").write_bytes(jpeg_bytes())
    (tmp_path / "notes.txt").write_text("not an image")
    (tmp_path / "sub.png").mkdir()
    assert list(gg.list_samples(tmp_path)) == ["a.jpg"]
    assert gg.list_samples(tmp_path / "missing") == {}


def test_bundled_samples_are_real_images() -> None:
    samples = gg.list_samples(GOURMETGRAM_DIR / "static" / "samples")
    assert len(samples) >= 3
    for path in samples.values():
        assert gg.food11.decode_image_bytes(path.read_bytes()).size == (512, 384)


# --- Backend down ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(BACKEND_CONFIGS))
def test_backend_unreachable_gives_503_and_app_keeps_serving(kind: str, port: int) -> None:
    client = make_app(**BACKEND_CONFIGS[kind](port)).test_client()
    response = client.get("/test", query_string={"sample": "soup.jpg"})
    body = response.get_data(as_text=True)
    assert response.status_code == 503
    assert f"127.0.0.1:{port}" in body
    assert "make up" in body
    assert "data:image/jpeg;base64," in body  # the image is shown inline, never stored

    # The failure did not take the app down: the form still renders, and an upload fails the same way.
    assert client.get("/").status_code == 200
    response = client.post("/predict", data={"file": (io.BytesIO(jpeg_bytes()), "lunch.png")})
    assert response.status_code == 503
    assert f"127.0.0.1:{port}" in response.get_data(as_text=True)


def test_banner_says_unknown_when_backend_unreachable(client: Any) -> None:
    body = client.get("/").get_data(as_text=True)
    assert "Weights status unknown (backend unreachable)" in body
    assert "not meaningful" in body


def test_healthz_is_200_and_reports_backend_down(client: Any, port: int) -> None:
    response = client.get("/healthz")
    data = response.get_json()
    assert response.status_code == 200
    assert data["status"] == "ok"
    assert data["backend"] == "fastapi"
    assert data["backend_url"] == f"http://127.0.0.1:{port}"
    assert data["backend_reachable"] is False
    assert data["weights"] == "unknown"
    assert "model" in data


def test_healthz_for_triton_names_the_model(port: int) -> None:
    data = make_app(**BACKEND_CONFIGS["triton_onnx"](port)).test_client().get("/healthz").get_json()
    assert data["backend"] == "triton"
    assert data["backend_url"] == f"127.0.0.1:{port}"
    assert data["model"] == "food_classifier_onnx"
    assert data["model_input"] is None  # not known before a request has asked Triton
    assert data["backend_reachable"] is False


def test_healthz_for_fastapi_says_the_page_sends_the_file(client: Any) -> None:
    assert client.get("/healthz").get_json()["model_input"] == "image file (base64)"


# --- Weights banner logic ----------------------------------------------------------------------


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


def test_no_url_defaults_to_local_fastapi() -> None:
    choice = gg.select_backend({})
    assert (choice.kind, choice.url) == ("fastapi", "http://127.0.0.1:8000")


def test_fastapi_url_is_used_and_normalised() -> None:
    assert gg.select_backend({"FASTAPI_SERVER_URL": "http://fastapi:8100/"}).url == "http://fastapi:8100"
    assert gg.select_backend({"FASTAPI_SERVER_URL": "fastapi:8100"}).url == "http://fastapi:8100"


def test_triton_defaults_to_the_python_model_and_strips_scheme() -> None:
    choice = gg.select_backend({"TRITON_SERVER_URL": "http://127.0.0.1:8200/"})
    assert choice == bk.BackendChoice(kind="triton", url="127.0.0.1:8200", model="food_classifier")


@pytest.mark.parametrize("model", ["food_classifier_onnx", "resnet", "a_model_added_later"])
def test_any_triton_model_name_is_accepted_at_start_up(model: str) -> None:
    # Whether Triton has the model, and how to call it, is only known once Triton is asked.
    choice = gg.select_backend({"TRITON_SERVER_URL": "127.0.0.1:8200", "FOOD11_MODEL_NAME": f" {model} "})
    assert choice == bk.BackendChoice(kind="triton", url="127.0.0.1:8200", model=model)


def test_triton_wins_when_both_urls_are_set() -> None:
    choice = gg.select_backend({"TRITON_SERVER_URL": "triton:8000", "FASTAPI_SERVER_URL": "http://fastapi:8000"})
    assert choice.kind == "triton" and choice.url == "triton:8000"


def test_model_name_is_ignored_without_triton() -> None:
    choice = gg.select_backend({"FASTAPI_SERVER_URL": "http://f:1", "FOOD11_MODEL_NAME": "food_classifier_onnx"})
    assert choice.kind == "fastapi"


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
def test_create_app_builds_the_backend_from_env(
    config: str, kind: str, backend_class: str, port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in BACKEND_CONFIGS[config](port).items():
        monkeypatch.setenv(name, value)
    state = gg.create_app().extensions["gourmetgram"]
    assert type(state.backend) is getattr(bk, backend_class)
    assert state.settings.backend.kind == kind


def test_create_app_contacts_no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("create_app must not contact a server")

    monkeypatch.setattr(bk.requests.Session, "request", refuse)
    monkeypatch.setattr(bk.triton_http, "InferenceServerClient", refuse)
    triton = {"TRITON_SERVER_URL": "127.0.0.1:1"}
    for config in ({}, triton, {**triton, "FOOD11_MODEL_NAME": "any_model"}):
        app = gg.create_app(config)
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
    renamed = {
        "name": "food_classifier_v2",
        "inputs": [{"name": "jpeg_b64", "datatype": "BYTES", "shape": [-1, 1]}],
        "outputs": [
            {"name": "top5", "datatype": "BYTES", "shape": [-1, 5]},
            {"name": "score", "datatype": "FP32", "shape": [-1, 1]},
            {"name": "label", "datatype": "BYTES", "shape": [-1, 1]},
        ],
    }
    expected = bk.ImageFileCall("jpeg_b64", label_output="label", probability_output="score")
    assert bk.recognise_model(renamed) == expected
    tensor = {
        "name": "food11_tensorrt",
        "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [-1, 3, 224, 224]}],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 11]}],
    }
    assert bk.recognise_model(tensor) == bk.TensorCall("pixels", logits_output="logits")


@pytest.mark.parametrize(
    "metadata",
    [
        # A third kind of model: token ids in, something else out.
        {
            "name": "text_model",
            "inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [-1, 128]}],
            "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 2]}],
        },
        # The right inputs, but not the outputs the page reads.
        {
            "name": "text_model",
            "inputs": [{"name": "input_ids", "datatype": "BYTES", "shape": [-1, 1]}],
            "outputs": [{"name": "embedding", "datatype": "FP32", "shape": [-1, 512]}],
        },
        {
            "name": "text_model",
            "inputs": [{"name": "input_ids", "datatype": "FP32", "shape": [-1, 3, 224, 224]}],
            "outputs": [{"name": "features", "datatype": "FP32", "shape": [-1, 1000]}],
        },
        # No batch dimension (max_batch_size 0) and a second input: neither shape either.
        {
            "name": "text_model",
            "inputs": [{"name": "input_ids", "datatype": "FP32", "shape": [3, 224, 224]}],
            "outputs": [{"name": "output", "datatype": "FP32", "shape": [11]}],
        },
        {
            "name": "text_model",
            "inputs": [
                {"name": "input_ids", "datatype": "BYTES", "shape": [-1, 1]},
                {"name": "mask", "datatype": "BYTES", "shape": [-1, 1]},
            ],
            "outputs": FOOD_CLASSIFIER_METADATA["outputs"],
        },
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


def test_triton_model_that_failed_to_load_is_reported_as_such(port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeTriton(FOOD_CLASSIFIER_METADATA, unavailable=("food_classifier_onnx",))
    response = triton_app(monkeypatch, port, "food_classifier_onnx", fake).get("/test")
    body = html.unescape(response.get_data(as_text=True))
    assert response.status_code == 502
    assert "has model 'food_classifier_onnx' in its repository but cannot serve it (UNAVAILABLE: load failed)" in body


def test_triton_model_of_another_shape_gets_502_saying_what_it_takes(
    port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    text_model = {
        "name": "text_model",
        "inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [-1, 128]}],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 2]}],
    }
    response = triton_app(monkeypatch, port, "text_model", FakeTriton(text_model)).get("/test")
    body = html.unescape(response.get_data(as_text=True))
    assert response.status_code == 502
    assert "model 'text_model' takes inputs input_ids (INT64 [-1, 128])" in body
    assert "two kinds of model" in body
