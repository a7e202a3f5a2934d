"""Where the lab's services are (LAB_SERVICES: local, compose or chameleon; servelab.settings says
what each means), and the guard of the cells that run on Chameleon only.

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
