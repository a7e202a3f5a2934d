"""Every environment variable the lab's tooling reads, read in one place, once per process.

`settings()` reads the environment the first time it is called and keeps what it read: the
notebooks, `make up`, the benchmark and the tests all take their configuration from it, and no
other module of the tooling reads a variable of the lab (the services have their own settings,
servelab/service/settings.py). A process that sets one of these variables for itself (a notebook
choosing LAB_SERVICES, the root conftest.py) does so before anything asks for the settings; a
process started later inherits what it sets.

A value the lab cannot use is an error that names the variable and says what it takes, raised
where the settings are first read. Unset, or empty, means the default. docs/settings.md's table of the
variables is generated from this class: `python -m servelab.settings --markdown` prints it, and
`python scripts/build_settings_doc.py` writes it into docs/settings.md.

Standard library only: notebooks 0-2 read LAB_SERVICES on Chameleon's own Jupyter server, where
none of the lab's other packages are installed.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servelab.profiles import PROFILES

# Where the lab's services are, as seen from the process that reads the settings.
SERVICES = ("local", "compose", "chameleon")
# What INFERENCE_DEVICE asks a runtime for, as in the services (servelab/service/devices.py).
DEVICES = ("auto", "cuda", "cpu")
NAIVE_RUNTIMES = ("pytorch", "onnxruntime")
RENAMED = {"LAB_TARGET": "LAB_SERVICES"}
# FOOD11_CHECKPOINT's one name that is not a path or URL: the original lab's trained weights, which
# servelab/stack/weights.py fetches from a fixed commit and checks by their git blob id.
ORIGINAL_CHECKPOINT = "original"


class SettingError(ValueError):
    """A variable holds a value the lab cannot use; the message names it and says what it takes."""


def _text(variable: str, raw: str) -> str:
    return raw


def _path(variable: str, raw: str) -> Path:
    return Path(raw).expanduser()


def _port(variable: str, raw: str) -> int:
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise SettingError(f"{variable}={raw!r}: set it to a TCP port, a whole number from 1 to 65535.")
    return int(raw)


def _one_of(choices: tuple[str, ...]) -> Callable[[str, str], str]:
    def parse(variable: str, raw: str) -> str:
        if raw not in choices:
            raise SettingError(f"{variable}={raw!r}: use one of {', '.join(choices)}.")
        return raw

    return parse


def _lower_one_of(choices: tuple[str, ...]) -> Callable[[str, str], str]:
    parse = _one_of(choices)
    return lambda variable, raw: parse(variable, raw.lower())


def _switch(variable: str, raw: str) -> bool:
    return _lower_one_of(("on", "off"))(variable, raw) == "on"


def _digest(digits: int, what: str) -> Callable[[str, str], str]:
    def parse(variable: str, raw: str) -> str:
        if not re.fullmatch(f"[0-9a-fA-F]{{{digits}}}", raw):
            raise SettingError(f"{variable}={raw!r}: set it to the file's {what.format(digits)}.")
        return raw.lower()

    return parse


def checkpoint_problem(checkpoint: str | None, sha256: str | None, git_blob: str | None) -> str | None:
    """What is wrong with a checkpoint and its digests taken together, or None: a path or URL takes
    exactly one digest, `original` none (it names its own), and a digest needs a checkpoint."""
    digests = "FOOD11_CHECKPOINT_SHA256 and FOOD11_CHECKPOINT_GIT_BLOB"
    if checkpoint == ORIGINAL_CHECKPOINT:
        if sha256 or git_blob:
            return (
                f"FOOD11_CHECKPOINT={ORIGINAL_CHECKPOINT} names the original lab's file with its own git blob id: "
                f"unset {digests}, or give a path or URL instead."
            )
    elif checkpoint is None:
        if sha256 or git_blob:
            return (
                "A digest of a checkpoint is set without FOOD11_CHECKPOINT: set FOOD11_CHECKPOINT to the file it "
                f"identifies (a path or URL, or `{ORIGINAL_CHECKPOINT}`), or unset {digests} to serve untrained "
                "weights."
            )
    elif sha256 and git_blob:
        return f"FOOD11_CHECKPOINT={checkpoint} is given two digests, {digests}: set exactly one of them."
    elif not (sha256 or git_blob):
        return (
            f"FOOD11_CHECKPOINT={checkpoint} was given without a digest, so a wrong file could be served: set "
            "FOOD11_CHECKPOINT_SHA256 (`sha256sum FILE`) or FOOD11_CHECKPOINT_GIT_BLOB (`git hash-object FILE`, "
            f"the id a repository lists for the file), or FOOD11_CHECKPOINT={ORIGINAL_CHECKPOINT} for the original "
            "lab's trained weights."
        )
    return None


def _setting(variable: str, default: Any, meaning: str, parse: Callable[[str, str], Any] = _text, shown: str = ""):
    """A field of Settings: the variable it is read from, what it means, and how its text is read;
    `shown` is the default as docs/settings.md says it, where the value alone would not say it."""
    metadata = {"variable": variable, "meaning": meaning, "parse": parse, "shown": shown}
    return field(default=default, metadata=metadata)


def _port_setting(service: str, default: int, what: str):
    return _setting(f"SERVELAB_PORT_{service.upper()}", default, f"the local stack's port for {what}", _port)


def _compose_setting(variable: str, what: str):
    return _setting(variable, None, f"compose: {what} (compose.yaml sets it in the Jupyter container)")


@dataclass(frozen=True)
class Settings:
    """The tooling's settings; each field is read from the variable its metadata names."""

    services: str = _setting(
        "LAB_SERVICES",
        "local",
        "where the lab's services are: `local` (processes on this machine, `make up`), `compose` (the "
        "Compose project, from its Jupyter container) or `chameleon` (Chameleon's Jupyter server, which "
        "sets up the node; notebooks 0-2 choose it there)",
        _one_of(SERVICES),
    )
    profile: str = _setting(
        "LAB_PROFILE",
        "full",
        "how long each measurement runs (servelab/profiles.py): `full`, or `quick` (CI: every experiment, "
        "short windows)",
        _one_of(tuple(sorted(PROFILES))),
    )
    lab_dir: Path | None = _setting(
        "SERVELAB_DIR",
        None,
        "everything the lab generates at run time (model files, logs, the staged Triton repository); "
        "`rm -rf` it for a full reset",
        _path,
        shown="`.lab` in the repository",
    )
    artifacts_dir: Path | None = _setting(
        "SERVELAB_ARTIFACTS_DIR",
        None,
        "the model files `make artifacts` builds (food11.pth, food11.onnx, each with its weights record), where "
        "the lab's own tools load them; the lab's images set it to the files built in its PyTorch image",
        _path,
        shown="`artifacts` in SERVELAB_DIR's folder",
    )
    stack_dir: Path | None = _setting(
        "SERVELAB_STACK_DIR",
        None,
        "the running stack's own files (logs, restarts, the staged Triton repository, Ray's token): where "
        "`make up` keeps them and a notebook finds them; the tests move them to a scratch folder",
        _path,
        shown="SERVELAB_DIR's folder",
    )
    results_dir: Path | None = _setting(
        "SERVELAB_RESULTS_DIR",
        None,
        "what the lab measured: the benchmark's reports, every notebook's runs",
        _path,
        shown="`results` in the repository",
    )
    progress: bool = _setting(
        "LAB_PROGRESS",
        True,
        "`on`: a bar with its ETA on every load a notebook or a script runs, where someone watches (a "
        "terminal, a notebook's kernel: servelab/progress.py); `off`: none",
        _switch,
        shown="`on`",
    )
    retries_file: Path | None = _setting(
        "SERVELAB_RETRIES_FILE",
        None,
        "a file each retry of the lab's tooling (servelab/retries.py) is also appended to: the tests set it for a "
        "notebook's kernel, and list its retries with their own",
        _path,
        shown="none",
    )
    answers_must_run: bool = _setting(
        "LAB_ANSWERS_MUST_RUN",
        False,
        "`on`: a perf_analyzer line typed in a notebook that gives no run stops the notebook with an error "
        "(the tests set it: the answers they run must work); `off`: it prints what to change and the cell ends",
        _switch,
        shown="`off`",
    )
    port_fastapi_pt: int = _port_setting("fastapi_pt", 8100, "FastAPI (PyTorch)")
    port_fastapi_onnx: int = _port_setting("fastapi_onnx", 8101, "FastAPI (ONNX Runtime)")
    port_triton_http: int = _port_setting("triton_http", 8200, "Triton's HTTP")
    port_triton_grpc: int = _port_setting("triton_grpc", 8201, "Triton's gRPC")
    port_triton_metrics: int = _port_setting("triton_metrics", 8202, "Triton's metrics")
    port_gourmetgram: int = _port_setting("gourmetgram", 8300, "GourmetGram")
    port_image_host: int = _port_setting("image_host", 8400, "the image host")
    port_ray_serve: int = _port_setting("ray_serve", 8500, "Ray Serve")
    port_ray_dashboard: int = _port_setting("ray_dashboard", 8501, "Ray's dashboard")
    port_ray_metrics: int = _port_setting("ray_metrics", 8502, "Ray's metrics")
    port_jupyter: int = _port_setting("jupyter", 8888, "JupyterLab")
    checkpoint: str | None = _setting(
        "FOOD11_CHECKPOINT",
        None,
        f"trained weights to serve instead of untrained ones: `{ORIGINAL_CHECKPOINT}` (the original lab's "
        "food11.pth, downloaded from GitHub at a fixed commit, checked by its git blob id), or a path or URL with "
        "one digest below; `make artifacts` builds the model files from it",
        shown="untrained weights",
    )
    checkpoint_sha256: str | None = _setting(
        "FOOD11_CHECKPOINT_SHA256",
        None,
        "FOOD11_CHECKPOINT's SHA-256, checked before anything reads the file (or the git blob id below)",
        _digest(64, "SHA-256, {} hex digits (`sha256sum FILE`)"),
    )
    checkpoint_git_blob: str | None = _setting(
        "FOOD11_CHECKPOINT_GIT_BLOB",
        None,
        "FOOD11_CHECKPOINT's git blob id (`git hash-object FILE`), checked before anything reads the file "
        "(or the SHA-256 above)",
        _digest(40, "git blob id, {} hex digits (`git hash-object FILE`)"),
    )
    image_prefix: str | None = _setting(
        "SERVELAB_IMAGE_PREFIX",
        None,
        "the registry prefix of the lab's images, pushed by an instructor (docker/compose.registry.yaml says "
        "how): where set, the node pulls them instead of building them (notebook 2, servelab/node_build.py)",
        shown="unset: the node builds them",
    )
    repo_url: str | None = _setting(
        "SERVELAB_REPO_URL",
        None,
        "the repository the GPU node clones (notebook 2), an https:// address: a fork's, or the lab's where this "
        "copy has no git history (a Trovi artifact, a download), which `repository_url()` stops on, saying so",
        shown="this clone's `origin`",
    )
    inference_device: str = _setting(
        "INFERENCE_DEVICE",
        "auto",
        "the in-process ceiling's device, as the services read it: `auto` (the GPU when the runtime has "
        "one), `cuda` or `cpu`",
        _lower_one_of(DEVICES),
    )
    naive_runtime: str = _setting(
        "NAIVE_RUNTIME",
        "pytorch",
        "the benchmark's naive reference app (servelab/bench/naive_app.py): `pytorch` or `onnxruntime`",
        _one_of(NAIVE_RUNTIMES),
    )
    triton_shared_dir: Path = _setting(
        "TRITON_SHARED_DIR",
        Path("/triton"),
        "compose: the volume Triton's container shares with the Jupyter container (staged models, log, hardware)",
        _path,
    )
    ray_shared_dir: Path | None = _setting(
        "RAY_SHARED_DIR",
        None,
        "compose: the volume Ray Serve's container shares with the Jupyter container (its token, hardware)",
        _path,
    )
    fastapi_pt_url: str | None = _compose_setting("FASTAPI_PT_URL", "FastAPI (PyTorch), http://host:port")
    fastapi_onnx_url: str | None = _compose_setting("FASTAPI_ONNX_URL", "FastAPI (ONNX Runtime), http://host:port")
    triton_http: str | None = _compose_setting("TRITON_HTTP", "Triton's HTTP, host:port")
    triton_grpc: str | None = _compose_setting("TRITON_GRPC", "Triton's gRPC, host:port")
    triton_metrics_url: str | None = _compose_setting(
        "TRITON_METRICS_URL", "Triton's metrics, http://host:port/metrics"
    )
    image_host_url: str | None = _compose_setting("IMAGE_HOST_URL", "the image host, http://host:port")
    ray_serve_url: str | None = _compose_setting("RAY_SERVE_URL", "Ray Serve, http://host:port")
    ray_dashboard_url: str | None = _compose_setting("RAY_DASHBOARD_URL", "Ray's dashboard, http://host:port")
    ray_metrics_url: str | None = _compose_setting("RAY_METRICS_URL", "Ray's metrics, http://host:port/metrics")

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Settings:
        """The settings in `environ`; SettingError naming the variable at the first bad value."""
        for old, new in RENAMED.items():
            if old in environ:
                raise SettingError(
                    f"{old} was renamed {new} (it said where the lab's services are): set {new}={environ[old]} "
                    f"instead and unset {old}."
                )
        values = {}
        for setting in dataclasses.fields(cls):
            raw = environ.get(setting.metadata["variable"], "").strip()
            if raw:
                values[setting.name] = setting.metadata["parse"](setting.metadata["variable"], raw)
        chosen = cls(**values)
        if problem := checkpoint_problem(chosen.checkpoint, chosen.checkpoint_sha256, chosen.checkpoint_git_blob):
            raise SettingError(problem)
        return chosen

    def ports(self) -> dict[str, int]:
        """Each local service's port, by service name (fastapi_pt: 8100...)."""
        names = [f.name for f in dataclasses.fields(self) if f.name.startswith("port_")]
        return {name.removeprefix("port_"): getattr(self, name) for name in names}

    def compose(self, name: str) -> str:
        """A Compose-only setting (a service's address, a shared folder), which must be set."""
        value = getattr(self, name)
        if value is None:
            variable = variable_of(name)
            raise SettingError(
                f"{variable} is not set. With LAB_SERVICES=compose the notebooks run in the Jupyter container of "
                "the Compose project (compose.yaml), which sets it: open them there."
            )
        return str(value)


