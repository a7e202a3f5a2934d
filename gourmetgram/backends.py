"""GourmetGram's backends: how the page asks a model server to classify an image.

    FastAPIBackend ("fastapi"): POSTs {"image": base64} to {FASTAPI_SERVER_URL}/predict.
    TritonBackend ("triton"): KServe v2 HTTP to Triton. It knows no model by name: on the first
        request it reads the model's metadata (GET /v2/models/{model}) and recognises one of two
        request shapes (triton_calls.recognise_model):
        "image file (base64)": one BYTES input [-1, 1]; the page sends the file's bytes,
            base64-encoded, and reads a BYTES label and an FP32 probability back;
        "preprocessed tensor": one FP32 input [-1, 3, 224, 224]; the page decodes and
            preprocesses the image itself (food11.preprocess) and turns the FP32 [-1, 11] logits
            into a label and a probability (food11.top_prediction).
        Any other model, or one Triton does not have, is refused at request time with a message
        that says what the model takes, or which models Triton has.

Failures surface as BackendUnavailable (the page answers 503) or BackendFailed (502). Each backend
also reports whether its weights are trained, for the banner every page shows. No Flask here:
app.py chooses the backend from its settings and turns these results into pages. What a backend
answers is in answers.py; how a Triton model is called, in triton_calls.py.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote

import requests
import tritonclient.http as triton_http
from answers import BackendFailed, BackendUnavailable, Prediction, WeightsStatus
from PIL import Image
from triton_calls import IMAGE_FILE, PREPROCESSED_TENSOR, ImageFileCall, ModelCall, TensorCall, recognise_model
from tritonclient.utils import InferenceServerException

# What app.py and the tests take from here: the backends, and what they answer and call.
__all__ = [
    "IMAGE_FILE",
    "PREPROCESSED_TENSOR",
    "Backend",
    "BackendChoice",
    "BackendFailed",
    "BackendUnavailable",
    "FastAPIBackend",
    "ImageFileCall",
    "Prediction",
    "TensorCall",
    "TritonBackend",
    "WeightsCache",
    "WeightsStatus",
    "make_backend",
    "recognise_model",
]

log = logging.getLogger("gourmetgram.backends")

T = TypeVar("T")


@dataclass(frozen=True)
class BackendChoice:
    kind: str  # "fastapi" or "triton"
    url: str  # fastapi: "http://host:port"; triton: "host:port", as tritonclient wants it
    model: str  # triton: the model name, any name Triton may have; fastapi: "food11"


# --- Backends ----------------------------------------------------------------------------------


@dataclass
class Backend:
    """How to classify an image, and how to ask about weights, for one kind of backend."""

    choice: BackendChoice
    timeout_s: float
    weights_timeout_s: float
    hint: str = ""

    @property
    def model_input(self) -> str | None:
        """What the page sends the model (IMAGE_FILE or PREPROCESSED_TENSOR); None until known."""
        raise NotImplementedError

    def predict(self, raw: bytes, image: Image.Image) -> Prediction:
        raise NotImplementedError

    def fetch_weights(self) -> WeightsStatus:
        raise NotImplementedError

    def _weights_from_http(self, url: str, what: str) -> WeightsStatus:
        """GET a JSON document that describes the weights; any failure means "unknown"."""
        try:
            response = requests.get(url, timeout=self.weights_timeout_s)
        except requests.RequestException as exc:
            return WeightsStatus("unknown", f"could not reach {url} ({type(exc).__name__}).", reachable=False)
        if response.status_code != 200:
            return WeightsStatus("unknown", f"{what} answered HTTP {response.status_code}.", reachable=True)
        try:
            return self._parse_weights(response.json())
        except (ValueError, AttributeError, TypeError):
            return WeightsStatus("unknown", f"{what} did not answer with the JSON expected.", reachable=True)

    def _parse_weights(self, body: Any) -> WeightsStatus:
        raise NotImplementedError


class FastAPIBackend(Backend):
    @property
    def model_input(self) -> str | None:
        return IMAGE_FILE

    def predict(self, raw: bytes, image: Image.Image) -> Prediction:
        url = f"{self.choice.url}/predict"
        try:
            response = requests.post(url, json={"image": base64.b64encode(raw).decode()}, timeout=self.timeout_s)
        # ConnectTimeout is both a Timeout and a ConnectionError; either way the answer is 503.
        except requests.Timeout as exc:
            raise BackendUnavailable(f"{url} did not answer within {self.timeout_s:g} s.") from exc
        except requests.ConnectionError as exc:
            raise BackendUnavailable(f"could not connect to {url} ({type(exc).__name__}).") from exc
        except requests.RequestException as exc:
            raise BackendFailed(f"request to {url} failed ({type(exc).__name__}: {exc}).") from exc
        if response.status_code != 200:
            try:
                detail = response.json().get("detail", response.text[:300])
            except (ValueError, AttributeError):
                detail = response.text[:300]
            error = BackendUnavailable if response.status_code == 503 else BackendFailed
            raise error(f"{url} answered HTTP {response.status_code}: {detail}")
        try:
            body = response.json()
            return Prediction(label=str(body["prediction"]), probability=float(body["probability"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise BackendFailed(f"{url} answered 200 without 'prediction' and 'probability'.") from exc

    def fetch_weights(self) -> WeightsStatus:
        return self._weights_from_http(f"{self.choice.url}/health", "FastAPI /health")

    def _parse_weights(self, body: Any) -> WeightsStatus:
        weights, note = body.get("weights"), str(body.get("weights_note", ""))
        if weights not in ("trained", "untrained"):
            weights, note = "unknown", note or "/health has no 'weights' field."
        return WeightsStatus(weights, note, reachable=True)


@dataclass
class TritonBackend(Backend):
    """Triton over KServe v2 HTTP; how to call the model is read from the model's own metadata."""

    # Looked up on the first request, not at start-up: Triton may still be loading when the page
    # starts. Only a recognised model is remembered, so every failure is retried on the next request.
    _call: ModelCall | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @property
    def model_input(self) -> str | None:
        call = self._call
        return None if call is None else call.takes

    def predict(self, raw: bytes, image: Image.Image) -> Prediction:
        call = self._model_call()
        inputs = call.inputs(raw, image)
        outputs = [triton_http.InferRequestedOutput(name) for name in call.outputs]
        try:
            result = self._with_client(lambda client: client.infer(self.choice.model, inputs, outputs=outputs))
        except InferenceServerException as exc:
            # The model may have been reloaded with other inputs: read its metadata again next time.
            self._forget(call)
            raise BackendFailed(
                f"Triton at {self.choice.url} refused model '{self.choice.model}': {exc.message()}"
            ) from exc
        return call.prediction(result, self.choice.model)

    def _model_call(self) -> ModelCall:
        # The lock is held during the lookup so that concurrent first requests ask Triton once.
        with self._lock:
            if self._call is None:
                self._call = recognise_model(self._with_client(self._read_metadata))
                log.info("model=%s model_input=%s call=%s", self.choice.model, self._call.takes, self._call)
            return self._call

    def _forget(self, call: ModelCall) -> None:
        with self._lock:
            if self._call is call:
                self._call = None

    def _read_metadata(self, client: Any) -> dict[str, Any]:
        try:
            return client.get_model_metadata(self.choice.model)
        except InferenceServerException as exc:
            raise BackendFailed(self._explain_missing_model(client, exc)) from exc

    def _explain_missing_model(self, client: Any, exc: InferenceServerException) -> str:
        """Triton has no such model, or cannot serve it: say which models it has, and what to set."""
        model, url = self.choice.model, self.choice.url
        try:
            index = client.get_model_repository_index()  # one entry per model version
        except InferenceServerException:
            index = []
        entries = [entry for entry in index if isinstance(entry, dict) and entry.get("name")]
        mine = [entry for entry in entries if entry["name"] == model]
        if mine:  # in the repository, but not loaded (it failed to load, or was unloaded)
            state = ", ".join(f"{e.get('state', '?')}{': ' + e['reason'] if e.get('reason') else ''}" for e in mine)
            return (
                f"Triton at {url} has model '{model}' in its repository but cannot serve it ({state}). "
                "Triton's log says why."
            )
        available = ", ".join(sorted({entry["name"] for entry in entries})) or "none"
        return (
            f"Triton at {url} has no model '{model}' ({exc.message()}). Models in its repository: {available}. "
            "Set FOOD11_MODEL_NAME to one of them."
        )

    def _with_client(self, action: Callable[[Any], T]) -> T:
        # One client per call: a tritonclient.http client is not safe to share between the
        # threads Flask serves requests on, and opening a local connection costs well under 1 ms.
        try:
            client = triton_http.InferenceServerClient(
                self.choice.url, connection_timeout=self.timeout_s, network_timeout=self.timeout_s
            )
            try:
                return action(client)
            finally:
                client.close()
        except TimeoutError as exc:
            raise BackendUnavailable(
                f"Triton at {self.choice.url} did not answer within {self.timeout_s:g} s."
            ) from exc
        except OSError as exc:  # connection refused, unknown host, reset
            raise BackendUnavailable(
                f"could not connect to Triton at {self.choice.url} ({type(exc).__name__})."
            ) from exc

    def fetch_weights(self) -> WeightsStatus:
        # The model config carries the weights record as parameters, set when the model was staged.
        model = quote(self.choice.model, safe="")
        return self._weights_from_http(f"http://{self.choice.url}/v2/models/{model}/config", "Triton model config")

    def _parse_weights(self, body: Any) -> WeightsStatus:
        parameters = body.get("parameters") or {}
        weights = (parameters.get("weights") or {}).get("string_value")
        note = (parameters.get("weights_note") or {}).get("string_value", "")
        if weights not in ("trained", "untrained"):
            weights, note = "unknown", note or "the model config has no 'weights' parameter."
        return WeightsStatus(weights, note, reachable=True)


