"""Shared fixtures: the lab's real servers, each started once for the whole session, on free
127.0.0.1 ports, and stopped at its end.

The session's stack is the lab as `make up` runs it (image host, both FastAPI services, Triton;
Ray Serve and GourmetGram when a test first asks for them). Its ports are exported as
SERVELAB_PORT_* and its files live under SERVELAB_STACK_DIR (a scratch folder the root conftest.py
sets), so a notebook run by the suite finds it with `Lab.connect()`, as a student's notebook finds
`make up`, and a running `make up` on the default ports is never disturbed.

A test that changes how a shared server serves (a Triton model's config, Ray Serve's deployment)
puts it back itself; `unchanged_servers` checks after every test that it did, names the test
that did not, and restores the server so that the next test starts from the shipped state.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import requests
import tritonclient.http as triton_http

from servelab import paths, retries
from servelab.lab.ray_side import RayServe, serve_at
from servelab.ray import rest as ray_rest
from servelab.stack import artifacts
from servelab.stack.local import (
    LocalStack,
    Ports,
    ServiceSpec,
    fastapi_service,
    gourmetgram_service,
    image_host_service,
    ray_serve_service,
    start_on_free_ports,
    triton_service,
)
from tests.helpers import RETRIES, TEST_MAX_REQUEST_BYTES, make_image_bytes


@pytest.fixture(scope="session")
def built_artifacts():
    return artifacts.ensure_artifacts()


@pytest.fixture(scope="session")
def test_images() -> list[bytes]:
    return [make_image_bytes(seed) for seed in range(6)]


@pytest.fixture(scope="session")
def image_b64(test_images) -> str:
    return base64.b64encode(test_images[0]).decode()


def export_ports(ports: Ports, names: tuple[str, ...]) -> None:
    """Tell the processes started from now on (notebook kernels) where the session's services are."""
    for name in names:
        os.environ[f"SERVELAB_PORT_{name.upper()}"] = str(getattr(ports, name))


@dataclass
class SessionStack:
    stack: LocalStack
    ports: Ports


@pytest.fixture(scope="session")
def session_stack(built_artifacts) -> Iterator[SessionStack]:
    """The image host, both FastAPI services and Triton, started together once for the session."""
    logging.getLogger("servelab").setLevel(logging.INFO)
    limit = {"MAX_REQUEST_BYTES": str(TEST_MAX_REQUEST_BYTES)}

    def services(ports: Ports) -> list[ServiceSpec]:
        return [
            image_host_service(ports.image_host),
            fastapi_service("pt", ports.fastapi_pt, env=limit, image_host_port=ports.image_host),
            fastapi_service("onnx", ports.fastapi_onnx, env=limit, image_host_port=ports.image_host),
            triton_service(ports.triton),
        ]

    stack, ports = start_on_free_ports(services, paths.LOG_DIR)
    SHARED.triton = f"127.0.0.1:{ports.triton_http}"
    SHARED.shipped.update(SHARED.state())
    export_ports(ports, ("image_host", "fastapi_pt", "fastapi_onnx", "triton_http", "triton_grpc", "triton_metrics"))
    try:
        yield SessionStack(stack, ports)
    finally:
        SHARED.triton = None
        stack.stop()


@pytest.fixture(scope="session")
def model_servers(session_stack) -> LocalStack:
    return session_stack.stack


@pytest.fixture(scope="session")
def ports(session_stack) -> Ports:
    return session_stack.ports


@pytest.fixture(scope="session")
def fastapi_urls(ports) -> dict[str, str]:
    return {"pt": f"http://127.0.0.1:{ports.fastapi_pt}", "onnx": f"http://127.0.0.1:{ports.fastapi_onnx}"}


@pytest.fixture(scope="session")
def triton_http_url(ports) -> str:
    return f"127.0.0.1:{ports.triton_http}"


@pytest.fixture(scope="session")
def triton_grpc_url(ports) -> str:
    return f"127.0.0.1:{ports.triton_grpc}"


@dataclass
class SessionRay:
    """The session's Ray Serve: its stack (for its processes) and the lab's client of it."""

    stack: LocalStack
    serve: RayServe


@pytest.fixture(scope="session")
def ray_serve(built_artifacts) -> Iterator[SessionRay]:
    """Ray Serve as `make up` runs it (the shipped config, adapted to this machine), started the
    first time a test or a notebook needs it, then shared by all of them."""
    stack, ports = start_on_free_ports(
        lambda ports: [ray_serve_service(ports, token_file=ray_rest.TOKEN_FILE)], paths.LOG_DIR
    )
    export_ports(ports, ("ray_serve", "ray_dashboard", "ray_metrics"))
    SHARED.serve = serve_at(ports, ray_rest.TOKEN_FILE)
    SHARED.shipped["ray"] = SHARED.serve.deployed_app()
    try:
        yield SessionRay(stack, SHARED.serve)
    finally:
        SHARED.serve = None
        stack.stop()