def repository_url(root: Path | None = None) -> str:
    """The repository the GPU node clones: SERVELAB_REPO_URL, else the `origin` of the clone at
    `root` (this one), as an https:// address (the node has no key to clone over SSH). A
    SettingError, saying where to set it, where neither is found (a copy without git: a Trovi
    artifact, a download): never an empty URL."""
    if chosen := settings().repo_url:
        return chosen
    root = root or Path(__file__).resolve().parent.parent
    origin = ""
    if (root / ".git").exists():  # a folder in a clone, a file in a worktree
        found = subprocess.run(["git", "remote", "get-url", "origin"], cwd=root, capture_output=True, text=True)
        origin = found.stdout.strip()
    if not origin:
        raise SettingError(
            f"No repository URL: {root} has no git remote `origin` to read it from (a Trovi artifact or a "
            "download has no git history). Set SERVELAB_REPO_URL to the lab's https:// address: in notebook 2's "
            "Settings cell (REPO_URL = ...), or in the environment of the Jupyter server."
        )
    return re.sub(r"^git@([^:]+):", r"https://\1/", origin)


def variable_of(name: str) -> str:
    """The variable a Settings field is read from."""
    return next(f.metadata["variable"] for f in dataclasses.fields(Settings) if f.name == name)


@functools.cache
def settings() -> Settings:
    """This process's settings, read from its environment the first time they are asked for."""
    return Settings.from_environ(os.environ)


def markdown_table() -> str:
    """docs/settings.md's table of the variables, one row per field of Settings."""
    rows = ["| Variable | Default | Meaning | `settings()` field |", "|---|---|---|---|"]
    for setting in dataclasses.fields(Settings):
        default = setting.metadata["shown"] or ("unset" if setting.default is None else f"`{setting.default}`")
        variable, meaning = setting.metadata["variable"], setting.metadata["meaning"]
        rows.append(f"| `{variable}` | {default} | {meaning} | `{setting.name}` |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servelab.settings", description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true", help="print docs/settings.md's table of the variables")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown_table(), end="")
    else:
        for setting in dataclasses.fields(Settings):
            print(f"{setting.metadata['variable']}={getattr(settings(), setting.name)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