def make_backend(choice: BackendChoice, timeout_s: float, weights_timeout_s: float) -> Backend:
    if choice.kind == "fastapi":
        cls: type[Backend] = FastAPIBackend
        hint = (
            f"Is the FastAPI service running at {choice.url}? Start the lab with `make up`, "
            "or point FASTAPI_SERVER_URL at the service."
        )
    else:
        cls = TritonBackend
        hint = (
            f"Is Triton running at {choice.url} with model '{choice.model}' loaded? Start the lab with `make up`, "
            "or point TRITON_SERVER_URL at the server and FOOD11_MODEL_NAME at the model."
        )
    return cls(choice=choice, timeout_s=timeout_s, weights_timeout_s=weights_timeout_s, hint=hint)


class WeightsCache:
    """Remembers the backend's weights status for a few seconds, so pages do not ask every time."""

    def __init__(self, backend: Backend, ttl_s: float) -> None:
        self._backend, self._ttl_s = backend, ttl_s
        self._lock = threading.Lock()
        self._status: WeightsStatus | None = None
        self._expires = 0.0

    def get(self) -> WeightsStatus:
        # The lock is held during the lookup on purpose: concurrent pages wait for one answer
        # rather than all asking a possibly dead backend at once.
        with self._lock:
            if self._status is None or time.monotonic() >= self._expires:
                self._remember(self._backend.fetch_weights())
            assert self._status is not None
            return self._status

    def mark_unreachable(self, reason: str) -> None:
        """A prediction just failed to connect: say so at once instead of after the cache expires."""
        with self._lock:
            self._remember(WeightsStatus("unknown", reason, reachable=False))

    def backend_answered(self) -> None:
        """A prediction just succeeded: a remembered "unreachable" is stale, so ask again."""
        with self._lock:
            if self._status is not None and not self._status.reachable:
                self._status = None

    def _remember(self, status: WeightsStatus) -> None:
        if status != self._status:
            log.info("backend weights: %s (reachable=%s) %s", status.weights, status.reachable, status.note)
        self._status, self._expires = status, time.monotonic() + self._ttl_s
