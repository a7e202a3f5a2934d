"""The services the GPU check starts, as processes: their commands (fastapi_pt and fastapi_onnx as the
local stack runs them, Triton's food_classifier alone, staged for this machine), free ports, start,
readiness, stop (children included) and /health."""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from servelab import paths
from servelab.service.cores import available_cores
from servelab.service.start import service_environment, uvicorn_command

log = logging.getLogger(__name__)

TRITON_MODEL = "food_classifier"
READY_TIMEOUT_S = {"fastapi_pt": 180.0, "fastapi_onnx": 180.0, "naive_pt": 180.0, "triton": 300.0}
STOP_GRACE_S = 15.0


@dataclass
class Service:
    """A service to start and load: its command, and the one request its load sends again and again."""

    name: str
    command: list[str]
    cwd: Path
    env: dict[str, str]
    ready_url: str
    load_url: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


class Running:
    """A service's process, in a process group of its own (so stopping it stops its children, such
    as Triton's backend stubs), its output in `log_path`."""

    def __init__(self, service: Service, log_path: Path) -> None:
        self.service, self.log_path = service, log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as log_file:
            self.process = subprocess.Popen(
                service.command,
                cwd=service.cwd,
                env={**os.environ, **service.env},
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self) -> str | None:
        """None once the service answers its readiness URL; else why it is not ready."""
        deadline = time.monotonic() + READY_TIMEOUT_S[self.service.name]
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return self._not_ready(f"exited with code {self.process.returncode} before it was ready")
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(self.service.ready_url, timeout=2) as answer,
            ):
                if answer.status == 200:
                    return None
            time.sleep(0.25)
        return self._not_ready(
            f"not ready at {self.service.ready_url} after {READY_TIMEOUT_S[self.service.name]:.0f} s"
        )

    def _not_ready(self, why: str) -> str:
        """`why`, with where its log is; the log's last lines are logged here (too long for a table)."""
        tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-25:])
        log.error("%s %s. Last lines of %s:\n%s", self.service.name, why, self.log_path, tail)
        return f"{why} (its log: {self.log_path})"

    def pids(self) -> list[int]:
        """The service's process and its descendants, those alive now."""
        try:
            leader = psutil.Process(self.process.pid)
            return [leader.pid, *(child.pid for child in leader.children(recursive=True))]
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        # Its descendants as they are now: once the leader exits, an orphan is no longer its child.
        group = []
        for pid in self.pids():
            with contextlib.suppress(psutil.NoSuchProcess):
                group.append(psutil.Process(pid))
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0f s: killed", self.service.name, STOP_GRACE_S)
        with contextlib.suppress(ProcessLookupError):  # what is left of its group (Triton's stubs)
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        # A SIGKILL is delivered, not done, when killpg returns: stopped means gone (or a zombie).
        _, alive = psutil.wait_procs(group, timeout=STOP_GRACE_S)
        if alive := [process for process in alive if still_running(process)]:
            log.warning("%s: processes %s outlived SIGKILL", self.service.name, [process.pid for process in alive])


def still_running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def free_ports(count: int) -> list[int]:
    """Ports the OS says are free now (nothing holds them until a server binds its own)."""
    with contextlib.ExitStack() as sockets:
        bound = [sockets.enter_context(socket.socket()) for _ in range(count)]
        for sock in bound:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in bound]


def fastapi_service(name: str, device: str, image: bytes, port: int) -> Service:
    """fastapi_pt or fastapi_onnx, as the local stack runs it (uvicorn from its folder, with the processes
    its app plans: servelab.service.start), on `device`."""
    url, folder = f"http://127.0.0.1:{port}", paths.REPO_ROOT / name
    return Service(
        name=name,
        command=uvicorn_command("127.0.0.1", port),
        cwd=folder,
        env=service_environment(folder, {"INFERENCE_DEVICE": device}),
        ready_url=f"{url}/health",
        load_url=f"{url}/predict",
        body=json.dumps({"image": base64.b64encode(image).decode()}).encode(),
        headers={"Content-Type": "application/json"},
    )


