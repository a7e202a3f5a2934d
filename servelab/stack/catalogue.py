"""The lab's services as the local stack runs them: each one's command, ports and readiness URL.

Each function returns the `ServiceSpec` of one service (FastAPI with PyTorch or with ONNX Runtime,
Triton, Ray Serve, GourmetGram, the image host, JupyterLab), which servelab.stack.supervision
starts and supervises; `lab_services` lists those `make up` starts, in order.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from servelab import paths
from servelab.service.start import service_environment, uvicorn_command
from servelab.stack.supervision import Ports, ServiceSpec, StackError

if TYPE_CHECKING:  # Triton's tooling reads configs with tritonclient: imported where Triton is served
    from servelab.triton import server as triton_local

log = logging.getLogger(__name__)


# Each FastAPI flavor's folder (its app.py) and the model file it serves.
FASTAPI_FLAVORS = {"pt": (paths.FASTAPI_PT_DIR, "food11.pth"), "onnx": (paths.FASTAPI_ONNX_DIR, "food11.onnx")}


def fastapi_service(
    flavor: str, port: int, env: dict[str, str] | None = None, image_host_port: int | None = None
) -> ServiceSpec:
    """flavor: "pt" (PyTorch) or "onnx" (ONNX Runtime), started as its Dockerfile starts it (uvicorn, with
    the processes its app plans: servelab.service.start). It serves the model file of the artifacts
    folder (the same bytes `make artifacts` places beside its app; in the Compose project's Jupyter
    container, the file built in the lab's PyTorch image), and fetches images by URL from the image
    host on `image_host_port` (default: the lab's port, which is also the services' default)."""
    folder, model_file = FASTAPI_FLAVORS[flavor]
    allowed = f"127.0.0.1:{image_host_port or Ports.configured().image_host}"
    given = {"IMAGE_URL_ALLOWED_HOSTS": allowed, "FOOD11_MODEL_PATH": str(paths.ARTIFACTS_DIR / model_file)}
    try:
        served = service_environment(folder, {**given, **(env or {})})
    except RuntimeError as refused:  # its app stops on a setting it cannot use, saying so
        raise StackError(str(refused)) from None
    return ServiceSpec(
        name=f"fastapi_{flavor}",
        command=uvicorn_command("127.0.0.1", port),
        cwd=folder,
        ports=[port],
        ready_url=f"http://127.0.0.1:{port}/health",
        env=served,
    )


def naive_service(runtime: str, port: int, env: dict[str, str] | None = None) -> ServiceSpec:
    """The original lab's kind of app (servelab.bench.naive_app) on `runtime` ("pytorch",
    "onnxruntime"): one uvicorn process, a synchronous handler; the reference the services beat."""
    command = [sys.executable, "-m", "uvicorn", "servelab.bench.naive_app:app", "--host", "127.0.0.1"]
    return ServiceSpec(
        name="naive_pt" if runtime == "pytorch" else "naive_onnx",
        command=[*command, "--port", str(port)],
        cwd=paths.REPO_ROOT,
        ports=[port],
        ready_url=f"http://127.0.0.1:{port}/health",
        env={"NAIVE_RUNTIME": runtime, **(env or {})},
    )


DEFAULT_IMAGE_LATENCY_MS = 100.0  # a bucket in another region, give or take


def image_host_service(port: int, latency_ms: float = DEFAULT_IMAGE_LATENCY_MS) -> ServiceSpec:
    """The image host (image_host/server.py): the sample photos behind an emulated network latency."""
    return ServiceSpec(
        name="image_host",
        command=[
            sys.executable,
            "server.py",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--images",
            str(paths.SAMPLE_IMAGE.parent),
            "--latency-ms",
            f"{latency_ms:g}",
        ],
        cwd=paths.REPO_ROOT / "image_host",
        ports=[port],
        ready_url=f"http://127.0.0.1:{port}/health",
    )


def triton_service(
    ports: triton_local.TritonPorts,
    work_dir: Path | None = None,
    source: Path = paths.MODELS_STAGING_DIR,
    load: list[str] | None = None,
) -> ServiceSpec:
    """Stage every model of `source` adapted to this machine in `work_dir` (default: the stack's,
    paths.TRITON_DIR), log what changed, and describe the server process, which loads the models
    named in `load` (default: all). A model folder that cannot be staged raises StagingError, naming it."""
    from servelab.triton import server as triton_local

    work_dir = work_dir or paths.TRITON_DIR
    repository = work_dir / "models"
    backends = triton_local.build_backend_dir(work_dir / "backends")
    staged = triton_local.stage_model_repository(repository, source)
    for model in staged:
        log.info("Triton model %s, adapted for this machine:\n%s", model.name, model.changes)
    names = [model.name for model in staged]
    if unknown := sorted(set(load or ()) - set(names)):
        raise triton_local.StagingError(
            f"{source} has no model folder named {', '.join(unknown)}: it has {', '.join(names)}"
        )
    return ServiceSpec(
        name="triton",
        command=triton_local.server_command(repository, backends, ports, load or names),
        cwd=work_dir,
        ports=[ports.http, ports.grpc, ports.metrics],
        ready_url=f"http://127.0.0.1:{ports.http}/v2/health/ready",
        env=triton_local.server_environment(),
        ready_timeout_s=240.0,
    )


# Services with the FastAPI /predict contract (the two FastAPI apps, and the same app on Ray Serve):
# GourmetGram calls each the same way.
PREDICT_API_SERVICES = ("fastapi_pt", "fastapi_onnx", "ray_serve")


def ui_backends() -> list[str]:
    """What the web UI can talk to: a service with the FastAPI contract, or a Triton model that
    classifies photos one at a time with one answer each (a stateful model takes frames of a
    sequence, not photos; a decoupled one streams its answers over gRPC, and the UI asks over HTTP)."""
    from servelab.triton.models import ModelRepository

    photo_models = [
        model.name
        for model in ModelRepository()
        if model.entry and model.entry.image_request and not model.stateful and not model.decoupled
    ]
    return [*PREDICT_API_SERVICES, *photo_models]


def ray_serve_service(ports: Ports, config: Path | None = None, token_file: Path | None = None) -> ServiceSpec:
    """The Ray Serve app (ray_serve/) on a one-node Ray of its own, on 127.0.0.1 (servelab.ray.local).
    Stopping it stops Ray: the launcher shuts Ray down on SIGTERM, and the process group goes too."""
    command = [sys.executable, "-m", "servelab.ray.local", "--port", str(ports.ray_serve)]
    command += ["--dashboard-port", str(ports.ray_dashboard), "--metrics-port", str(ports.ray_metrics)]
    if config is not None:
        command += ["--config", str(config)]
    if token_file is not None:
        command += ["--token-file", str(token_file)]
    return ServiceSpec(
        name="ray_serve",
        command=command,
        cwd=paths.REPO_ROOT,
        ports=[ports.ray_serve, ports.ray_dashboard, ports.ray_metrics],
        ready_url=f"http://127.0.0.1:{ports.ray_serve}/health",
        ready_timeout_s=240.0,
        stop_leader_first=True,
        stop_grace_s=45.0,
        # Ray gives its raylet a fixed 30 s to register (ray/_private/node.py), which a small machine
        # still busy with the services started before it can miss; a second start begins clean.
        retry_start_on="timed out during startup",
    )


def gourmetgram_service(port: int, backend: str, ports: Ports, urls: Mapping[str, str] | None = None) -> ServiceSpec:
    """GourmetGram in front of `backend` (see ui_backends), configured as in the Compose project.
    The backend is on 127.0.0.1 at its port in `ports`, unless `urls` names its address (by
    backend: a URL for fastapi_pt, fastapi_onnx and ray_serve; host:port for triton)."""
    from servelab.triton.models import ModelRepository

    urls = urls or {}
    if backend in PREDICT_API_SERVICES:
        backend_env = {"FASTAPI_SERVER_URL": urls.get(backend, f"http://127.0.0.1:{getattr(ports, backend)}")}
    elif backend in ui_backends():
        triton = urls.get("triton", f"127.0.0.1:{ports.triton_http}")
        backend_env = {"TRITON_SERVER_URL": triton, "FOOD11_MODEL_NAME": backend}
    elif backend in (models := ModelRepository()).names() and models.get(backend).stateful:
        raise ValueError(
            f"GourmetGram cannot use {backend!r}: it is a stateful model (sequence batching), whose every "
            f"request is a frame of a sequence, and the page classifies single photos. Choose one of "
            f"{', '.join(ui_backends())}"
        )
    elif backend in models.names() and models.get(backend).decoupled:
        raise ValueError(
            f"GourmetGram cannot use {backend!r}: it is a decoupled model, which streams its answers over gRPC, "
            f"and the page asks Triton over HTTP for one answer. Choose one of {', '.join(ui_backends())}"
        )
    else:
        raise ValueError(f"GourmetGram cannot use {backend!r}: choose one of {', '.join(ui_backends())}")
    return ServiceSpec(
        name="gourmetgram",
        command=[sys.executable, "app.py"],
        cwd=paths.GOURMETGRAM_DIR,
        ports=[port],
        ready_url=f"http://127.0.0.1:{port}/healthz",
        env={"HOST": "127.0.0.1", "PORT": str(port), **backend_env},
    )


def jupyter_service(port: int, token: str) -> ServiceSpec:
    """JupyterLab on the notebooks, for the local path; reachable from this machine only."""
    command = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={paths.REPO_ROOT / 'notebooks'}",
    ]
    if os.geteuid() == 0:
        command.append("--allow-root")  # containers and CI machines often run as root; Jupyter refuses by default
    return ServiceSpec(
        name="jupyterlab",
        command=command,
        cwd=paths.REPO_ROOT / "notebooks",
        ports=[port],
        ready_url=f"http://127.0.0.1:{port}/api",
        env={"LAB_SERVICES": "local", "JUPYTER_CONFIG_PATH": jupyter_config_path()},
    )


# nbgrader is installed beside the lab for `make notebooks` (the students' copies), and would add its
# instructor's menus and pages (Formgrader, Assignment List...) to the students' JupyterLab: this
# folder's config, read before the virtualenv's, turns its server and JupyterLab extensions off.
JUPYTER_CONFIG = Path(__file__).parent / "jupyter_config"


def jupyter_config_path() -> str:
    """JUPYTER_CONFIG_PATH for the lab's JupyterLab: JUPYTER_CONFIG first, then any the user set."""
    return os.pathsep.join(filter(None, [str(JUPYTER_CONFIG), os.environ.get("JUPYTER_CONFIG_PATH")]))


def lab_services(ports: Ports, jupyter_token: str, ui_backend: str = "fastapi_pt") -> list[ServiceSpec]:
    return [
        image_host_service(ports.image_host),
        fastapi_service("pt", ports.fastapi_pt, image_host_port=ports.image_host),
        fastapi_service("onnx", ports.fastapi_onnx, image_host_port=ports.image_host),
        triton_service(ports.triton),
        ray_serve_service(ports),
        gourmetgram_service(ports.gourmetgram, ui_backend, ports),
        jupyter_service(ports.jupyter, jupyter_token),
    ]
