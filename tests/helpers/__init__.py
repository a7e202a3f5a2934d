"""What the tests share (a test module imports this, never another test module or a conftest):
waiting on a state, never on a sleep a busy machine can outlast; a load judged only where its
generator kept its schedule; test images; the bad requests
every predict service must refuse; a prediction service in this process, with a model that answers
at once; a toy service for the supervisor; synthetic runs for the lessons' checks; the lock's pins;
a module that is a file outside every package.
A bare GPU machine, simulated for the GPU check's commands: tests/helpers/bare_machine.py."""

from __future__ import annotations

import base64
import importlib.util
import io
import math
import socket
import sys
import textwrap
import threading
import time
import types
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import httpx
import numpy as np
import pytest
import requests
from packaging.utils import canonicalize_name
from packaging.version import Version
from PIL import Image

from food11 import LABELS
from servelab import paths, retries

if TYPE_CHECKING:
    from servelab.results import RunResult

T = TypeVar("T")


def until(check: Callable[[], T], timeout_s: float, what: str, every_s: float = 0.01) -> T:
    """Poll `check` until it returns something true, and return that; fail naming `what` (the
    state waited for) after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s:g} s for {what}")
        time.sleep(every_s)
    return found


R = TypeVar("R", bound="RunResult")
TRIES = 5  # a run is a second or two: a busy machine may hold several of them up in a row


def kept_schedule(measure: Callable[[], R], tries: int = TRIES) -> R:
    """The first run of `measure` whose load generator kept its schedule (`schedule_lag`,
    servelab.loadgen.lag). A run the generator reports late (the shared machine held it up) is
    measured again, up to `tries` times in all: its times include the generator's own wait, so a
    bound on them would judge the machine, not the code. Fails with the generator's own words
    when every try fell behind."""
    said = []
    for _ in range(tries):
        result = measure()
        assert result.schedule_lag is not None, f"{result.mode} runs report their schedule lag"
        if not result.schedule_lag["fell_behind"]:
            return result
        said.append(result.schedule_lag["message"])
        retries.note(f"the {result.mode} run against {result.name}", said[-1])
    pytest.fail(f"the load generator fell behind its schedule in all {tries} runs: " + " | ".join(said))


def synthetic_run(
    name: str = "t",
    concurrency: int | None = 1,
    throughput_rps: float = 10.0,
    mean_ms: float = 100.0,
    p50_ms: float | None = None,
    **fields,
):
    """A RunResult with the figures a lesson's check reads, for feeding it a passing or a failing
    case; `fields` sets any other field (service_stats, server_breakdown, triton_stats...)."""
    from servelab.results import LatencySummary, RunResult

    p50 = mean_ms if p50_ms is None else p50_ms
    latency = LatencySummary(mean_ms, p50, 1.2 * p50, 1.3 * p50, 1.5 * p50, 2 * p50)
    mode = fields.pop("mode", "closed" if concurrency else "open")
    tool, sent, wall_s = fields.pop("tool", "loadgen"), fields.pop("requests", 100), fields.pop("wall_s", 10.0)
    return RunResult(name, tool, mode, sent, throughput_rps, latency, wall_s, concurrency=concurrency, **fields)


def service_stages(**means_ms: float) -> dict:
    """A FastAPI service's account of a run (`RunResult.service_stats`) with these stage means."""
    stages = {"download": float("nan"), "slot_wait": 0.0, "preprocess": 0.0, "inference": 0.0}
    return {"stage_mean_ms": {**stages, **means_ms}}


# ---- images and requests -----------------------------------------------------------------------

# Small enough to test 413 with a modest body, large enough for every real test image.
TEST_MAX_REQUEST_BYTES = 2_000_000


def closed_port() -> int:
    """A local port nothing listens on: bind to get a free one, then close it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def make_image_bytes(seed: int, size=(320, 240), fmt="JPEG") -> bytes:
    """A deterministic, textured test image (smooth gradients plus noise), encoded as `fmt`."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0 : size[1], 0 : size[0]]
    base = rng.uniform(0, 255, 3)
    freq = rng.uniform(0.01, 0.08, 3)
    pixels = np.stack([base[c] / 2 + 60 * np.sin(freq[c] * (x + 2 * y)) for c in range(3)], axis=-1)
    pixels += rng.normal(0, 25, pixels.shape)
    buffer = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buffer, fmt)
    return buffer.getvalue()


def still_serves(url: str, image_b64: str) -> None:
    response = requests.post(f"{url}/predict", json={"image": image_b64}, timeout=30)
    assert response.status_code == 200, response.text