def naive_service(device: str, image: bytes, port: int) -> Service:
    """The original lab's kind of app (servelab.bench.naive_app, PyTorch): one uvicorn process, a
    synchronous handler, on the GPU where PyTorch has one (INFERENCE_DEVICE=cpu: the CPU)."""
    url = f"http://127.0.0.1:{port}"
    return Service(
        name="naive_pt",
        command=[
            sys.executable,
            "-m",
            "uvicorn",
            "servelab.bench.naive_app:app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        cwd=paths.REPO_ROOT,
        env={"INFERENCE_DEVICE": device, "NAIVE_RUNTIME": "pytorch"},
        ready_url=f"{url}/health",
        load_url=f"{url}/predict",
        body=json.dumps({"image": base64.b64encode(image).decode()}).encode(),
        headers={"Content-Type": "application/json"},
    )


WHEEL = "the nvidia-pytriton wheel"


def find_tritonserver(given: Path | None) -> tuple[Path | None, str]:
    """The tritonserver to run and where it was found (`given`, the nvidia-pytriton wheel's, or one
    on PATH), or None and why there is none."""
    if given is not None:
        usable = given.is_file() and os.access(given, os.X_OK)
        return (given, "--tritonserver") if usable else (None, f"--tritonserver {given} is not an executable file")
    # Found without importing pytriton: the wheel's binary is all this needs of it.
    wheel = importlib.util.find_spec("pytriton")
    if wheel is not None and wheel.submodule_search_locations:
        binary = Path(next(iter(wheel.submodule_search_locations))) / "tritonserver" / "bin" / "tritonserver"
        if binary.is_file():
            return binary, WHEEL
    if on_path := shutil.which("tritonserver"):
        return Path(on_path), "PATH"
    return None, "no tritonserver binary here"


def numpy_2_here() -> str | None:
    """Why the nvidia-pytriton wheel's Python backend cannot serve here, where this Python's numpy is 2.x
    (the wheel pins numpy<2; its stub, built for numpy 1.x, misreads every BYTES input under numpy 2:
    seen on an H200 machine on 2026-11-28, every request an HTTP 500); None where it is 1.x."""
    import numpy

    if int(numpy.__version__.split(".")[0]) < 2:
        return None
    return (
        f"its Python backend needs numpy 1.x (the nvidia-pytriton wheel pins numpy<2) and this Python has numpy "
        f"{numpy.__version__}, under which it misreads every image sent: name a folder holding numpy 1.x with "
        "--triton-model-path (scripts/gpu_check_there.sh installs .lab/triton-numpy's wheel in one and names it)"
    )


def triton_service(
    binary: Path, found_in: str, device: str, image: bytes, ports: Sequence[int], work_dir: Path,
    model_path: Sequence[str] = (),
    instance_group: str | None = None,
) -> Service | str:  # fmt: skip
    """Triton serving food_classifier alone on `ports` (HTTP, gRPC, metrics), staged for this machine
    by the lab's Triton tooling (KIND_GPU on a GPU, KIND_CPU on the CPU), its model.py taking the
    folders of `model_path` first, its instances the shipped config's or `instance_group`'s (config
    text, as a student types it); or why it cannot run here."""
    try:  # the lab's Triton tooling reads model configs with tritonclient, which a bare GPU machine lacks
        from servelab.loadgen.targets import TritonHttpTarget
        from servelab.service.hardware import Hardware
        from servelab.triton import server as triton_server
        from servelab.triton.adaptation import PYTHON_BACKEND
        from servelab.triton.models import ModelRepository
    except ImportError as exc:
        return f"{binary} ({found_in}) is here, but the lab's Triton tooling needs {exc.name}, not installed"
    http, grpc, metrics = ports
    try:
        if found_in == WHEEL:
            backends = triton_server.build_backend_dir(work_dir / "backends")
        else:  # an installed Triton (its container's layout): its backends beside its bin/
            backends = binary.resolve().parent.parent / "backends"
            if not (backends / "python" / "libtriton_python.so").is_file():
                return f"{binary} ({found_in}) has no Python backend in {backends}"
        if found_in == WHEEL and not model_path and (numpy_2 := numpy_2_here()):
            return f"{binary} ({found_in}) is here, but {numpy_2}"
        server = Hardware(gpus=1 if device == "cuda" else 0, cores=available_cores(), backends=(PYTHON_BACKEND,))
        # The staged model.py runs in the backend's own interpreter, which ignores PYTHONPATH: it is
        # given this Python's packages (torch), food11.py from this working tree (not installed on a
        # bare machine), and first of all the folders of `model_path` (a numpy 1.x for the wheel's stub).
        prelude = triton_server.site_packages_prelude() + f"sys.path.insert(0, {str(paths.REPO_ROOT)!r})\n"
        prelude += "".join(f"sys.path.insert(0, {entry!r})\n" for entry in reversed(model_path))
        repository = work_dir / "models"
        model = ModelRepository().get(TRITON_MODEL)
        config = model.config.with_text(instance_group) if instance_group else None
        staged = triton_server.stage_model(model, repository / TRITON_MODEL, server, prelude, config)
        request = TritonHttpTarget(f"127.0.0.1:{http}", TRITON_MODEL, image)
    except (RuntimeError, OSError) as exc:  # StagingError (a model file missing), no stub for this Python...
        return f"{binary} ({found_in}) is here, but {exc}"
    log.info("Triton's %s, staged for this machine:\n%s", TRITON_MODEL, staged.changes)
    ports_given = triton_server.TritonPorts(http, grpc, metrics)
    return Service(
        name="triton",
        command=triton_server.server_command(repository, backends, ports_given, [TRITON_MODEL], binary),
        cwd=work_dir,
        env=triton_server.server_environment(),
        ready_url=f"http://127.0.0.1:{http}/v2/models/{TRITON_MODEL}/ready",
        load_url=request.url,
        body=request.body,
        headers=request.headers,
    )


def health_of(service: Service) -> dict[str, Any]:
    with urllib.request.urlopen(service.ready_url, timeout=10) as answer:
        health = json.loads(answer.read())
    if not isinstance(health, dict):
        raise ValueError(f"{service.ready_url} answered {health!r}, not an object")
    return health


def last_line(text: str) -> str:
    """The last line said, for a table's cell (the whole text goes to the log)."""
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "nothing said")