class GourmetGrams:
    """GourmetGram in front of each backend asked for, one process per backend for the session."""

    def __init__(self, backends: Ports) -> None:
        self.backends = backends
        self.urls: dict[tuple[str, Ports], str] = {}
        self.first_health: dict[str, dict] = {}  # url -> its /healthz before any request
        self.stacks: list[LocalStack] = []

    def __call__(self, backend: str, backend_ports: Ports | None = None) -> str:
        key = (backend, backend_ports or self.backends)
        if key not in self.urls:
            stack, own = start_on_free_ports(
                lambda own: [gourmetgram_service(own.gourmetgram, backend, key[1])],
                paths.LOG_DIR / f"gourmetgram-{len(self.stacks)}",
            )
            self.stacks.append(stack)
            url = self.urls[key] = f"http://127.0.0.1:{own.gourmetgram}"
            self.first_health[url] = requests.get(f"{url}/healthz", timeout=10).json()
        return self.urls[key]


@pytest.fixture(scope="session")
def gourmetgram(model_servers, ports) -> Iterator[GourmetGrams]:
    started = GourmetGrams(ports)
    try:
        yield started
    finally:
        for stack in started.stacks:
            stack.stop()


# ---- the shared servers are left as the test found them --------------------------------------


class SharedServers:
    """What the session's shared servers serve: Triton's ready models (each one's config as served
    and its file in the repository) and Ray Serve's deployed app, once each has started. A test
    or a module that changes them puts them back; `put_back` finds what it did not, and undoes it."""

    def __init__(self) -> None:
        self.triton: str | None = None  # host:port, once the session's Triton runs
        self.serve: RayServe | None = None
        self.shipped: dict = {}  # the state as each server started

    def state(self) -> dict:
        found = {}
        if self.triton:
            client = triton_http.InferenceServerClient(self.triton)
            index = client.get_model_repository_index()
            found["triton"] = {
                entry["name"]: (
                    json.dumps(client.get_model_config(entry["name"]), sort_keys=True),
                    (paths.TRITON_DIR / "models" / entry["name"] / "config.pbtxt").read_text(),
                )
                for entry in index
                if entry.get("state") == "READY"
            }
        if self.serve:
            found["ray"] = self.serve.deployed_app()
        return found

    def put_back(self, expected: dict, who: str) -> list[str]:
        """Serve as in `expected` again; returns what had changed."""
        now, changed = self.state(), []
        for name, (config, file) in expected.get("triton", {}).items():
            if now.get("triton", {}).get(name) != (config, file):
                changed.append(f"Triton's {name}")
                retries.note(f"loading {name} as it was served before {who}", "its config had changed")
                (paths.TRITON_DIR / "models" / name / "config.pbtxt").write_text(file)
                triton_http.InferenceServerClient(self.triton).load_model(name, config=config)
        if "ray" in expected and now.get("ray") != expected["ray"]:
            changed.append("Ray Serve's deployment")
            retries.note(f"deploying Ray Serve's config as it was before {who}", "it had changed")
            self.serve.redeploy(expected["ray"])
        return changed


SHARED = SharedServers()


@pytest.fixture(autouse=True)
def unchanged_servers(request) -> Iterator[None]:
    """A test that uses a shared server leaves it serving as it found it."""
    if not {"model_servers", "ray_serve"} & set(request.fixturenames):
        yield
        return
    before = SHARED.state()
    yield
    left = SHARED.put_back(before, request.node.nodeid)
    assert not left, f"the test left {', '.join(left)} changed: a test puts back what it changes"


@pytest.fixture(scope="module", autouse=True)
def unchanged_servers_after_each_module(request) -> Iterator[None]:
    """The same for a module's own fixtures (a config for all its tests): as shipped once it ends."""
    yield
    left = SHARED.put_back(SHARED.shipped, request.node.nodeid)
    assert not left, f"{request.node.nodeid} left {', '.join(left)} changed after its last test"


# ---- every retry is listed at the end ------------------------------------------------------------


logging.getLogger(retries.log.name).addHandler(RETRIES)


def pytest_runtest_logstart(nodeid: str) -> None:
    RETRIES.test = nodeid


def pytest_terminal_summary(terminalreporter) -> None:
    terminalreporter.section(f"retries: {len(RETRIES.lines)}")
    for line in RETRIES.lines:
        terminalreporter.write_line(line)


# ---- lanes and order ---------------------------------------------------------------------------

# Fixtures that start real server processes: the session's, and those of single modules (the load
# generator's synthetic server, the image host and services of tests/test_image_url.py...).
SERVER_FIXTURES = {
    "session_stack", "ray_serve", "gourmetgram", "server", "image_host", "service", "redirector", "held_image",
}  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark what runs real servers or runtimes (`make test-fast` leaves it out), and run the
    notebooks last: they take longest, and a broken unit is better found first."""
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("notebook"):
            item.add_marker(pytest.mark.integration)
    items.sort(key=lambda item: item.get_closest_marker("notebook") is not None)