# Every bad request and the status it gets, from both FastAPI services and the Ray Serve app alike.
BAD_REQUESTS = pytest.mark.parametrize(
    "body, headers, status",
    [
        (b"{not json", {"content-type": "application/json"}, 422),
        (b'{"picture": "abc"}', {"content-type": "application/json"}, 422),
        (b'{"image": 12}', {"content-type": "application/json"}, 422),
        (b'{"image": ""}', {"content-type": "application/json"}, 422),
        (b'{"image": "%%% not base64 %%%"}', {"content-type": "application/json"}, 400),
        (b'{"image": "' + base64.b64encode(b"hello, I am text") + b'"}', {"content-type": "application/json"}, 400),
    ],
    ids=["malformed-json", "missing-field", "wrong-type", "empty-image", "bad-base64", "not-an-image"],
)


def check_bad_request(url: str, image_b64: str, body: bytes, headers: dict, status: int) -> None:
    response = requests.post(f"{url}/predict", data=body, headers=headers, timeout=30)
    assert response.status_code == status
    detail = response.json()["detail"]
    assert detail, "the error must say what went wrong"
    if status == 400:
        assert "JPEG or PNG" in detail or "base64" in detail
    still_serves(url, image_b64)


# ---- a prediction service in this process (the fast lane's) -------------------------------------
# fastapi_pt's or fastapi_onnx's own app.py, imported here with the settings a test gives, from its start-up
# to its shutdown (its lifespan), asked over httpx's ASGI transport: no socket, no server process. Its model
# answers at once, always the same class: what the HTTP side does with a request does not depend on the
# model (tests/test_fastapi_services.py runs the real models). Images sent by URL come from a photo host on
# a thread of this process, as test_weights.py's file server does: a stand-in for the lab's image host, over
# real HTTP on 127.0.0.1.

FLAVORS = ("pt", "onnx")
LIMIT_BYTES = 1_000_000  # MAX_REQUEST_BYTES of the service in this process: every test image fits
# A model file with no weights record beside it: /health says its weights are unknown.
MODEL_FILE = Path("instant-model.onnx")
WHERE = {"runtime": "instant (a test's stand-in)", "device": "cpu", "device_asked": "cpu", "device_fallback": None}
# Every variable a service reads (docs/settings.md): none is taken from the environment of the tests.
SERVICE_VARIABLES = (
    "WEB_CONCURRENCY",
    "PREDICT_CONCURRENCY",
    "INFERENCE_THREADS",
    "INFERENCE_DEVICE",
    "MAX_REQUEST_BYTES",
    "IMAGE_URL_ALLOWED_HOSTS",
    "IMAGE_DOWNLOAD_TIMEOUT_S",
    "IMAGE_DOWNLOAD_PLACEMENT",
    "ABANDON_ON_DISCONNECT",
    "FOOD11_MODEL_PATH",
    "PROMETHEUS_MULTIPROC_DIR",
)


class InstantModel:
    """Answers at once: every image is LABELS[3], logit 2 against 0 for the other ten classes; it
    keeps the shape and type of every batch it ran. With `fails`, every inference raises."""

    label = LABELS[3]
    probability = math.exp(2) / (math.exp(2) + 10)  # the softmax of those logits

    def __init__(self, fails: bool = False) -> None:
        self.fails = fails
        self.batches: list[tuple[tuple[int, ...], np.dtype]] = []

    def load(self) -> tuple[InstantModel, dict]:
        """As an app's load_model: the model, and where it runs (proved in 0.1 ms)."""
        return self, {**WHERE, "first_inference_ms": 0.1}

    def run(self, model: InstantModel, batch: np.ndarray) -> np.ndarray:
        """As an app's run: logits [N, 11] for a batch [N, 3, 224, 224]."""
        self.batches.append((batch.shape, batch.dtype))
        if self.fails:
            raise RuntimeError("the model failed")
        logits = np.zeros((len(batch), len(LABELS)), np.float32)
        logits[:, 3] = 2.0
        return logits


def service_settings(allowed_hosts: str = "", **settings: str) -> dict[str, str]:
    """A service's environment: one inference slot of one thread, the test's request size limit, images by
    URL from `allowed_hosts`; `settings` by variable name."""
    least = {"PREDICT_CONCURRENCY": "1", "INFERENCE_THREADS": "1", "MAX_REQUEST_BYTES": str(LIMIT_BYTES)}
    return {**least, "IMAGE_URL_ALLOWED_HOSTS": allowed_hosts, "FOOD11_MODEL_PATH": str(MODEL_FILE), **settings}


