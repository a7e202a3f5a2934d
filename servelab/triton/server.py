"""Run the real Triton Inference Server 2.51 on this machine, without Docker or a GPU.

The `nvidia-pytriton` wheel ships the same `tritonserver` binary as the 24.10 container image,
with its Python backend, but no other backend. This module
- builds a backend directory from the wheel's files,
- stages a copy of every model folder in `models_staging/` adapted to the server that runs it
  (`servelab.triton.adaptation.adapt_to_server`), and returns each change as a diff to print. For the
  local server (LOCAL_TRITON: no GPU, the Python backend only), and for the Triton container of
  the Compose project where it has no GPU or no ONNX Runtime backend (servelab.triton.container):
  * every `KIND_GPU` instance group becomes `KIND_CPU` (a `KIND_GPU` model fails to load without a GPU);
  * a model for the ONNX Runtime backend is served by the Python backend running the same
    `model.onnx` with ONNX Runtime (`servelab/triton/onnx_model.py`). Its config says so in a
    `served_by` parameter, and Triton's own model config endpoint reports `backend: "python"`:
    the difference is visible, not hidden;
  * the weights status (trained/untrained) is added as config parameters, which Triton reports;
  * locally, each `model.py` gets one first line that puts the lab's virtualenv on `sys.path`.
  A folder it cannot adapt stops the start-up with a message naming the folder and what to do.
- builds the `tritonserver` command line, with explicit model control so a single model can be
  reloaded after a config change without restarting the server, and every staged model loaded.
"""

from __future__ import annotations

import difflib
import importlib.util
import logging
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from servelab import paths
from servelab.service.cores import available_cores
from servelab.service.hardware import Hardware
from servelab.triton.adaptation import ONNX_BACKEND, PYTHON_BACKEND, adapt_to_server
from servelab.triton.config import ConfigError, TritonConfig
from servelab.triton.models import Model, ModelError, ModelRepository

log = logging.getLogger(__name__)

ONNX_RUNNER_SOURCE = Path(__file__).resolve().parent / "onnx_model.py"
# The server the local stack runs: the pip-installed build, on this machine, with no GPU.
LOCAL_TRITON = Hardware(gpus=0, cores=available_cores(), backends=(PYTHON_BACKEND,))


class StagingError(RuntimeError):
    """A model folder the local stack cannot serve; the message names it and says what to do."""


def pytriton_server_dir() -> Path:
    """The nvidia-pytriton wheel's tritonserver folder, found without importing pytriton: its server
    is all the lab uses of it, and a GPU machine may carry that folder alone (`make test-gpu`)."""
    wheel = importlib.util.find_spec("pytriton")
    if wheel is None or not wheel.submodule_search_locations:
        raise RuntimeError("nvidia-pytriton is not installed in this Python environment; run `make setup` first.")
    return Path(next(iter(wheel.submodule_search_locations))).resolve() / "tritonserver"


def build_backend_dir(destination: Path) -> Path:
    """Make `<destination>/python/` the Python backend directory tritonserver expects."""
    server_dir = pytriton_server_dir()
    python_dir = destination / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = server_dir / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise RuntimeError(f"nvidia-pytriton has no Python backend stub for Python {version} ({stub}).")
    links = {
        "libtriton_python.so": server_dir / "backends" / "python" / "libtriton_python.so",
        "triton_python_backend_utils.py": server_dir / "backends" / "python" / "triton_python_backend_utils.py",
        # A symbolic link, not a copy: the stub finds its bundled libcudart relative to its real location.
        "triton_python_backend_stub": stub,
    }
    for name, target in links.items():
        link = python_dir / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
    return destination


def server_binary() -> Path:
    return pytriton_server_dir() / "bin" / "tritonserver"


@dataclass(frozen=True)
class StagedModel:
    name: str
    changes: str  # unified diffs of every file the staging changed


def site_packages_prelude() -> str:
    """The first lines of a locally staged model.py: the lab's virtualenv first on sys.path, with
    its .pth files read, for the backend's interpreter, which ignores PYTHONPATH. The models import
    their runtime from there, and food11, the model module, which the virtualenv installs editable
    (a .pth file's finder)."""
    purelib = sysconfig.get_paths()["purelib"]
    return (
        "# Added by servelab for the local stack: the pip-installed Triton runs model.py in an isolated\n"
        "# interpreter that ignores PYTHONPATH, so the lab's virtualenv is put first on sys.path here,\n"
        "# with its .pth files read (food11.py, the model module, is installed editable there).\n"
        f"import site, sys; sys.path.insert(0, {purelib!r}); site.addsitedir({purelib!r})  # noqa: E401, E702\n"
    )


def _diff(before: str, after: str, name: str) -> str:
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=f"models_staging/{name}",
            tofile=f"staged/{name} (this machine)",
        )
    )


