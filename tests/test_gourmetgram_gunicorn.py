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
from tests.helpers import make_image_bytes, until
from tests.helpers.gourmetgram import metric

pytestmark = pytest.mark.integration

# Its settings, the workers among them (the image runs gunicorn with them: tests/test_dockerfiles.py).
CONFIG = paths.GOURMETGRAM_DIR / "gunicorn.conf.py"
UPLOADS = 8
BURSTS = 3


def test_every_worker_serves_and_metrics_add_up_whichever_worker_answers(model_servers, ports, tmp_path):
    metrics_dir, config = tmp_path / "metrics", tmp_path / "gunicorn.conf.py"
    # The image's settings, but workers that take one request at a time (a threaded worker may take
    # them all), so that requests at once spread over the workers. (Gunicorn runs threads > 1 as gthread.)
    config.write_text(CONFIG.read_text() + '\nworker_class = "sync"\nthreads = 1\n')

    def under_gunicorn(own) -> list:
        spec = gourmetgram_service(own.gourmetgram, "fastapi_pt", ports)
        command = [sys.executable, "-m", "gunicorn", "--config", str(config), "app:app"]
        return [
            dataclasses.replace(spec, command=command, env={**spec.env, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)})
        ]

    stack, own = start_on_free_ports(under_gunicorn, tmp_path / "logs")
    with stack:
        url = f"http://127.0.0.1:{own.gourmetgram}"
        log = tmp_path / "logs" / "gourmetgram.log"
        until(lambda: log.read_text().count("INFO gourmetgram: backend=fastapi") >= 2, 60, "both workers' apps")

        def upload(seed: int) -> requests.Response:
            files = {"file": (f"dish{seed}.jpg", make_image_bytes(seed), "image/jpeg")}
            return requests.post(f"{url}/predict", files=files, timeout=120)

        def workers_counted() -> set[str]:
            return {path.name.split("_")[1] for path in metrics_dir.glob("counter_*.db")}

        uploads = 0
        for _ in range(BURSTS):  # each a burst of uploads at once, until two workers have served
            with ThreadPoolExecutor(UPLOADS) as pool:
                pages = list(pool.map(upload, range(UPLOADS)))
            uploads += UPLOADS
            assert [page.status_code for page in pages] == [200] * UPLOADS
            assert all(re.search(r"<h1>(.*?)</h1>", page.text).group(1) in LABELS for page in pages)
            if len(workers_counted()) >= 2:
                break
        assert len(workers_counted()) >= 2, f"every upload went to one worker: {sorted(metrics_dir.iterdir())}"
        for _ in range(4):  # /metrics from whichever worker answers: the same sums
            metrics = requests.get(f"{url}/metrics", timeout=10).text
            assert metric(metrics, 'gourmetgram_requests_total{page="predict",status="200"}') == uploads
            assert metric(metrics, 'gourmetgram_backend_seconds_count{outcome="predicted"}') == uploads
        health = requests.get(f"{url}/healthz", timeout=10).json()
        assert health["backend_reachable"] is True and health["backend"] == "fastapi"
