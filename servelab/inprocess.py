"""The in-process limit: what this machine can do with no server, no HTTP and no queue in front.

The same work a service does per request (base64 decode, image decode, preprocessing, a batch-1
forward pass) runs in one process as a two-stage pipeline: one decoding thread per core feeds a
short queue, and one inference thread drains it, so decoding overlaps inference as it would in
the best possible server. Its throughput is the ceiling every service is compared with.
"""

from __future__ import annotations

import base64
import logging
import os
import queue
import threading
import time
from collections.abc import Callable

import numpy as np

from servelab import paths
from servelab.food11 import LABELS, decode_base64_image, preprocess
from servelab.results import LatencySummary, RunResult

log = logging.getLogger(__name__)

RUNTIMES = ("onnxruntime", "pytorch")


def load_model(runtime: str) -> tuple[Callable[[np.ndarray], np.ndarray], str]:
    """The model as the matching FastAPI service loads it: (run batch -> logits, device)."""
    if runtime == "onnxruntime":
        import onnxruntime as ort

        providers = ["CPUExecutionProvider"]
        if "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, "CUDAExecutionProvider")
        session = ort.InferenceSession(str(paths.ARTIFACTS_DIR / "food11.onnx"), providers=providers)
        device = "cuda" if session.get_providers()[0] == "CUDAExecutionProvider" else "cpu"
        return (lambda batch: session.run(["output"], {"input": batch})[0]), device
    if runtime == "pytorch":
        import torch
        from torchvision.models import mobilenet_v2

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = mobilenet_v2(num_classes=len(LABELS))
        model.load_state_dict(torch.load(paths.ARTIFACTS_DIR / "food11.pth", map_location=device, weights_only=True))
        model.to(device).eval()

        def run(batch: np.ndarray) -> np.ndarray:
            with torch.inference_mode():
                return model(torch.from_numpy(batch).to(device)).float().cpu().numpy()

        return run, device.type
    raise ValueError(f"unknown runtime {runtime!r}; choose one of {RUNTIMES}")


def run_pipeline(
    runtime: str,
    image_bytes: bytes,
    duration_s: float = 10.0,
    warmup_s: float = 1.0,
    decode_workers: int | None = None,
    decode: bool = True,
) -> RunResult:
    """Run the pipeline for warmup_s + duration_s; measure only the last duration_s.

    With decode=False the image is decoded once and only inference is repeated: the ceiling for
    a server that receives tensors already preprocessed by its clients (Triton's ONNX model).
    """
    model, device = load_model(runtime)
    encoded = base64.b64encode(image_bytes).decode()
    if decode:
        decode_workers = decode_workers or os.cpu_count() or 1
    else:
        decode_workers = 0
        decoded_once = (preprocess(decode_base64_image(encoded))[np.newaxis], 0.0)
    ready: queue.Queue = queue.Queue(maxsize=2 * max(decode_workers, 1))
    stop = threading.Event()

    def decode_loop() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            tensor = preprocess(decode_base64_image(encoded))[np.newaxis]
            decode_s = time.perf_counter() - started
            while not stop.is_set():
                try:
                    ready.put((tensor, decode_s), timeout=0.1)
                    break
                except queue.Full:
                    continue

    service_times_ms: list[float] = []
    measure_from = time.perf_counter() + warmup_s
    measure_until = measure_from + duration_s
    decoders = [threading.Thread(target=decode_loop, daemon=True) for _ in range(decode_workers)]
    for thread in decoders:
        thread.start()
    try:
        while time.perf_counter() < measure_until:
            tensor, decode_s = ready.get() if decode else decoded_once
            started = time.perf_counter()
            model(tensor)
            if started >= measure_from:
                # Per-image work with no waiting: the floor under any service's latency.
                service_times_ms.append((decode_s + time.perf_counter() - started) * 1000)
    finally:
        stop.set()
        for thread in decoders:
            thread.join(timeout=5)
    measured_s = time.perf_counter() - measure_from
    log.info("in-process %s: %d images in %.1f s", runtime, len(service_times_ms), measured_s)
    pipeline = (
        f"{decode_workers} decoding threads feed 1 inference thread ({runtime} on {device}); "
        "latency is per-image decode + inference time, without any queueing"
        if decode
        else f"inference only ({runtime} on {device}) on an image decoded once; latency is inference time"
    )
    return RunResult(
        target=f"in-process/{runtime}" + ("" if decode else " (inference only)"),
        tool="in-process",
        mode="closed",
        requests=len(service_times_ms),
        throughput_rps=len(service_times_ms) / measured_s,
        latency=LatencySummary.of(service_times_ms),
        wall_s=measured_s,
        concurrency=max(decode_workers, 1),
        latencies_ms=service_times_ms,
        notes=[pipeline],
    )
