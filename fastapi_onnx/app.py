"""Food-11 classifier served with ONNX Runtime behind FastAPI.

Run: python -m servelab.service.launch --runtime onnxruntime --host 0.0.0.0 --port 8000
(from this folder, after `make artifacts`): as many uvicorn processes as the machine calls for
(launch.py); `uvicorn app:app` runs one.
Threads: PREDICT_CONCURRENCY inference slots x INFERENCE_THREADS threads each (see cores.py).
The app itself (sessions, routes, error codes) is onnx_service.py, shared with ray_serve/.
Every setting it reads, and its default: servelab/service/settings.py.
"""

import logging
from pathlib import Path

from servelab.service.onnx_service import onnx_app
from servelab.service.settings import ServiceSettings

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

SETTINGS = ServiceSettings.at_start_up()
MODEL_PATH = SETTINGS.model_path or Path(__file__).parent / "food11.onnx"

app = onnx_app(MODEL_PATH, title="Food-11 classifier (ONNX Runtime)", settings=SETTINGS)
