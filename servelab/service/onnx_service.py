"""The Food-11 prediction service on ONNX Runtime: the app of `fastapi_onnx` and of every Ray
Serve replica (`ray_serve`), built once here; both images install this package.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI

from servelab.service.cores import ThreadPlan, available_cores
from servelab.service.devices import onnx_session
from servelab.service.predict_api import ServedModel, create_app
from servelab.service.settings import ServiceSettings


def session_options(threads: int) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Idle pool threads sleep rather than spin: a spinning thread takes a core from the decoding
    # pool and the other slot (measured here: about 6% more throughput under load, same latency alone).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def onnx_app(model_path: Path, title: str, settings: ServiceSettings) -> FastAPI:
    """The service for `model_path`; it stops with a message saying what to do when it is missing."""
    if not model_path.is_file():
        raise SystemExit(f"{model_path} is missing: run `make artifacts` in the repository root to build it.")
    # The first session says where the model runs, proved by one inference there (a GPU that fails
    # it means the CPU, with ONNX Runtime's error), and the thread plan follows from that. It gets
    # every core: the threads of an inference alone in every default plan, on a CPU or a GPU. It is
    # made, and run once, on this thread, before the inference threads exist: a session's threads
    # are its own, whichever thread makes or runs it.
    first_threads = available_cores()
    first, placement = onnx_session(model_path, session_options(first_threads), settings.device)

    def load_model(plan: ThreadPlan):
        """A session per thread count the plan may ask for (a session's threads are fixed when it
        is made; its run() is thread-safe); run(batch, threads) uses the matching one. The others
        are asked for the device the first one got: a GPU that failed is not tried again."""

        def session_for(threads: int) -> ort.InferenceSession:
            if threads == first_threads:
                return first
            return onnx_session(model_path, session_options(threads), placement.device)[0]

        sessions = {threads: session_for(threads) for threads in plan.thread_counts()}

        def run(batch: np.ndarray, threads: int) -> np.ndarray:
            return sessions[threads].run(["output"], {"input": batch})[0]

        return run

    return create_app(
        ServedModel(model_file=model_path, placement=placement, load=load_model),
        title=title,
        description="POST a base64-encoded food photo to /predict; get its Food-11 class and probability.",
        settings=settings,
    )
