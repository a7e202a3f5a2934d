"""Triton serving food_classifier alone, as the GPU check and notebook 6's claims on a GPU start it
(through servelab.stack.supervision, as every service): the tritonserver found here (given, the
nvidia-pytriton wheel's, or one on PATH), the model staged for this machine, its request prepared.
Not servelab.stack.catalogue's `triton_service`: that stages every model for the wheel's server,
where this serves one model from whichever server this machine has."""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from servelab import paths
from servelab.loadgen.targets import HttpTarget
from servelab.service.cores import available_cores
from servelab.stack.supervision import ServiceSpec

log = logging.getLogger(__name__)

TRITON_MODEL = "food_classifier"


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
    binary: Path,
    found_in: str,
    device: str,
    image: bytes,
    ports: Sequence[int],
    work_dir: Path,
    model_path: Sequence[str] = (),
    instance_group: str | None = None,
) -> tuple[ServiceSpec, HttpTarget] | str:
    """Triton serving food_classifier alone on `ports` (HTTP, gRPC, metrics), staged for this machine
    by the lab's Triton tooling (KIND_GPU on a GPU, KIND_CPU on the CPU), its model.py taking the
    folders of `model_path` first, its instances the shipped config's or `instance_group`'s (config
    text, as a student types it), and the request its load sends; or why it cannot run here."""
    try:  # the lab's Triton tooling reads model configs with tritonclient, which a bare GPU machine lacks
        from servelab.loadgen.targets import TritonHttpTarget
        from servelab.service.hardware import Hardware
        from servelab.triton import server as triton_server
        from servelab.triton.adaptation import PYTHON_BACKEND
        from servelab.triton.models import ModelRepository
    except ImportError as exc:
        return f"{binary} ({found_in}) is here, but the lab's Triton tooling needs {exc.name}, not installed"
    http = ports[0]
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
    spec = ServiceSpec(
        name="triton",
        command=triton_server.server_command(
            repository, backends, triton_server.TritonPorts(*ports), [TRITON_MODEL], binary
        ),
        cwd=work_dir,
        ports=list(ports),
        ready_url=f"http://127.0.0.1:{http}/v2/models/{TRITON_MODEL}/ready",
        env=triton_server.server_environment(),
        ready_timeout_s=300.0,
        stop_grace_s=15.0,
    )
    return spec, request
