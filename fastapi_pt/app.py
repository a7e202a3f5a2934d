"""Food-11 classifier served with PyTorch behind FastAPI.

Run: python -m servelab.service.launch --runtime torch --host 0.0.0.0 --port 8000
(from this folder, after `make artifacts`): as many uvicorn processes as the machine calls for
(launch.py); `uvicorn app:app` runs one.
Threads: PREDICT_CONCURRENCY inference slots x INFERENCE_THREADS threads each (see cores.py).
Every setting it reads, and its default: servelab/service/settings.py.
"""

import logging
import threading
from pathlib import Path

import numpy as np
import torch

from servelab.service.cores import ThreadPlan
from servelab.service.devices import torch_model
from servelab.service.predict_api import ServedModel, create_app
from servelab.service.settings import ServiceSettings

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

SETTINGS = ServiceSettings.at_start_up()
MODEL_PATH = SETTINGS.model_path or Path(__file__).parent / "food11.pth"
if not MODEL_PATH.is_file():
    raise SystemExit(f"{MODEL_PATH} is missing: run `make artifacts` in the repository root to build it.")

# Chosen once at start-up, by INFERENCE_DEVICE (devices.py): by default the GPU when PyTorch can
# use one, the CPU otherwise. The model is built and run once there, on a short-lived thread of its
# own (torch_model); a GPU that PyTorch cannot use, or whose first inference fails, means the CPU,
# and the service says why.
model, placement = torch_model(MODEL_PATH, SETTINGS.device)


def load_model(plan: ThreadPlan):
    """On this (inference) thread: run(batch, threads) runs the model with that many threads. The
    first inference's thread has ended, taking its OpenMP team along: this thread's is the only one."""
    torch.set_num_threads(plan.threads)
    current = threading.local()  # each inference thread's own thread count (PyTorch keeps one per thread)

    def run(batch: np.ndarray, threads: int) -> np.ndarray:
        if getattr(current, "threads", None) != threads:
            torch.set_num_threads(threads)
            current.threads = threads
        return model(batch)

    return run


app = create_app(
    ServedModel(model_file=MODEL_PATH, placement=placement, load=load_model),
    title="Food-11 classifier (PyTorch)",
    description="POST a base64-encoded food photo to /predict; get its Food-11 class and probability.",
    settings=SETTINGS,
)
