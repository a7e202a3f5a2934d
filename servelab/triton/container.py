"""The Triton container's start (docker/Dockerfile.triton): stage the lab's model repository for
the server this container has, then run the server.

    python3 -m servelab.triton.container

The shipped repository (models_staging/) is mounted read-only at /models. The start stages it in
the volume the Jupyter container shares (TRITON_SHARED_DIR, /triton), with the model files of this
image (built in the lab's PyTorch image, at SERVELAB_ARTIFACTS_DIR: whatever a clone's own `make
artifacts` left in models_staging/ is not served), adapted to this container's hardware and this
server's backends (servelab.triton.server.stage_model_repository): served as
written on the GPU node's image; CPU instances where no GPU is visible; the Python backend
running an ONNX graph where the onnxruntime backend is missing (the stand-in for the image, see
docker/standins/). Each change is logged, as `make up` prints it. Beside the repository:
- hardware.json: what the server has (servelab.service.hardware), which the notebooks read to
  adapt their config edits the same way before they reload a model;
- restarts.jsonl: each time Docker restarted this container after its server exited, in the
  local stack's format (servelab.service_exits), which the notebooks read to mark the runs the
  restart interrupted.

A restart of the same container (its server crashed) serves again what it served, the configs a
notebook applied included, as the local stack's supervisor does; a new container (`docker
compose up` after `down`) stages the shipped repository afresh.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

from food11 import WEIGHTS_INFO_SUFFIX
from servelab import paths, service_exits
from servelab.service.hardware import Hardware
from servelab.settings import settings
from servelab.triton.models import model_file_places
from servelab.triton.server import StagingError, stage_model_repository

log = logging.getLogger("servelab.triton.container")

SHIPPED = Path("/models")
BACKENDS = Path("/opt/tritonserver/backends")
LOG_COPY = "/usr/local/bin/triton_log_copy.sh"
# The notebook user's group in the Jupyter image (users, 100): it may edit the staged configs.
NOTEBOOK_GROUP = 100


def shared_paths(shared: Path) -> dict[str, Path]:
    """Where the start keeps what it shares with the Jupyter container (compose.yaml mounts it)."""
    names = {
        "models": "models",
        "hardware": "hardware.json",
        "log": "triton.log",
        "exits": service_exits.EVENTS_FILE,
        "staged_by": "staged_by",
    }
    return {key: shared / name for key, name in names.items()}


def share_with_notebooks(folder: Path) -> None:
    """Let the notebook user's group write the staged configs (the start runs as root)."""
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, -1, NOTEBOOK_GROUP)
        path.chmod(path.stat().st_mode | 0o060)


def record_restart(files: dict[str, Path], container: str) -> None:
    """This container staged before: its server exited and Docker started it again."""
    tail, exited_at = "(no log)", time.time()
    if files["log"].is_file():
        tail = "\n".join(files["log"].read_text(errors="replace").splitlines()[-25:])
        exited_at = files["log"].stat().st_mtime  # the server's last words: about when it exited
    event = service_exits.ServiceExit("triton", exited_at, "exited (Docker restarted its container)", tail)
    event.detail = f"container {container}"
    service_exits.record(files["exits"], event)
    with files["log"].open("a") as log_file:  # as the local stack's log says it, before the new server's lines
        log_file.write(f"\n---- servelab: triton restarted by Docker after it {event.cause.split(' (')[0]} ----\n")
    log.warning("the server of container %s exited; serving again what it served", container)


def with_model_files(shipped: Path, built: Path, work: Path) -> Path:
    """A copy of the repository `shipped`, in `work`, with the model files in `built` (and their
    weights records) where its models load them. A file `built` lacks is a StagingError."""
    repository = work / "repository"
    shutil.copytree(shipped, repository, ignore=shutil.ignore_patterns("__pycache__"))
    for source, destination in model_file_places(repository, built):
        if not destination.parent.parent.is_dir():
            continue  # a model of the registry this repository does not ship
        if not source.is_file():
            raise StagingError(f"{source} is missing: this image was built without its model files.")
        destination.parent.mkdir(parents=True, exist_ok=True)
        for suffix in ("", WEIGHTS_INFO_SUFFIX):
            shutil.copyfile(f"{source}{suffix}", f"{destination}{suffix}")
    return repository


def prepare(
    files: dict[str, Path],
    container: str,
    backends_dir: Path = BACKENDS,
    shipped: Path = SHIPPED,
    built: Path | None = None,
) -> None:
    """Stage `shipped`, with the model files in `built` (default: the artifacts folder), for this
    server, unless this same container staged it before (a restart), which is recorded instead.
    Raises StagingError for a model folder the server cannot serve."""
    staged_by = files["staged_by"].read_text().strip() if files["staged_by"].is_file() else None
    if staged_by == container:
        record_restart(files, container)
        return
    backends = tuple(path.name for path in backends_dir.iterdir() if path.is_dir()) if backends_dir.is_dir() else ()
    server = Hardware.here(backends)
    built = built or paths.ARTIFACTS_DIR
    log.info(
        "Triton on %s: staging %s with the model files in %s, in %s", server.describe(), shipped, built, files["models"]
    )
    with tempfile.TemporaryDirectory() as work:
        repository = with_model_files(shipped, built, Path(work))
        for model in stage_model_repository(files["models"], repository, server, prelude=""):
            if model.changes:
                log.info("Triton model %s, adapted for this server:\n%s", model.name, model.changes)
    share_with_notebooks(files["models"])
    server.write(files["hardware"])
    files["exits"].unlink(missing_ok=True)
    files["log"].unlink(missing_ok=True)  # a new container's server starts a new log
    files["staged_by"].write_text(container + "\n")


def main() -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    files = shared_paths(settings().triton_shared_dir)
    try:
        # Docker names a container's host after its ID: a restart keeps it, a new container does not.
        prepare(files, socket.gethostname())
    except StagingError as exc:
        log.error("%s", exc)
        return 2
    # Explicit model control: a notebook edits one model's config.pbtxt and reloads that model
    # through the repository API, without restarting the server. In explicit mode nothing loads
    # unless asked for; --load-model=* (which must be the only --load-model) loads every model.
    command = [LOG_COPY, "tritonserver", f"--model-repository={files['models']}", "--model-control-mode=explicit"]
    command.append("--load-model=*")
    os.environ["TRITON_LOG_FILE"] = str(files["log"])
    os.execv(LOG_COPY, command)


if __name__ == "__main__":
    sys.exit(main())
