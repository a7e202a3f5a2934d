"""The Food-11 prediction service on ONNX Runtime: the app of `fastapi_onnx` and of every Ray
Serve replica (`ray_serve`), built once here. `python -m servelab artifacts` copies this file
into both folders; edit it here.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort
from cores import ThreadPlan
from fastapi import FastAPI
from predict_api import ServedModel, create_app

log = logging.getLogger("food11.service")


def providers() -> list[str]:
    """CUDA when this ONNX Runtime build has it (onnxruntime-gpu on a GPU node), the CPU otherwise."""
    chosen = ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" in ort.get_available_providers():
        chosen.insert(0, "CUDAExecutionProvider")
    return chosen


def session_with(model_path: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Idle pool threads sleep rather than spin: a spinning thread takes a core from the decoding
    # pool and the other slot (measured here: about 6% more throughput under load, same latency alone).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(model_path), options, providers=providers())


def onnx_app(model_path: Path, title: str) -> FastAPI:
    """The service for `model_path`; it stops with a message saying what to do when it is missing."""
    if not model_path.is_file():
        raise SystemExit(f"{model_path} is missing: run `make artifacts` in the repository root to build it.")

    def load_model(plan: ThreadPlan):
        """A session per thread count the plan may ask for (a session's threads are fixed when it
        is made; its run() is thread-safe); run(batch, threads) uses the matching one."""
        sessions = {threads: session_with(model_path, threads) for threads in plan.thread_counts()}
        log.info("ONNX Runtime execution providers in use: %s", next(iter(sessions.values())).get_providers())

        def run(batch: np.ndarray, threads: int) -> np.ndarray:
            return sessions[threads].run(["output"], {"input": batch})[0]

        return run

    first = providers()[0]
    return create_app(
        ServedModel(
            model_file=model_path,
            runtime=f"onnxruntime {ort.__version__} ({first})",
            device="cuda" if first == "CUDAExecutionProvider" else "cpu",
            load=load_model,
        ),
        title=title,
        description="POST a base64-encoded food photo to /predict; get its Food-11 class and probability.",
    )
