"""Food-11 classifier served with ONNX Runtime behind FastAPI.

Run: uvicorn app:app --host 0.0.0.0 --port 8000   (from this folder, after `make artifacts`)
Threads: PREDICT_CONCURRENCY inference slots x INFERENCE_THREADS threads each (see cores.py).
"""

import logging
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
from cores import ThreadPlan
from predict_api import ServedModel, create_app

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

MODEL_PATH = Path(os.environ.get("FOOD11_MODEL_PATH", Path(__file__).parent / "food11.onnx"))
if not MODEL_PATH.is_file():
    raise SystemExit(f"{MODEL_PATH} is missing: run `make artifacts` in the repository root to build it.")

# Chosen once at start-up: CUDA when this ONNX Runtime build has it (the onnxruntime-gpu
# package on a GPU node), the CPU otherwise.
PROVIDERS = ["CPUExecutionProvider"]
if "CUDAExecutionProvider" in ort.get_available_providers():
    PROVIDERS.insert(0, "CUDAExecutionProvider")


def session_with(threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Idle pool threads sleep rather than spin: a spinning thread takes a core from the decoding
    # pool and the other slot (measured here: about 6% more throughput under load, same latency alone).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(MODEL_PATH), options, providers=PROVIDERS)


def load_model(plan: ThreadPlan):
    """A session per thread count the plan may ask for (a session's threads are fixed when it is
    made; its run() is thread-safe); run(batch, threads) uses the matching one."""
    sessions = {threads: session_with(threads) for threads in plan.thread_counts()}
    in_use = next(iter(sessions.values())).get_providers()
    logging.getLogger("food11.service").info("ONNX Runtime execution providers in use: %s", in_use)

    def run(batch: np.ndarray, threads: int) -> np.ndarray:
        return sessions[threads].run(["output"], {"input": batch})[0]

    return run


app = create_app(
    ServedModel(
        model_file=MODEL_PATH,
        runtime=f"onnxruntime {ort.__version__} ({PROVIDERS[0]})",
        device="cuda" if PROVIDERS[0] == "CUDAExecutionProvider" else "cpu",
        load=load_model,
    ),
    title="Food-11 classifier (ONNX Runtime)",
    description="POST a base64-encoded food photo to /predict; get its Food-11 class and probability.",
)
