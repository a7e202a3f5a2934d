"""GourmetGram's app (gourmetgram/app.py) and its backends (gourmetgram/backends.py), loaded for the
unit tests, with no backend running: an app whose backend is a closed port fails each backend call
fast with "connection refused", and Triton's model metadata is given as Triton reports it.
GourmetGram imports food11, the model module at the repository root."""

from __future__ import annotations

import importlib.util
import io
import sys
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from servelab import paths

GOURMETGRAM_DIR = paths.REPO_ROOT / "gourmetgram"

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


def forget_backend_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ignore whatever backend settings the shell running the tests happens to have."""
    for name in BACKEND_ENV:
        monkeypatch.delenv(name, raising=False)


def jpeg_bytes(size: tuple[int, int] = (64, 48)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (200, 120, 40)).save(buffer, format="JPEG")
    return buffer.getvalue()


def make_app(**config: Any) -> Any:
    """The app with `config` as its only backend settings (None unsets a variable of the shell's)."""
    return gg.create_app({"TESTING": True, **dict.fromkeys(BACKEND_ENV), **config})


BACKEND_CONFIGS = {
    "fastapi": lambda port: {"FASTAPI_SERVER_URL": f"http://127.0.0.1:{port}"},
    "triton": lambda port: {"TRITON_SERVER_URL": f"127.0.0.1:{port}"},
    "triton_onnx": lambda port: {"TRITON_SERVER_URL": f"127.0.0.1:{port}", "FOOD11_MODEL_NAME": "food_classifier_onnx"},
}


def tensor(name: str, datatype: str, *shape: int) -> dict[str, Any]:
    """One input or output of a model, as Triton's metadata describes it."""
    return {"name": name, "datatype": datatype, "shape": list(shape)}


def model(name: str, inputs: list[dict[str, Any]], outputs: list[dict[str, Any]]) -> dict[str, Any]:
    """A model's metadata, as Triton's GET /v2/models/{model} answers."""
    return {"name": name, "versions": ["1"], "inputs": inputs, "outputs": outputs}


# The lab's two models (max_batch_size 16).
FOOD_CLASSIFIER_METADATA = model(
    "food_classifier",
    [tensor("INPUT_IMAGE", "BYTES", -1, 1)],
    [tensor("FOOD_LABEL", "BYTES", -1, 1), tensor("PROBABILITY", "FP32", -1, 1)],
)
FOOD_CLASSIFIER_ONNX_METADATA = model(
    "food_classifier_onnx", [tensor("input", "FP32", -1, 3, 224, 224)], [tensor("output", "FP32", -1, 11)]
)
