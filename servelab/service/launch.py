"""Start a prediction service as its plan says: as many processes as the machine calls for.

    python -m servelab.service.launch --runtime torch --host 127.0.0.1 --port 8000   (from the service's folder)

One Python process serves only as fast as its interpreter lock lets it (cores.py says what was
measured), so on a many-core machine, or beside a GPU, a service runs several: uvicorn's workers,
which share the port, each the whole app with its own model, slots and decoding threads, on its
share of the cores. The plan comes from the cores this process may use and whether the service's
runtime can use a GPU here (cores.service_plan); SERVICE_PROCESSES sets the count instead. Each worker is told the count
(SERVICE_PROCESSES), so that it plans its threads on its share; and with more than one, the
workers keep their Prometheus metrics in one folder (PROMETHEUS_MULTIPROC_DIR), so that /metrics,
whichever worker answers it, adds up all of them. uvicorn starts a worker again if one dies; its
counts stay in the folder.

On 2 cores the plan is one process, and this runs `uvicorn app:app` as it always was.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import tempfile

from servelab.service.devices import CUDA_PROVIDER
from servelab.service.hardware import visible_gpus
from servelab.service.settings import ServiceSettings

log = logging.getLogger("servelab.service.launch")

MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"
# Whether each runtime can use a GPU here, asked in a short-lived process: this one supervises the
# workers and stays small (no runtime imported), and CUDA is never initialised before they start.
GPU_QUESTION = {
    "torch": "import torch; print(torch.cuda.is_available())",
    "onnxruntime": f"import onnxruntime; print({CUDA_PROVIDER!r} in onnxruntime.get_available_providers())",
}


def runtime_has_gpu(runtime: str) -> bool:
    """Whether `runtime` sees a GPU it can run on: an NVIDIA GPU here, and its CUDA build (ONNX Runtime's
    CUDA provider, PyTorch's CUDA)."""
    if not visible_gpus():
        return False
    answer = subprocess.run([sys.executable, "-c", GPU_QUESTION[runtime]], capture_output=True, text=True, timeout=120)
    return answer.stdout.strip() == "True"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servelab.service.launch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--app", default="app:app", help="the ASGI app, as uvicorn names it (default: app:app)")
    parser.add_argument("--runtime", choices=sorted(GPU_QUESTION), required=True, help="the runtime the app runs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    settings = ServiceSettings.at_start_up()
    # The device as the plan sees it before any model is built: a GPU the runtime can use, unless the
    # CPU is asked for. A worker whose GPU then fails its first inference falls back to the CPU and
    # says so in /health.
    device = "cuda" if settings.device != "cpu" and runtime_has_gpu(args.runtime) else "cpu"
    plan = settings.service_plan(device)
    log.info("%s on %s: %s", args.app, "a GPU" if device == "cuda" else "the CPU", plan.describe())
    os.environ["SERVICE_PROCESSES"] = str(plan.processes)
    made_dir = None
    if plan.processes > 1 and not os.environ.get(MULTIPROCESS_DIR):
        made_dir = os.environ[MULTIPROCESS_DIR] = tempfile.mkdtemp(prefix="servelab-metrics-")

    import uvicorn  # after the environment above: its workers inherit it

    try:
        uvicorn.run(args.app, host=args.host, port=args.port, workers=plan.processes, app_dir=os.getcwd())
    finally:
        if made_dir is not None:
            shutil.rmtree(made_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
