"""The lab's services as the benchmark measures them: where each served setup answers
(`Endpoints`, `address`), what they run (`runtime_versions`, `thread_plan_of`), and Triton's
models served one instance per core on a CPU (`one_instance_per_core`).
"""

from __future__ import annotations

import contextlib
import json
import platform
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata

import requests
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from servelab.bench.setups import ServedSetup
from servelab.service.cores import available_cores, thread_plan
from servelab.stack.supervision import Ports


@dataclass(frozen=True)
class Endpoints:
    fastapi_pt: str  # http://host:port
    fastapi_onnx: str
    triton_http: str  # host:port

    @classmethod
    def of(cls, ports: Ports) -> Endpoints:
        return cls(
            f"http://127.0.0.1:{ports.fastapi_pt}",
            f"http://127.0.0.1:{ports.fastapi_onnx}",
            f"127.0.0.1:{ports.triton_http}",
        )


def address(setup: ServedSetup, endpoints: Endpoints) -> str:
    return {"fastapi_pt": endpoints.fastapi_pt, "fastapi_onnx": endpoints.fastapi_onnx}.get(
        setup.name, endpoints.triton_http
    )


def runtime_versions(endpoints: Endpoints) -> dict:
    versions = {"python": platform.python_version()}
    packages = ("torch", "torchvision", "onnxruntime", "numpy", "fastapi", "uvicorn", "tritonclient", "nvidia-pytriton")
    for package in packages:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[package] = metadata.version(package)
    with contextlib.suppress(requests.RequestException, ValueError):
        server = requests.get(f"http://{endpoints.triton_http}/v2", timeout=5).json()
        versions["tritonserver"] = server.get("version", "unknown")
    return versions


def thread_plan_of(setup: ServedSetup, endpoints: Endpoints) -> str:
    """How `setup` uses the cores, as served now: FastAPI says so in /health; each instance of a
    Triton model takes the cores divided by the model's instances (its model.py), as done here, and
    logs it."""
    try:
        if not setup.model:
            return requests.get(f"{address(setup, endpoints)}/health", timeout=5).json()["threads"]
        client = triton_http.InferenceServerClient(endpoints.triton_http)
        groups = client.get_model_config(setup.model)["instance_group"]
    except (requests.RequestException, ValueError, KeyError, InferenceServerException) as exc:
        return f"unknown ({type(exc).__name__}: {exc})"
    instances = sum(group["count"] * max(1, len(group.get("gpus") or [])) for group in groups)
    device = "cpu" if all(group.get("kind") == "KIND_CPU" for group in groups) else "cuda"
    threads = max(1, available_cores() // instances)
    return thread_plan(slots=instances, threads=threads, device=device, given_by=f"{instances} instance(s)").describe()


@contextlib.contextmanager
def one_instance_per_core(triton: str, model: str) -> Iterator[None]:
    """Serve `model` with one instance per core while the block runs, when its instances are on
    the CPU (the local stack); as configured otherwise. Served as before after the block."""
    client = triton_http.InferenceServerClient(triton)
    config = client.get_model_config(model)
    if any(group.get("kind") != "KIND_CPU" for group in config.get("instance_group", [])):
        yield
        return
    per_core = {**config, "instance_group": [{"count": available_cores(), "kind": "KIND_CPU"}]}
    client.load_model(model, config=json.dumps(per_core))
    try:
        yield
    finally:
        # The served config, given back as an override too: a plain load would be skipped, since
        # the files on disk did not change.
        client.load_model(model, config=json.dumps(config))
