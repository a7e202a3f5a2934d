"""GourmetGram: a small web page in front of the Food-11 classifier.

Upload a food photo, get its Food-11 class. The page does no inference itself: it forwards the
image to a backend chosen by environment variables at start-up (the backends are in backends.py).

    TRITON_SERVER_URL=host:port, FOOD11_MODEL_NAME=<model> (default food_classifier)
        "triton": any model Triton serves whose inputs and outputs have one of the two shapes
        the page knows, recognised from Triton's model metadata on the first request: an image
        file (the page sends the file's bytes, base64-encoded) or a preprocessed tensor (the page
        decodes and preprocesses the image itself and sends a float tensor [1, 3, 224, 224]).
    FASTAPI_SERVER_URL=http://host:port
        "fastapi": the page POSTs {"image": base64} to {url}/predict.

If both URLs are set, Triton wins. If neither is, FASTAPI_SERVER_URL defaults to
http://127.0.0.1:8000. Other settings: MAX_UPLOAD_BYTES (default 8 MiB), BACKEND_TIMEOUT_S
(default 30), WEIGHTS_TIMEOUT_S (2) and WEIGHTS_CACHE_S (10) for the weights banner lookup,
SAMPLES_DIR (default static/samples), HOST (default 0.0.0.0), PORT (default 5000).

Run from this folder with `python app.py`; its image runs it under gunicorn (gunicorn.conf.py).
Decoding and preprocessing come from the model module food11.py (the repository root), installed
in GourmetGram's image as in every service's.
"""

from __future__ import annotations

import base64
import io
import logging
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backends import (
    Backend,
    BackendChoice,
    BackendFailed,
    BackendUnavailable,
    WeightsCache,
    make_backend,
)
from flask import Flask, Response, jsonify, render_template, request
from PIL import Image
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.utils import secure_filename

import food11

log = logging.getLogger("gourmetgram")

HERE = Path(__file__).resolve().parent
DEFAULT_FASTAPI_URL = "http://127.0.0.1:8000"
DEFAULT_TRITON_MODEL = "food_classifier"
ALLOWED_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "webp", "gif", "bmp"})
DEFAULT_MAX_UPLOAD_BYTES = 8 * 1024 * 1024
DEFAULT_BACKEND_TIMEOUT_S = 30.0
# The weights lookup runs while a page renders, so it gets a short timeout and a short cache:
# a dead backend must not make every page wait, and a restarted one is noticed within seconds.
DEFAULT_WEIGHTS_TIMEOUT_S = 2.0
DEFAULT_WEIGHTS_CACHE_S = 10.0
PREVIEW_SIZE = (512, 512)


class ConfigError(ValueError):
    """An environment variable (or create_app config key) has a value the app cannot use."""


# --- Settings ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    backend: BackendChoice
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    backend_timeout_s: float = DEFAULT_BACKEND_TIMEOUT_S
    weights_timeout_s: float = DEFAULT_WEIGHTS_TIMEOUT_S
    weights_cache_s: float = DEFAULT_WEIGHTS_CACHE_S
    samples_dir: Path = HERE / "static" / "samples"


def _setting(source: Mapping[str, Any], name: str) -> str | None:
    """A setting as a stripped string; None, "" and absent all mean "not set"."""
    value = source.get(name)
    if value is None or str(value).strip() == "":
        return None
    return str(value).strip()


def select_backend(source: Mapping[str, Any]) -> BackendChoice:
    """Pick the backend from TRITON_SERVER_URL, FOOD11_MODEL_NAME and FASTAPI_SERVER_URL."""
    triton_url = _setting(source, "TRITON_SERVER_URL")
    if triton_url is not None:
        # tritonclient wants "host:port"; people often paste a URL, so a scheme is tolerated.
        for scheme in ("http://", "https://"):
            if triton_url.startswith(scheme):
                if scheme == "https://":
                    raise ConfigError(f"TRITON_SERVER_URL={triton_url!r}: this app talks plain HTTP to Triton.")
                triton_url = triton_url[len(scheme) :]
        triton_url = triton_url.rstrip("/")
        # Any name: whether Triton has the model, and how to call it, is asked of Triton itself on
        # the first request (Triton may still be starting now), and a wrong name gets a clear page.
        model = _setting(source, "FOOD11_MODEL_NAME") or DEFAULT_TRITON_MODEL
        return BackendChoice(kind="triton", url=triton_url, model=model)
    url = (_setting(source, "FASTAPI_SERVER_URL") or DEFAULT_FASTAPI_URL).rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return BackendChoice(kind="fastapi", url=url, model="food11")


