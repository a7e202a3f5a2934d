"""Food-11 classifier served with ONNX Runtime behind FastAPI.

Run: uvicorn app:app --host 0.0.0.0 --port 8000   (from this folder, after `make artifacts`)
"""

import logging
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
from predict_api import ServedModel, create_app

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

MODEL_PATH = Path(os.environ.get("FOOD11_MODEL_PATH", Path(__file__).parent / "food11.onnx"))
if not MODEL_PATH.is_file():
    raise SystemExit(f"{MODEL_PATH} is missing: run `make artifacts` in the repository root to build it.")

# Chosen once at start-up: CUDA when this ONNX Runtime build has it (the onnxruntime-gpu
# package on a GPU node), the CPU otherwise.
providers = ["CPUExecutionProvider"]
if "CUDAExecutionProvider" in ort.get_available_providers():
    providers.insert(0, "CUDAExecutionProvider")
session = ort.InferenceSession(str(MODEL_PATH), providers=providers)
active_provider = session.get_providers()[0]


def run_model(batch: np.ndarray) -> np.ndarray:
    return session.run(["output"], {"input": batch})[0]


app = create_app(
    ServedModel(
        model_file=MODEL_PATH,
        runtime=f"onnxruntime {ort.__version__} ({active_provider})",
        device="cuda" if active_provider == "CUDAExecutionProvider" else "cpu",
        run=run_model,
    ),
    title="Food-11 classifier (ONNX Runtime)",
    description="POST a base64-encoded food photo to /predict; get its Food-11 class and probability.",
)
