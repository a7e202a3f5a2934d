"""How the lab starts a FastAPI service (fastapi_pt/, fastapi_onnx/): uvicorn's own command, from the
service's folder, as its Dockerfile does.

    WEB_CONCURRENCY=$(python app.py) uvicorn app:app --host 127.0.0.1 --port 8000

The processes come from the app itself (`python app.py` prints those it plans for this machine; its
plan section says why), unless WEB_CONCURRENCY is given. uvicorn reads WEB_CONCURRENCY as --workers'
default, and each process reads it to know its share of the cores. With more than one, the processes
keep their Prometheus metrics in one empty folder (PROMETHEUS_MULTIPROC_DIR), so that /metrics, whichever
process answers, adds up all of them; a process that dies and is started again by uvicorn keeps its
counts there.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"


def uvicorn_command(host: str, port: int) -> list[str]:
    """The command that serves app.py from its folder (the one the service's Dockerfile runs)."""
    return [sys.executable, "-m", "uvicorn", "app:app", "--host", host, "--port", str(port)]


@functools.cache
def planned_processes(folder: Path, device: str) -> int:
    """The processes the app in `folder` plans for this machine, with INFERENCE_DEVICE=`device`: what
    `python app.py` prints (once per folder and device for this process: it imports the runtime)."""
    env = {"INFERENCE_DEVICE": device} if device else {}
    answer = subprocess.run(
        [sys.executable, "app.py"], cwd=folder, capture_output=True, text=True, timeout=300, env={**os.environ, **env}
    )
    if answer.returncode != 0 or not answer.stdout.strip().isdigit():  # a setting it cannot use, say
        said = answer.stderr.strip().splitlines()[-1:] or [f"`python app.py` printed {answer.stdout!r}"]
        raise RuntimeError(f"{folder.name} does not start: {said[0]}")
    return int(answer.stdout.strip())


def service_environment(folder: Path, env: Mapping[str, str]) -> dict[str, str]:
    """`env`, with WEB_CONCURRENCY (the app's plan, unless given) and, for more than one process, a new
    empty PROMETHEUS_MULTIPROC_DIR, removed when this process exits."""
    if "SERVICE_PROCESSES" in env:
        raise ValueError("SERVICE_PROCESSES is gone: uvicorn's own WEB_CONCURRENCY sets a service's processes.")
    processes = env.get("WEB_CONCURRENCY") or str(planned_processes(folder, env.get("INFERENCE_DEVICE", "")))
    served = {**env, "WEB_CONCURRENCY": processes}
    if int(processes) > 1 and MULTIPROCESS_DIR not in env:
        served[MULTIPROCESS_DIR] = tempfile.mkdtemp(prefix="servelab-metrics-")
        atexit.register(shutil.rmtree, served[MULTIPROCESS_DIR], ignore_errors=True)
    return served
