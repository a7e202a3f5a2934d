"""Serve's REST API on Ray's dashboard, as a client calls it: deploy a config, read each
application's deployments and replicas. Ray 2.60 protects it with a token, which the launcher
(servelab.ray.local) writes to a file only this user can read; every request carries it.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import requests

from servelab import paths

TOKEN_FILE = paths.RAY_DIR / "auth_token"


class RayConfigError(ValueError):
    """A Serve config the lab cannot deploy; the message says what to change."""


def auth_headers(token_file: Path = TOKEN_FILE) -> dict[str, str]:
    """The header Ray's dashboard and Serve's REST API want from a client."""
    try:
        return {"Authorization": f"Bearer {token_file.read_text().strip()}"}
    except FileNotFoundError:
        raise RayConfigError(f"{token_file} is missing: is the Ray Serve service (make up) running?") from None


def deploy(dashboard: str, config: dict[str, Any], token_file: Path = TOKEN_FILE, timeout_s: float = 30.0) -> None:
    """Hand `config` to Serve's REST API (`PUT /api/serve/applications/`, what `serve deploy`
    does): Serve then brings the applications to it, replacing what ran before."""
    url = f"{dashboard}/api/serve/applications/"
    response = requests.put(url, json=config, headers=auth_headers(token_file), timeout=timeout_s)
    if response.status_code != 200:
        raise RayConfigError(f"Ray Serve refused the config ({response.status_code}): {response.text[:2000]}")


def applications(dashboard: str, token_file: Path = TOKEN_FILE) -> dict[str, Any]:
    """Serve's own account of its applications (`GET /api/serve/applications/`): each
    deployment's status and its replicas, each with its state and node."""
    url = f"{dashboard}/api/serve/applications/"
    response = requests.get(url, headers=auth_headers(token_file), timeout=10)
    response.raise_for_status()
    return response.json()["applications"]


def replicas_by_state(
    dashboard: str, application: str, deployment: str, token_file: Path = TOKEN_FILE
) -> dict[str, int]:
    """How many replicas of `deployment` are in each state (RUNNING, STARTING, STOPPING...)."""
    found = applications(dashboard, token_file).get(application, {}).get("deployments", {}).get(deployment, {})
    return dict(collections.Counter(replica["state"] for replica in found.get("replicas", [])))