def _positive_number(source: Mapping[str, Any], name: str, default: float, kind: type) -> Any:
    raw = _setting(source, name)
    if raw is None:
        return kind(default)
    try:
        value = kind(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a {kind.__name__}.") from None
    if value <= 0:
        raise ConfigError(f"{name}={raw!r} must be greater than 0.")
    return value


def load_settings(source: Mapping[str, Any]) -> Settings:
    return Settings(
        backend=select_backend(source),
        max_upload_bytes=_positive_number(source, "MAX_UPLOAD_BYTES", DEFAULT_MAX_UPLOAD_BYTES, int),
        backend_timeout_s=_positive_number(source, "BACKEND_TIMEOUT_S", DEFAULT_BACKEND_TIMEOUT_S, float),
        weights_timeout_s=_positive_number(source, "WEIGHTS_TIMEOUT_S", DEFAULT_WEIGHTS_TIMEOUT_S, float),
        weights_cache_s=_positive_number(source, "WEIGHTS_CACHE_S", DEFAULT_WEIGHTS_CACHE_S, float),
        samples_dir=Path(_setting(source, "SAMPLES_DIR") or HERE / "static" / "samples"),
    )


# --- The web app -------------------------------------------------------------------------------


@dataclass
class GourmetGram:
    """Everything a request needs; kept on app.extensions["gourmetgram"] so tests can look at it."""

    settings: Settings
    backend: Backend
    weights: WeightsCache
    samples: dict[str, Path] = field(default_factory=dict)


def list_samples(samples_dir: Path) -> dict[str, Path]:
    """The whitelist /test chooses from: file name -> path, fixed at start-up.

    /test looks a requested name up in this dict and never joins it onto a path, so a name like
    "../../etc/passwd" simply is not found.
    """
    if not samples_dir.is_dir():
        return {}
    return {
        p.name: p
        for p in sorted(samples_dir.iterdir())
        if p.is_file() and p.suffix.lower().lstrip(".") in ALLOWED_EXTENSIONS
    }


def preview_data_url(image: Image.Image) -> str:
    """A small JPEG of the image as a data: URL, for the result page.

    Uploads are never written to disk: no file names to sanitise into paths, nothing to clean
    up, no disk to fill. The page shows a re-encoded thumbnail rather than the upload itself,
    which keeps the page small and sends back only pixels, never the uploaded file's bytes.
    """
    thumbnail = image.copy()
    thumbnail.thumbnail(PREVIEW_SIZE)
    buffer = io.BytesIO()
    thumbnail.save(buffer, format="JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()


def _configure_logging() -> None:
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    """Build the app. `config` entries override environment variables of the same name
    (None or "" unsets one) and are also copied into app.config (e.g. TESTING=True).
    """
    _configure_logging()
    config = dict(config or {})
    source = {**os.environ, **config}
    settings = load_settings(source)
    backend = make_backend(settings.backend, settings.backend_timeout_s, settings.weights_timeout_s)
    weights_cache = WeightsCache(backend, settings.weights_cache_s)
    state = GourmetGram(settings, backend, weights_cache, list_samples(settings.samples_dir))

    app = Flask(__name__)
    app.config.update(config)
    # Flask refuses larger bodies with 413 before they are parsed; the handler below renders it.
    app.config["MAX_CONTENT_LENGTH"] = settings.max_upload_bytes
    app.extensions["gourmetgram"] = state

    choice = settings.backend
    if choice.kind != "fastapi" and _setting(source, "FASTAPI_SERVER_URL"):
        log.info("both TRITON_SERVER_URL and FASTAPI_SERVER_URL are set: Triton wins")
    log.info(
        "backend=%s url=%s model=%s timeout=%gs max_upload=%d bytes samples=%s",
        choice.kind,
        choice.url,
        choice.model,
        settings.backend_timeout_s,
        settings.max_upload_bytes,
        list(state.samples) or "none",
    )

    # Prometheus metrics at /metrics: pages served, and how long the backend took to answer.
    registry = CollectorRegistry()
    # Under gunicorn, each worker process counts its own requests: /metrics adds them all up.
    exposed = registry
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        exposed = CollectorRegistry()
        MultiProcessCollector(exposed)
    pages_served = Counter(
        "gourmetgram_requests", "Requests by page and HTTP status", ["page", "status"], registry=registry
    )
    backend_s = Histogram(
        "gourmetgram_backend_seconds",
        "Time the backend took to answer a prediction, by outcome",
        ["outcome"],
        buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
        registry=registry,
    )

    def page(template: str, status: int, **context: Any) -> tuple[str, int]:
        return render_template(template, **context), status

    def error_page(status: int, title: str, message: str) -> tuple[str, int]:
        return page("error.html", status, title=title, message=message)

    def classify(raw: bytes, name: str, origin: str) -> tuple[str, int]:
        """Validate the bytes, ask the backend, and render the result (or the failure)."""
        try:
            image = food11.decode_image_bytes(raw)
        except food11.InvalidImageError as exc:
            log.info("rejected %s: %s", origin, exc)
            return error_page(400, "That is not an image we can read", str(exc))
        context: dict[str, Any] = {"name": name, "image_url": preview_data_url(image)}
        started = time.perf_counter()
        try:
            prediction = backend.predict(raw, image)
        except BackendUnavailable as exc:
            elapsed_ms = (time.perf_counter() - started) * 1000
            backend_s.labels("unavailable").observe(elapsed_ms / 1000)
            log.warning("backend=%s url=%s unreachable after %.1f ms: %s", choice.kind, choice.url, elapsed_ms, exc)
            state.weights.mark_unreachable(str(exc))
            error = f"The {choice.kind} backend is unavailable: {exc}"
            return page("result.html", 503, error=error, hint=backend.hint, **context)
        except BackendFailed as exc:
            elapsed_ms = (time.perf_counter() - started) * 1000
            backend_s.labels("failed").observe(elapsed_ms / 1000)
            log.warning("backend=%s url=%s failed after %.1f ms: %s", choice.kind, choice.url, elapsed_ms, exc)
            error = f"The {choice.kind} backend answered with an error: {exc}"
            return page("result.html", 502, error=error, hint=backend.hint, **context)
        elapsed_ms = (time.perf_counter() - started) * 1000
        backend_s.labels("predicted").observe(elapsed_ms / 1000)
        state.weights.backend_answered()
        log.info(
            "backend=%s url=%s origin=%s latency=%.1f ms -> %s (%.3f)",
            choice.kind,
            choice.url,
            origin,
            elapsed_ms,
            prediction.label,
            prediction.probability,
        )
        return page(
            "result.html", 200, prediction=prediction, latency_ms=elapsed_ms, model_input=backend.model_input, **context
        )

    @app.context_processor
    def inject_status() -> dict[str, Any]:
        # Every page, error pages included, shows the weights banner and names the backend.
        return {"weights": state.weights.get(), "backend": choice}

    @app.after_request
    def security_headers(response: Any) -> Any:
        # Pages load only our own stylesheet and show images from data: URLs; nothing else.
        response.headers.setdefault("Content-Security-Policy", "default-src 'self'; img-src 'self' data:")
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        return response

    @app.errorhandler(RequestEntityTooLarge)
    def too_large(_: RequestEntityTooLarge) -> tuple[str, int]:
        limit_mib = settings.max_upload_bytes / (1024 * 1024)
        log.info("rejected an upload over %d bytes", settings.max_upload_bytes)
        return error_page(
            413,
            "That file is too large",
            f"Uploads are limited to {limit_mib:.1f} MiB ({settings.max_upload_bytes} bytes). "
            "Choose a smaller image: the model only sees 224x224 pixels anyway.",
        )

    @app.get("/")
    def index() -> tuple[str, int]:
        return page(
            "index.html",
            200,
            samples=list(state.samples),
            extensions=sorted(ALLOWED_EXTENSIONS),
            max_mib=settings.max_upload_bytes / (1024 * 1024),
        )

    @app.post("/predict")
    def predict() -> tuple[str, int]:
        upload = request.files.get("file")
        if upload is None or not upload.filename:
            return error_page(400, "No file chosen", "Choose an image file to upload, then press Classify.")
        # Check the extension on the name as sent: secure_filename may drop the dot of "食事.jpg".
        extension = upload.filename.rsplit(".", 1)[-1].lower() if "." in upload.filename else ""
        name = secure_filename(upload.filename) or "upload"
        if extension not in ALLOWED_EXTENSIONS:
            return error_page(
                400,
                "That file type is not accepted",
                f"'{name}' does not end in one of: {', '.join(sorted(ALLOWED_EXTENSIONS))}.",
            )
        return classify(upload.read(), name, origin=f"upload {name}")

    @app.get("/test")
    def test_sample() -> tuple[str, int]:
        if not state.samples:
            return error_page(404, "No samples bundled", "Run `python gourmetgram/make_samples.py` to draw them.")
        name = request.args.get("sample", next(iter(state.samples)))
        path = state.samples.get(name)
        if path is None:
            return error_page(
                404,
                "No such sample",
                f"There is no sample named '{secure_filename(name) or '?'}'. Valid names: {', '.join(state.samples)}.",
            )
        return classify(path.read_bytes(), name, origin=f"sample {name}")

    @app.after_request
    def count_page(response: Any) -> Any:
        pages_served.labels(request.endpoint or "unknown", str(response.status_code)).inc()
        return response

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(exposed), content_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    def healthz() -> Any:
        # Always 200: this reports on the page itself; the backend's state is in the fields.
        weights = state.weights.get()
        # model_input is null until the first prediction has asked Triton how to call the model.
        return jsonify(
            status="ok",
            backend=choice.kind,
            backend_url=choice.url,
            model=choice.model,
            model_input=backend.model_input,
            backend_reachable=weights.reachable,
            weights=weights.weights,
            weights_note=weights.note,
        )

    return app


_app: Flask | None = None


def __getattr__(name: str) -> Any:
    """Build the module-level `app` on first use (PEP 562).

    `flask --app app run` and WSGI servers (`gunicorn app:app`) look up `app`; building it only
    then keeps `import app` free of side effects, so tests can call create_app themselves.
    """
    global _app
    if name == "app":
        if _app is None:
            _app = create_app()
        return _app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    try:
        web_app = create_app()
    except ConfigError as exc:
        sys.exit(f"gourmetgram: {exc}")
    web_app.run(host=os.environ.get("HOST", "0.0.0.0"), port=int(os.environ.get("PORT", "5000")))
