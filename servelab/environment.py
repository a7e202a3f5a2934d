"""Where the lab's services are, and the Chameleon-only guard.

LAB_SERVICES (servelab.settings) says where the services the notebooks measure are:
- `local` (the default): the lab's services as processes on this machine (servelab.stack);
- `compose`: the services of the Compose project (compose.yaml), reached by their service names
  from its Jupyter container, on the GPU node or on any Docker host (the CPU variant);
- `chameleon`: Chameleon's own Jupyter server, where notebooks 1 and 2 reserve and set up the GPU
  node with python-chi; the lab's services are not there.

Standard library only: notebooks 0-2 import this on Chameleon's own Jupyter server, where none
of the lab's other packages are installed.
"""

from __future__ import annotations

from servelab.settings import settings


def current_services() -> str:
    """Where the lab's services are: "local", "compose" or "chameleon" (LAB_SERVICES)."""
    return settings().services


def chameleon_only(what: str) -> bool:
    """Guard for cells that can only run on Chameleon's Jupyter server (python-chi, your
    credentials, commands on the node).

    Returns True with LAB_SERVICES=chameleon. Otherwise it prints that the cell was skipped and
    why, so the skip is visible in the notebook's output, never silent.
    """
    services = current_services()
    if services == "chameleon":
        return True
    print(f"[skipped with LAB_SERVICES={services}] {what}: this needs Chameleon (set LAB_SERVICES=chameleon there).")
    return False
