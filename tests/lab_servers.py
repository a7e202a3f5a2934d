"""The lab's real servers for a test session, shared by the tests and the notebooks: each started
once, the first time a test or a notebook needs it, on free 127.0.0.1 ports, and stopped as the
session ends. A pytest plugin that the root conftest.py loads, so that `pytest --nbmake
notebooks/*.ipynb`, which collects nothing under tests/, gets the same servers.

The session's stack is the lab as `make up` runs it (image host, both FastAPI services, Triton;
Ray Serve and GourmetGram when first asked for). Its ports are exported as SERVELAB_PORT_* and its
files live under SERVELAB_STACK_DIR (a scratch folder the root conftest.py sets), so a notebook's
`Lab.connect()` finds it, as a student's notebook finds `make up`, and a running `make up` on the
default ports is never disturbed.

A test asks for the servers with fixtures (`model_servers`, `ray_serve`, `gourmetgram`...), each of
which depends on one of SESSION_SERVER_FIXTURES: a test that uses one without being marked
integration fails before anything starts (the root conftest.py). nbmake's
item for a notebook is not a test function, and pytest gives fixtures to test functions only, so
this plugin's runtest hooks give a notebook the same servers, with LAB_SERVICES=local: the stack to
one that calls `Lab.connect(`, Ray Serve too to one that calls `lab.ray_serve()`. With
LAB_SERVICES=compose (the Jupyter container), the notebooks use the Compose project's services and
nothing is started here.

A test or a notebook that changes how a shared server serves (a Triton model's config, Ray Serve's
deployment) puts it back itself; after each one, the suite checks that it did, names the one that
did not, and restores the server, so that the next starts from the shipped state.

Every retry the lab's tooling makes (servelab.retries) is listed at the session's end with the test
or notebook it happened in; a notebook's kernel is another process, which appends its own to a file
(SERVELAB_RETRIES_FILE) read back here.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import tritonclient.http as triton_http

from servelab import paths, retries
from servelab.lab.ray_side import RayServe, serve_at
from servelab.lab.triton_configs import MODEL_LOAD_TIMEOUT_S
from servelab.ray import rest as ray_rest
from servelab.settings import settings
from servelab.stack import artifacts
from servelab.stack.catalogue import (
    fastapi_service,
    gourmetgram_service,
    image_host_service,
    ray_serve_service,
    triton_service,
)
from servelab.stack.supervision import LocalStack, Ports, ServiceSpec, start_on_free_ports
from tests.helpers import TEST_MAX_REQUEST_BYTES


def export_ports(ports: Ports, names: tuple[str, ...]) -> None:
    """Tell the processes started from now on (notebook kernels) where the session's services are."""
    for name in names:
        os.environ[f"SERVELAB_PORT_{name.upper()}"] = str(getattr(ports, name))


@dataclass
class SessionStack:
    stack: LocalStack
    ports: Ports


@contextlib.contextmanager
def started_stack() -> Iterator[SessionStack]:
    """The image host, both FastAPI services and Triton, started together."""
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
    # Triton's state alone: Ray Serve's shipped state was taken as it started, and a module may have
    # deployed its own config since (tests/test_ray_serve.py run on its own starts Triton after).
    SHARED.shipped["triton"] = SHARED.state()["triton"]
    export_ports(ports, ("image_host", "fastapi_pt", "fastapi_onnx", "triton_http", "triton_grpc", "triton_metrics"))
    try:
        yield SessionStack(stack, ports)
    finally:
        SHARED.triton = None
        stack.stop()


@dataclass
class SessionRay:
    """The session's Ray Serve: its stack (for its processes) and the lab's client of it."""

    stack: LocalStack
    serve: RayServe


@contextlib.contextmanager
def started_ray() -> Iterator[SessionRay]:
    """Ray Serve as `make up` runs it (the shipped config, adapted to this machine)."""
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


