"""The naive reference: the FastAPI app a student writes first, as the original lab's was.

A synchronous handler (FastAPI runs it in its thread pool, up to 40 at once), the model built
at import time on the main thread, no limit on inferences running at once, each with the
runtime's default threads. The same work per request as the lab's services (the same decoding
and preprocessing, the same model file), none of their care. The benchmark measures it beside
them as a reference: every lab service must be at least as fast, with a shorter tail.

    NAIVE_RUNTIME=pytorch uvicorn servelab.bench.naive_app:app --port 8000   (or onnxruntime)

PyTorch runs on the GPU where it has one, as the original lab's app did (INFERENCE_DEVICE=cpu
keeps it on the CPU): the GPU check (servelab.bench.gpu_check) compares the services with it there.
"""

from __future__ import annotations

import numpy as np
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

from food11 import LABELS, InvalidImageError, decode_base64_image, preprocess, top_prediction
from servelab import paths
from servelab.settings import settings

RUNTIME = settings().naive_runtime

if RUNTIME == "pytorch":
    import torch
    from torchvision.models import mobilenet_v2

    DEVICE = "cuda" if settings().inference_device != "cpu" and torch.cuda.is_available() else "cpu"
    model = mobilenet_v2(num_classes=len(LABELS))
    model.load_state_dict(torch.load(paths.ARTIFACTS_DIR / "food11.pth", weights_only=True))
    model.eval().to(DEVICE)

    def run(batch: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return model(torch.from_numpy(batch).to(DEVICE)).cpu().numpy()

else:  # onnxruntime, the other runtime the settings take
    import onnxruntime as ort

    DEVICE = "cpu"
    session = ort.InferenceSession(str(paths.ARTIFACTS_DIR / "food11.onnx"), providers=["CPUExecutionProvider"])

    def run(batch: np.ndarray) -> np.ndarray:
        return session.run(None, {"input": batch})[0]


app = FastAPI(title=f"Naive Food-11 classifier ({RUNTIME})")


class PredictRequest(BaseModel):
    image: str


@app.post("/predict")
def predict(request: PredictRequest) -> dict:
    try:
        batch = preprocess(decode_base64_image(request.image))[np.newaxis]
    except InvalidImageError as exc:
        raise HTTPException(400, str(exc)) from exc
    label, probability = top_prediction(run(batch))[0]
    return {"prediction": label, "probability": probability}


@app.get("/health")
def health() -> dict:
    return {"status": "ready", "runtime": RUNTIME, "device": DEVICE}