def served_config(
    model: Model, config: TritonConfig, staged_folder: Path | None = None, server: Hardware = LOCAL_TRITON
) -> TritonConfig:
    """`config` (the shipped one, or a student's edit of it) as `server` serves `model`."""
    try:
        return adapt_to_server(config, server, model.weights_info(staged_folder))
    except ConfigError as exc:
        raise StagingError(f"models_staging/{model.name} cannot be served by this Triton: {exc}") from None


def stage_model(
    model: Model,
    destination: Path,
    server: Hardware = LOCAL_TRITON,
    prelude: str | None = None,
    config: TritonConfig | None = None,
) -> StagedModel:
    """Copy one model folder to `destination`, adapted to `server`, each model.py starting with
    `prelude` (by default the local one, site_packages_prelude), its config `config` (by default
    the shipped one); returns what changed."""
    prelude = site_packages_prelude() if prelude is None else prelude
    where = f"models_staging/{model.name}"
    shutil.copytree(model.folder, destination, ignore=shutil.ignore_patterns("__pycache__"))
    adapted = served_config(model, config or model.config, destination, server)
    (destination / "config.pbtxt").write_text(adapted.text)
    changes = [model.config.diff(adapted, f"{where}/config.pbtxt", f"staged/{model.name}/config.pbtxt (this server)")]
    for version in model.version_folders(destination):
        for artifact in model.entry.artifacts if model.entry else ():
            if not (version / artifact).is_file():
                raise StagingError(
                    f"{where}/{version.name}/{artifact} is missing: run `make artifacts`, which builds it."
                )
        model_py = version / "model.py"
        if model.backend == ONNX_BACKEND and ONNX_BACKEND not in server.backends:
            if not (version / "model.onnx").is_file():
                raise StagingError(
                    f"{where}/{version.name}/model.onnx is missing: an ONNX Runtime model needs its graph."
                )
            original = ONNX_RUNNER_SOURCE.read_text()
            changes.append(
                f"+ {model.name}/{version.name}/model.py: added, a copy of servelab/{ONNX_RUNNER_SOURCE.name}\n"
            )
        elif model.backend == PYTHON_BACKEND and model_py.is_file():
            original = model_py.read_text()
        elif model.backend in server.backends and model.backend != PYTHON_BACKEND:
            continue  # a backend of the server's own runs the model's files as they are
        else:
            raise StagingError(
                f"{where}/{version.name} has no model.py: a Python-backend model needs one (see Triton's "
                "python_backend README: a class TritonPythonModel with initialize and execute)."
            )
        model_py.write_text(prelude + original)
        changes.append(_diff(original, prelude + original, f"{model.name}/{version.name}/model.py"))
    return StagedModel(model.name, "".join(changes))


def stage_model_repository(
    destination: Path,
    source: Path = paths.MODELS_STAGING_DIR,
    server: Hardware = LOCAL_TRITON,
    prelude: str | None = None,
) -> list[StagedModel]:
    """Stage every model folder of `source` into `destination` (replaced), adapted to `server`;
    returns what changed."""
    if destination.exists():
        shutil.rmtree(destination)
    destination.mkdir(parents=True)
    try:
        models = ModelRepository(source).check()
    except ModelError as exc:
        raise StagingError(str(exc)) from None
    if not models:
        raise StagingError(f"{source} holds no model folder: there is nothing for Triton to serve.")
    return [stage_model(model, destination / model.name, server, prelude) for model in models]


@dataclass(frozen=True)
class TritonPorts:
    http: int
    grpc: int
    metrics: int


def server_command(
    model_repository: Path, backend_dir: Path, ports: TritonPorts, models: list[str], binary: Path | None = None
) -> list[str]:
    """`binary` (by default the nvidia-pytriton wheel's, `server_binary`) serving `models` from
    `model_repository` on 127.0.0.1's `ports`; the GPU check passes the tritonserver it found."""
    command = [
        str(server_binary() if binary is None else binary),
        f"--model-repository={model_repository}",
        f"--backend-directory={backend_dir}",
        "--model-control-mode=explicit",
        f"--http-port={ports.http}",
        f"--grpc-port={ports.grpc}",
        f"--metrics-port={ports.metrics}",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--log-verbose=0",
    ]
    # In explicit mode nothing loads unless named; the Docker image uses --load-model=* to the same end.
    command += [f"--load-model={name}" for name in models]
    return command


# PyTorch's OpenMP threads wait for each other by spinning, each on a core. Several stubs (an
# instance each), or anything else on the machine, take a core a spinning team waits on: on 2
# shared cores (2026-11-28) MobileNetV2 with 2 threads took 115 ms spinning against 44 ms waiting
# passively; with one core busy elsewhere, food_sequence computed a frame in 1,962 ms against 64.
SPIN_FREE = {"OMP_WAIT_POLICY": "PASSIVE"}


def server_environment() -> dict[str, str]:
    """The Python backend stub embeds the system libpython; model.py's imports come from this venv.
    Its OpenMP threads wait without spinning (SPIN_FREE)."""
    return {"PYTHONPATH": sysconfig.get_paths()["purelib"], **SPIN_FREE}
