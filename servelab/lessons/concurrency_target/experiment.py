"""Notebook 9's own experiment beyond the Lab's methods: a two-node Ray cluster on this machine."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from servelab import paths
from servelab.stack.supervision import Ports


def two_node_cluster(requests: int) -> dict[str, Any]:
    """A two-node Ray cluster on this machine, `requests` requests through its proxy
    (servelab.ray.cluster, in a process of its own, on a free port): its JSON report."""
    port = Ports.found_free().ray_serve
    command = [sys.executable, "-m", "servelab.ray.cluster", "--port", str(port), "--requests", str(requests)]
    ran = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=paths.REPO_ROOT)
    if ran.returncode != 0:
        raise RuntimeError(f"The two-node cluster failed:\n{ran.stderr[-3000:]}")
    return json.loads(ran.stdout.strip().splitlines()[-1])
