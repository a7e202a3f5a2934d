"""GourmetGram as its image runs it: under gunicorn, with gourmetgram/gunicorn.conf.py, in front of the
real PyTorch service, through real HTTP. Its worker processes each build their own app; /metrics
must add up what every one of them served, whichever worker answers it."""

from __future__ import annotations

import dataclasses
import re
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from food11 import LABELS
from servelab import paths
from servelab.stack.catalogue import gourmetgram_service
from servelab.stack.supervision import start_on_free_ports
from tests.helpers import make_image_bytes

pytestmark = pytest.mark.integration

# Its settings, the workers among them (the image runs gunicorn with them: tests/test_docker_files.py).
CONFIG = paths.GOURMETGRAM_DIR / "gunicorn.conf.py"
UPLOADS = 8


def sample(metrics: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", metrics, re.M)
    return float(match.group(1)) if match else 0.0


def test_every_worker_serves_and_metrics_add_up_whichever_worker_answers(model_servers, ports, tmp_path):
    metrics_dir = tmp_path / "metrics"

    def under_gunicorn(own) -> list:
        spec = gourmetgram_service(own.gourmetgram, "fastapi_pt", ports)
        # Workers that take one request at a time here (a threaded worker may take them all), so that
        # requests at once spread over the workers.
        command = [sys.executable, "-m", "gunicorn", "--config", str(CONFIG), "--worker-class", "sync", "app:app"]
        return [
            dataclasses.replace(spec, command=command, env={**spec.env, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)})
        ]

    stack, own = start_on_free_ports(under_gunicorn, tmp_path / "logs")
    with stack:
        url = f"http://127.0.0.1:{own.gourmetgram}"

        def upload(seed: int) -> requests.Response:
            files = {"file": (f"dish{seed}.jpg", make_image_bytes(seed), "image/jpeg")}
            return requests.post(f"{url}/predict", files=files, timeout=120)

        with ThreadPoolExecutor(UPLOADS) as pool:
            pages = list(pool.map(upload, range(UPLOADS)))
        assert [page.status_code for page in pages] == [200] * UPLOADS
        assert all(re.search(r"<h1>(.*?)</h1>", page.text).group(1) in LABELS for page in pages)
        workers = {path.name.split("_")[1] for path in metrics_dir.glob("counter_*.db")}
        assert len(workers) >= 2, f"the uploads all went to one worker: {sorted(metrics_dir.iterdir())}"
        for _ in range(4):  # /metrics from whichever worker answers: the same sums
            metrics = requests.get(f"{url}/metrics", timeout=10).text
            assert sample(metrics, 'gourmetgram_requests_total{page="predict",status="200"}') == UPLOADS
            assert sample(metrics, 'gourmetgram_backend_seconds_count{outcome="predicted"}') == UPLOADS
        health = requests.get(f"{url}/healthz", timeout=10).json()
        assert health["backend_reachable"] is True and health["backend"] == "fastapi"