class SessionServers:
    """The servers the session's tests and notebooks share, each started the first time one asks
    for it; `stop` stops them all, the last started first."""

    def __init__(self) -> None:
        self._running = contextlib.ExitStack()
        self._artifacts: artifacts.BuiltArtifacts | None = None
        self._stack: SessionStack | None = None
        self._ray: SessionRay | None = None

    def artifacts(self) -> artifacts.BuiltArtifacts:
        if self._artifacts is None:
            self._artifacts = artifacts.ensure_artifacts()
        return self._artifacts

    def stack(self) -> SessionStack:
        if self._stack is None:
            self.artifacts()
            self._stack = self._running.enter_context(started_stack())
        return self._stack

    def ray(self) -> SessionRay:
        if self._ray is None:
            self.artifacts()
            self._ray = self._running.enter_context(started_ray())
        return self._ray

    def stop(self) -> None:
        self._running.close()


SERVERS = SessionServers()
# The fixtures that start SERVERS' servers; every other fixture that reaches one depends on one of
# them (model_servers, ports, gourmetgram, the URLs of tests/conftest.py...).
SESSION_SERVER_FIXTURES = {"session_stack", "ray_serve"}


def pytest_sessionfinish() -> None:
    SERVERS.stop()


@pytest.fixture(scope="session")
def built_artifacts() -> artifacts.BuiltArtifacts:
    return SERVERS.artifacts()


@pytest.fixture(scope="session")
def session_stack() -> SessionStack:
    return SERVERS.stack()


@pytest.fixture(scope="session")
def model_servers(session_stack) -> LocalStack:
    return session_stack.stack


@pytest.fixture(scope="session")
def ports(session_stack) -> Ports:
    return session_stack.ports


@pytest.fixture(scope="session")
def ray_serve() -> SessionRay:
    """Started the first time a test or a notebook needs it, then shared by all of them."""
    return SERVERS.ray()


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


# ---- the shared servers are left as the test or notebook found them ----------------------------


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
                loading = triton_http.InferenceServerClient(self.triton, network_timeout=MODEL_LOAD_TIMEOUT_S)
                loading.load_model(name, config=config)
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


class RetryLog(logging.Handler):
    """The retries made in this process (servelab.retries), each with the test it happened in."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []
        self.test = "(no test)"

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{self.test}: {record.getMessage()}")


RETRIES = RetryLog()
logging.getLogger(retries.log.name).addHandler(RETRIES)


def pytest_runtest_logstart(nodeid: str) -> None:
    RETRIES.test = nodeid


def pytest_terminal_summary(terminalreporter) -> None:
    terminalreporter.section(f"retries: {len(RETRIES.lines)}")
    for line in RETRIES.lines:
        terminalreporter.write_line(line)


# ---- a notebook run by nbmake gets the servers a test gets ------------------------------------

SERVED_BEFORE = pytest.StashKey[dict]()  # what the shared servers served as a notebook started


def is_notebook(item: pytest.Item) -> bool:
    """nbmake's item for a notebook, as the root conftest.py marks it."""
    return item.get_closest_marker("notebook") is not None


def pytest_runtest_setup(item: pytest.Item) -> None:
    if not is_notebook(item) or settings().services != "local":
        return
    source = item.path.read_text()
    if "Lab.connect(" not in source:
        return  # notebooks 0-2, which use no service of the lab
    SERVERS.stack()
    if "lab.ray_serve()" in source:
        SERVERS.ray()
    item.stash[SERVED_BEFORE] = SHARED.state()


@pytest.hookimpl(trylast=True)  # after pytest's own teardown, which an error here would skip
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """As `unchanged_servers` does for a test; an error at the notebook's teardown names it."""
    if SERVED_BEFORE in item.stash:
        left = SHARED.put_back(item.stash[SERVED_BEFORE], item.nodeid)
        assert not left, f"the notebook left {', '.join(left)} changed: a notebook puts back what it changes"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A notebook's kernel, started by nbmake in this phase, appends its retries to a file of its own.
    This process read its own settings before (pytest_runtest_setup): its retries go to the log alone."""
    if not is_notebook(item):
        return (yield)
    with tempfile.TemporaryDirectory(prefix="servelab-retries-") as folder:
        record = Path(folder) / "retries.log"
        os.environ["SERVELAB_RETRIES_FILE"] = str(record)
        try:
            return (yield)
        finally:
            del os.environ["SERVELAB_RETRIES_FILE"]
            if record.exists():
                RETRIES.lines += [f"{item.nodeid}: {line}" for line in record.read_text().splitlines()]
