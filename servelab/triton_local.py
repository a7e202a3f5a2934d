"""Run the real Triton Inference Server 2.51 on this machine, without Docker or a GPU.

The `nvidia-pytriton` wheel ships the same `tritonserver` binary as the 24.10 container image,
with its Python backend, but no other backend. This module
- builds a backend directory from the wheel's files,
- stages a copy of `models_staging/` adapted to a CPU-only machine, and prints each change:
  * every `instance_group` becomes `KIND_CPU` (a `KIND_GPU` model fails to load without a GPU);
  * `food_classifier_onnx` is served by the Python backend running the same `model.onnx` with
    ONNX Runtime (`servelab/triton_onnx_model.py`), because the onnxruntime backend is not in
    the wheel. Its config says so in a `served_by` parameter, and Triton's own model config
    endpoint reports `backend: "python"`: the difference is visible, not hidden;
  * the weights status (trained/untrained) is added as config parameters, which Triton reports.
- builds the `tritonserver` command line, with explicit model control so a single model can be
  reloaded after a config change without restarting the server.
"""

from __future__ import annotations

import difflib
import json
import logging
import re
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from servelab import paths
from servelab.food11 import WEIGHTS_INFO_SUFFIX

log = logging.getLogger(__name__)

MODEL_NAMES = ("food_classifier", "food_classifier_onnx")
ONNX_RUNNER_SOURCE = paths.SHARED_SOURCE_DIR / "triton_onnx_model.py"


def pytriton_server_dir() -> Path:
    try:
        import pytriton
    except ImportError as exc:
        raise RuntimeError(
            "nvidia-pytriton is not installed in this Python environment; run `make setup` first."
        ) from exc
    return Path(pytriton.__file__).resolve().parent / "tritonserver"


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


def _config_parameter(key: str, value: str) -> str:
    return f'parameters {{\n  key: "{key}"\n  value: {{ string_value: {json.dumps(value)} }}\n}}\n'


def adapt_config_for_cpu(config_text: str, weights_info: dict) -> str:
    """The staged config.pbtxt for a CPU-only machine with the pip-shipped Triton."""
    adapted = re.sub(r"\bKIND_GPU\b", "KIND_CPU", config_text)
    adapted = re.sub(r"^\s*gpus\s*:\s*\[[^\]]*\]\s*\n", "", adapted, flags=re.MULTILINE)
    if re.search(r'backend\s*:\s*"onnxruntime"', adapted):
        adapted = re.sub(r'backend\s*:\s*"onnxruntime"', 'backend: "python"', adapted)
        adapted += _config_parameter(
            "served_by",
            "Python backend running model.onnx with ONNX Runtime (CPU). Local adaptation: the shipped "
            'config asks for backend "onnxruntime", which the pip-installed Triton does not include.',
        )
    adapted += _config_parameter("weights", weights_info.get("weights", "unknown"))
    adapted += _config_parameter("weights_note", weights_info.get("note", ""))
    return adapted


@dataclass(frozen=True)
class StagedModel:
    name: str
    changes: str  # unified diffs of every file the staging changed


def _site_packages_prelude() -> str:
    return (
        "# Added by servelab for the local stack: the pip-installed Triton runs model.py in an isolated\n"
        "# interpreter that ignores PYTHONPATH, so the lab's virtualenv is put on sys.path here.\n"
        f"import sys; sys.path.insert(0, {sysconfig.get_paths()['purelib']!r})  # noqa: E702\n"
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


def _weights_info_for(version_dir: Path) -> dict:
    for info_path in sorted(version_dir.glob(f"*{WEIGHTS_INFO_SUFFIX}")):
        return json.loads(info_path.read_text())
    return {"weights": "unknown", "note": f"no weights record in {version_dir}"}


def stage_model_repository(destination: Path, source: Path = paths.MODELS_STAGING_DIR) -> list[StagedModel]:
    """Copy `source` to `destination`, adapting each model to this machine; returns what changed."""
    if destination.exists():
        shutil.rmtree(destination)
    staged = []
    for model_name in MODEL_NAMES:
        model_src, model_dst = source / model_name, destination / model_name
        if not (model_src / "config.pbtxt").is_file():
            raise RuntimeError(f"{model_src}/config.pbtxt is missing.")
        shutil.copytree(model_src, model_dst, ignore=shutil.ignore_patterns("__pycache__"))
        version_dir = model_dst / "1"
        original = (model_src / "config.pbtxt").read_text()
        adapted = adapt_config_for_cpu(original, _weights_info_for(version_dir))
        (model_dst / "config.pbtxt").write_text(adapted)
        changes = [_diff(original, adapted, f"{model_name}/config.pbtxt")]

        model_py = version_dir / "model.py"
        if model_py.is_file():
            original_py = model_py.read_text()
        else:
            # food_classifier_onnx now runs on the Python backend: it gets the ONNX Runtime runner.
            original_py = ONNX_RUNNER_SOURCE.read_text()
            changes.append(f"+ {model_name}/1/model.py: added, a copy of servelab/{ONNX_RUNNER_SOURCE.name}\n")
        staged_py = _site_packages_prelude() + original_py
        model_py.write_text(staged_py)
        changes.append(_diff(original_py, staged_py, f"{model_name}/1/model.py"))
        staged.append(StagedModel(model_name, "".join(changes)))
    return staged


@dataclass(frozen=True)
class TritonPorts:
    http: int
    grpc: int
    metrics: int


def server_command(model_repository: Path, backend_dir: Path, ports: TritonPorts) -> list[str]:
    command = [
        str(server_binary()),
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
    command += [f"--load-model={name}" for name in MODEL_NAMES]
    return command


def server_environment() -> dict[str, str]:
    """The Python backend stub embeds the system libpython; model.py's imports come from this venv."""
    return {"PYTHONPATH": sysconfig.get_paths()["purelib"]}
