"""The Compose project and the Dockerfiles, read as Compose and Docker read them, for the static
checks of tests/test_compose_project.py, tests/test_dockerfiles.py and tests/test_docker_lock.py
(where no Docker engine runs; `make test-docker` builds and runs the CPU variant for real)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import tomllib
import yaml

from servelab import paths

REPO_ROOT = paths.REPO_ROOT
COMPOSE = REPO_ROOT / "compose.yaml"
# compose.yaml alone is the CPU variant; the GPU variant is this file over it.
GPU_OVERRIDE = REPO_ROOT / "docker" / "compose.gpu.yaml"
# The lab's images from a registry (SERVELAB_IMAGE_PREFIX), after either variant.
REGISTRY_OVERRIDE = REPO_ROOT / "docker" / "compose.registry.yaml"
# The compose-spec JSON schema, from the compose-spec repository (schema/compose-spec.json,
# Apache License 2.0), which Compose v2 validates every file against.
COMPOSE_SPEC_SCHEMA = REPO_ROOT / "tests" / "data" / "compose-spec.json"
# What each part of the lab installs (tests/test_dependencies.py checks the lock against it).
EXTRAS = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]

SERVICES = {"fastapi_pt", "fastapi_onnx", "triton", "ray_serve", "image_host", "gourmetgram", "jupyter"}
# Built, never run: the lab's PyTorch image, with the model files (docker/Dockerfile.torch).
TORCH_IMAGE = "torch"
TORCH_CONTEXT = "servelab-torch"
# Every image with CUDA libraries, and the Dockerfile that installs them: each pins cuDNN and checks
# every CUDA library against the P100.
GPU_LIBRARY_IMAGES = {"torch", "fastapi_onnx", "ray_serve", "triton", "jupyter"}
MODEL_FILES_IN_THE_TORCH_IMAGE = "/opt/servelab/models"
# Debian 12 (bookworm), pinned: the plain tag moved to Debian 13 in August 2025 (docker/Dockerfile.torch).
PYTHON_BASE_IMAGE = "python:3.11-slim-bookworm"
# 24.10: the last release whose onnxruntime backend has sm_60 code (docker/Dockerfile.triton says why).
TRITON_BASE_IMAGE = "nvcr.io/nvidia/tritonserver:24.10-py3"


class _ComposeLoader(yaml.SafeLoader):
    """YAML as Compose reads it: `!reset` drops what the files before it set (docker/compose.registry.yaml)."""


RESET = object()
_ComposeLoader.add_constructor("!reset", lambda loader, node: RESET)

_VAR_RE = re.compile(r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


class MissingVariable(ValueError):
    """A ${VAR:?message} whose variable is unset: Compose stops with the message."""


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's interpolation of the forms the project uses: ${VAR}, ${VAR:-default}, ${VAR-default},
    ${VAR:?message}."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        value, op, default = env.get(match.group("name")), match.group("op"), match.group("arg") or ""
        if op == ":?":
            if not value:
                raise MissingVariable(f"{match.group('name')}: {default}")
            return value
        if op == ":-":
            return value or default
        if op == "-":
            return default if value is None else value
        return value or ""

    return _VAR_RE.sub(replace, text)


def load(path: Path, env: dict[str, str] | None = None) -> dict:
    return yaml.load(interpolate(path.read_text(), env or {}), Loader=_ComposeLoader)


def merge(base, override):
    """Compose's merge of an override file: mappings merged key by key, `!reset` removes."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            if value is RESET:
                merged.pop(key, None)
            else:
                merged[key] = merge(base.get(key), value)
        return merged
    return override


def variant(cpu: bool, env: dict[str, str] | None = None) -> dict:
    project = load(COMPOSE, env)
    return project if cpu else merge(project, load(GPU_OVERRIDE, env))


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with comments dropped and continuation lines joined."""
    instructions, pending = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        instructions.append((keyword.upper(), args.strip()))
        pending = ""
    assert not pending, f"{path}: the last instruction ends with a line continuation"
    return instructions


def dockerfiles() -> dict[str, Path]:
    return {
        name: REPO_ROOT / service["build"]["dockerfile"] for name, service in variant(cpu=False)["services"].items()
    }


def copy_sources(args: str) -> list[str]:
    parts = json.loads(args) if args.startswith("[") else [p for p in shlex.split(args) if not p.startswith("--")]
    return parts[:-1]


def published(service: dict) -> list[tuple[str, str, str]]:
    """(host address, host port, container port) of each short-syntax port mapping."""
    return [tuple(str(mapping).split(":")) for mapping in service.get("ports", [])]


def arg_defaults(name: str) -> dict[str, str]:
    """The defaults of the ARGs of `name`'s Dockerfile, quotes removed."""
    instructions = dockerfile_instructions(dockerfiles()[name])
    return {
        key: value.strip('"')
        for keyword, args in instructions
        if keyword == "ARG" and "=" in args
        for key, value in [args.split("=", 1)]
    }
