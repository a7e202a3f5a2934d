"""Compose's .env in the node's clone: which Compose files it runs (the GPU variant, and a
registry's file where the images are pulled), and the weights the model files are built from.
Compose reads it for every command run in the clone, the student's own too.

Standard library only, like servelab.node_build, which reads it on the node.
"""

from __future__ import annotations

import os
from pathlib import Path

from servelab.settings import Settings

# The node's Compose files, which .env names (COMPOSE_FILE): compose.yaml, the lab on any machine's
# CPU, with the GPU variant over it; and where the images come from a registry, its file last.
GPU_FILES = "compose.yaml:docker/compose.gpu.yaml"
REGISTRY_FILES = f"{GPU_FILES}:docker/compose.registry.yaml"


def env_file(weights: str, image_prefix: str = "") -> str:
    """The clone's .env, which Compose reads for every command run there (the student's own too):
    the GPU variant's files, the weights the model files are built from, and where set, the
    registry the images come from."""
    lines = [f"FOOD11_CHECKPOINT={weights}"]
    if image_prefix:
        lines += [f"SERVELAB_IMAGE_PREFIX={image_prefix}", f"COMPOSE_FILE={REGISTRY_FILES}"]
    else:
        lines.append(f"COMPOSE_FILE={GPU_FILES}")
    return "\n".join(lines) + "\n"


def image_prefix(repo: Path) -> str | None:
    """SERVELAB_IMAGE_PREFIX, from this process's environment or else the clone's .env, as Compose reads it."""
    dotenv = repo / ".env"
    pairs = [line.split("=", 1) for line in dotenv.read_text().splitlines()] if dotenv.is_file() else []
    settings = {key.strip(): value.strip() for key, value in (pair for pair in pairs if len(pair) == 2)}
    return Settings.from_environ({**settings, **os.environ}).image_prefix
