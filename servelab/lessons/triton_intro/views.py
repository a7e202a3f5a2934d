"""Notebook 5's printouts: a model folder of Triton's model repository, what Triton reports it serves
beside what config.pbtxt asked for, and how the config Triton loads differs from the one shipped.

Each function returns text for the notebook to print; none talks to a server (the notebook passes
in what Triton's config endpoint returned, tritonclient's `get_model_config`), so each has a unit
test. A model's config as shipped is read from its folder in `models_staging/`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servelab.triton.adaptation import backend_of
from servelab.triton.config import TritonConfig

# A long explanation of the `weights` parameter: GourmetGram shows it, the summary leaves it out.
_LEFT_OUT_PARAMETERS = {"weights_note"}


def tree(folder: Path) -> str:
    """`folder` drawn the way the `tree` command does, each file with its size (`__pycache__` left out)."""
    lines = [f"{folder.name}/"]

    def walk(directory: Path, indent: str) -> None:
        entries = sorted(entry for entry in directory.iterdir() if entry.name != "__pycache__")
        for position, entry in enumerate(entries):
            last = position == len(entries) - 1
            branch = "└── " if last else "├── "
            if entry.is_dir():
                lines.append(f"{indent}{branch}{entry.name}/")
                walk(entry, indent + ("    " if last else "│   "))
            else:
                lines.append(f"{indent}{branch}{entry.name} ({entry.stat().st_size / 1024:,.1f} KiB)")

    walk(folder, "")
    return "\n".join(lines)


def describe_served(shipped: Path, served: Mapping[str, Any]) -> str:
    """What Triton reports it runs for a model (`served`, from its model configuration endpoint)
    beside the backend that the config.pbtxt in the model's folder as shipped (`shipped`) names:
    backend, batch size, instance groups, dynamic and sequence batching, and the config's parameters."""
    asked = TritonConfig.read(shipped / "config.pbtxt")
    lines = [
        asked.name,
        f"  backend:        config.pbtxt asks for {backend_of(asked.proto)!r}; Triton runs {served.get('backend')!r}",
        f"  max_batch_size: {served.get('max_batch_size')}",
    ]
    for group in served.get("instance_group", []):
        gpus = f" on GPUs {group['gpus']}" if group.get("gpus") else ""
        lines.append(f"  instance group: {group['count']} x {group['kind']}{gpus}")
    lines.append(f"  dynamic batching: {'on' if 'dynamic_batching' in served else 'off'}")
    if "sequence_batching" in served:  # a stateful model (notebook 11): each request is a frame of a sequence
        strategy = "direct" if "direct" in served["sequence_batching"] else "oldest"
        lines.append(f"  sequence batching: on, strategy {strategy}")
    for key, value in served.get("parameters", {}).items():
        if key not in _LEFT_OUT_PARAMETERS:
            lines.append(f"  parameter {key}: {value.get('string_value')}")
    return "\n".join(lines)


def changes_on_load(shipped: Path, served_folder: Path) -> str:
    """The diff from the config.pbtxt in a model's folder as shipped (`shipped`, in `models_staging/`)
    to the one Triton loads from `served_folder` (the model's folder in the staged repository), or
    a line saying that Triton loads it unchanged."""
    shipped_config = TritonConfig.read(shipped / "config.pbtxt", f"models_staging/{shipped.name}/config.pbtxt")
    path = served_folder / "config.pbtxt"
    loaded = TritonConfig.read(path, str(path))
    changes = shipped_config.diff(loaded, after=f"{path} (what Triton loads)")
    return changes or f"{shipped.name}: Triton loads models_staging/{shipped.name}/config.pbtxt unchanged.\n"
