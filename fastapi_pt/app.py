"""Food-11 classifier served with PyTorch behind FastAPI.

Run: uvicorn app:app --host 0.0.0.0 --port 8000   (from this folder, after `make artifacts`)
Threads: PREDICT_CONCURRENCY inference slots x INFERENCE_THREADS threads each (see cores.py).
Every setting it reads, and its default: servelab/service/settings.py.
"""

import logging
import threading
from pathlib import Path

import numpy as np
import torch
from torchvision.models import mobilenet_v2

from servelab.service.cores import ThreadPlan
from servelab.service.devices import torch_device
from servelab.service.food11 import LABELS
from servelab.service.predict_api import ServedModel, create_app
from servelab.service.settings import ServiceSettings

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

SETTINGS = ServiceSettings.at_start_up()
MODEL_PATH = SETTINGS.model_path or Path(__file__).parent / "food11.pth"
if not MODEL_PATH.is_file():
    raise SystemExit(f"{MODEL_PATH} is missing: run `make artifacts` in the repository root to build it.")

# Chosen once at start-up, by INFERENCE_DEVICE (devices.py): by default the GPU when PyTorch can
# use one, the CPU otherwise. A GPU asked for that PyTorch cannot use means the CPU, and says why.
device, placement = torch_device(SETTINGS.device)
# Full FP32 convolutions on every GPU: by default PyTorch lets cuDNN use TF32 on Ampere and newer
# GPUs (A100, H100), which moves the probabilities by about 2e-4 from the CPU's and ONNX Runtime's
# answers to the same model (measured on an H100), so the answer would depend on the GPU's
# generation. A batch-1 MobileNetV2 is bound by kernel launches, not arithmetic: TF32 gains nothing.
torch.backends.cudnn.allow_tf32 = False


def load_model(plan: ThreadPlan):
    """Build the model on this (inference) thread; run(batch, threads) runs it with that many threads."""
    torch.set_num_threads(plan.threads)
    # The checkpoint is a state_dict, loaded with weights_only=True: no pickled code is executed.
    model = mobilenet_v2(num_classes=len(LABELS))
    model.load_state_dict(torch.load(MODEL_PATH, map_location=device, weights_only=True))
    model.to(device).eval()
    current = threading.local()  # each inference thread's own thread count (PyTorch keeps one per thread)

    def run(batch: np.ndarray, threads: int) -> np.ndarray:
        if getattr(current, "threads", None) != threads:
            torch.set_num_threads(threads)
            current.threads = threads
        with torch.inference_mode():
            return model(torch.from_numpy(batch).to(device)).float().cpu().numpy()

    return run


app = create_app(
    ServedModel(model_file=MODEL_PATH, placement=placement, load=load_model),
    title="Food-11 classifier (PyTorch)",
    description="POST a base64-encoded food photo to /predict; get its Food-11 class and probability.",
    settings=SETTINGS,
)
