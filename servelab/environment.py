"""Where the lab runs: the target, the Chameleon-only guard, and the machine.

LAB_TARGET names the services the notebooks measure, wherever they run:
- `local` (the default): the lab's services as processes on this machine (servelab.stack.local);
- `compose`: the services of the Compose project (compose.yaml), reached by their service names
  from its Jupyter container, on the GPU node or on any Docker host (the CPU variant);
- `chameleon`: Chameleon's own Jupyter server, where notebooks 1 and 2 reserve and set up the GPU
  node with python-chi; the lab's services are not there.

Standard library only: notebooks 0-2 import this on Chameleon's own Jupyter server, where none
of the lab's other packages are installed.
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from pathlib import Path

TARGETS = ("local", "compose", "chameleon")


def current_target() -> str:
    target = os.environ.get("LAB_TARGET", "local")
    if target not in TARGETS:
        raise ValueError(f"LAB_TARGET={target!r}: use 'local', 'compose' or 'chameleon'")
    return target


def chameleon_only(what: str) -> bool:
    """Guard for cells that can only run on Chameleon's Jupyter server (python-chi, your
    credentials, commands on the node).

    Returns True on the chameleon target. On another target it prints that the cell was skipped
    and why, so the skip is visible in the notebook's output, never silent.
    """
    target = current_target()
    if target == "chameleon":
        return True
    print(f"[skipped on the {target} target] {what}: this needs Chameleon (set LAB_TARGET=chameleon there).")
    return False


def machine_info() -> dict:
    """CPU model, core count, GPUs (from nvidia-smi, when there is one) and platform."""
    cpu_model = platform.processor() or "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    gpus = []
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        listing = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        gpus = [line.strip() for line in listing.stdout.splitlines() if line.strip()]
    return {"cpu": cpu_model, "cores": os.cpu_count(), "gpus": gpus or ["none"], "platform": platform.platform()}


def compose_setting(name: str) -> str:
    """A setting compose.yaml gives the Jupyter container (a service's address, a shared folder)."""
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(
            f"{name} is not set. On the compose target the notebooks run in the Jupyter container of the "
            "Compose project (compose.yaml), which sets it: open them there."
        )
    return value