def service_module(
    flavor: str, environment: dict[str, str], model: InstantModel | None = None, real_model: bool = False
):
    """fastapi_<flavor>/app.py, imported afresh with `environment` as its settings (and no other service
    variable), its model `model`'s (an InstantModel by default; its own with `real_model`). Call
    `discard(module)` once done with it: each import starts its slots and registers its metrics."""
    import importlib.util
    import os

    spec = importlib.util.spec_from_file_location(
        f"fastapi_{flavor}_app", paths.REPO_ROOT / f"fastapi_{flavor}" / "app.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved = {name: os.environ.pop(name) for name in SERVICE_VARIABLES if name in os.environ}
    os.environ.update(environment)
    try:
        spec.loader.exec_module(module)
    finally:
        for name in environment:
            os.environ.pop(name, None)
        os.environ.update(saved)
    if not real_model:
        model = model or InstantModel()
        module.load_model, module.run = model.load, model.run
    return module


def discard(module) -> None:
    """Stop an app's slots' threads, and take the metrics it registered off prometheus_client's registry,
    for the next import of it."""
    import prometheus_client

    module.slots.close()
    for value in vars(module).values():
        if isinstance(value, prometheus_client.metrics.MetricWrapperBase):
            prometheus_client.REGISTRY.unregister(value)


@asynccontextmanager
async def serving(
    environment: dict[str, str], model: InstantModel | None = None, flavor: str = "onnx"
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of fastapi_<flavor>'s app with `environment` (service_settings) and `model`, started (its
    lifespan) and stopped around the block."""
    service = service_module(flavor, environment, model)
    app = service.app
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://service") as client,
        ):
            yield client
    finally:
        discard(service)


class PhotoHost(ThreadingHTTPServer):
    """GET /<name> answers the file `files[name]`; /to?<url> redirects to <url>; /loop redirects
    to itself; /held answers once `close()` is called; anything else is a 404. `asked` lists the
    paths asked for, in order."""

    daemon_threads = True

    def __init__(self, files: dict[str, bytes]) -> None:
        super().__init__(("127.0.0.1", 0), _PhotoHostHandler)
        self.files = files
        self.asked: list[str] = []
        self.closing = threading.Event()
        # Polled often: shutdown() waits for the next poll (0.5 s by default, for every test).
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def url(self, path: str) -> str:
        return f"http://{self.address}/{path}"

    def close(self) -> None:
        self.closing.set()
        self.shutdown()
        self.server_close()

    def handle_error(self, request, client_address) -> None:
        # A client that gave up (a service past its download time limit) is no error of the host's.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _PhotoHostHandler(BaseHTTPRequestHandler):
    server: PhotoHost

    def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
        self.server.asked.append(self.path)
        name, _, target = self.path.removeprefix("/").partition("?")
        if name in ("to", "loop"):
            self._answer(302, b"", Location=target if name == "to" else "/loop")
        elif name == "held":
            self.server.closing.wait()
            self._answer(200, paths.SAMPLE_IMAGE.read_bytes())
        elif name in self.server.files:
            self._answer(200, self.server.files[name])
        else:
            self._answer(404, b"no such file")

    def _answer(self, status: int, body: bytes, **headers: str) -> None:
        self.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


# ---- a toy service for the supervisor's tests (tests/test_stack.py) --------------------------------

SERVER_WITH_A_CHILD = textwrap.dedent(
    """
    import http.server, subprocess, sys
    # A grandchild that would outlive a naive kill of the parent only (like Triton's backend stubs).
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(sys.argv[2], "w").write(str(child.pid))
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), http.server.SimpleHTTPRequestHandler).serve_forever()
    """
)


def toy_service(folder: Path, port: int, script: str = SERVER_WITH_A_CHILD, timeout: float = 20):
    """A ServiceSpec that runs `script` on `port`, writing its child's pid to folder/child.pid.
    (Also started from the child processes of tests/test_stack.py, which import it from here.)"""
    from servelab.stack.supervision import ServiceSpec

    return ServiceSpec(
        name="toy",
        command=[sys.executable, "-c", script, str(port), str(folder / "child.pid")],
        cwd=folder,
        ports=[port],
        ready_url=f"http://127.0.0.1:{port}/",
        ready_timeout_s=timeout,
    )


def lock_pins() -> dict[str, Version]:
    """requirements.lock's pins: every package the lab installs, by its canonical name."""
    pins = {}
    for line in (paths.REPO_ROOT / "requirements.lock").read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = Version(version)
    return pins


def file_module(path: Path) -> types.ModuleType:
    """A module that is a file of the repository outside every package (docker/cuda_arch.py, the
    images' build guard; scripts/check_class.py), imported once, under its file's name."""
    if path.stem not in sys.modules:
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None, path
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module  # before it runs: its dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[path.stem]
