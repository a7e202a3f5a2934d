"""Shared fixtures: real servers started as processes on free 127.0.0.1 ports, torn down after.

The servers run from the repository's own folders with the artifacts `make artifacts` placed
there (built here too if missing), and write their logs under pytest's temporary directory,
so a running `make up` on the default ports is never disturbed.
"""

from __future__ import annotations

import base64
import io
import logging
import os

import numpy as np
import pytest
from PIL import Image

from servelab import artifacts
from servelab.stack import LocalStack, Ports, fastapi_service, gourmetgram_service, triton_service

# Small enough to test 413 with a modest body, large enough for every real test image.
TEST_MAX_REQUEST_BYTES = 2_000_000


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


@pytest.fixture(scope="session")
def built_artifacts():
    return artifacts.ensure_artifacts()


@pytest.fixture(scope="session")
def test_images() -> list[bytes]:
    return [make_image_bytes(seed) for seed in range(6)]


@pytest.fixture(scope="session")
def image_b64(test_images) -> str:
    return base64.b64encode(test_images[0]).decode()


@pytest.fixture(scope="session")
def ports() -> Ports:
    return Ports.free()


@pytest.fixture(scope="session")
def model_servers(built_artifacts, ports, tmp_path_factory):
    """Both FastAPI services and Triton, started together once for the whole session."""
    logging.getLogger("servelab").setLevel(logging.INFO)
    work = tmp_path_factory.mktemp("stack")
    limit = {"MAX_REQUEST_BYTES": str(TEST_MAX_REQUEST_BYTES)}
    stack = LocalStack(
        [
            fastapi_service("pt", ports.fastapi_pt, env=limit),
            fastapi_service("onnx", ports.fastapi_onnx, env=limit),
            triton_service(ports.triton, work_dir=work / "triton"),
        ],
        log_dir=work / "logs",
    )
    with stack:
        yield stack


@pytest.fixture(scope="session")
def fastapi_urls(model_servers, ports) -> dict[str, str]:
    return {"pt": f"http://127.0.0.1:{ports.fastapi_pt}", "onnx": f"http://127.0.0.1:{ports.fastapi_onnx}"}


@pytest.fixture(scope="session")
def triton_http_url(model_servers, ports) -> str:
    return f"127.0.0.1:{ports.triton_http}"


@pytest.fixture(scope="session")
def triton_grpc_url(model_servers, ports) -> str:
    return f"127.0.0.1:{ports.triton_grpc}"


@pytest.fixture
def start_gourmetgram(model_servers, ports, tmp_path):
    """Start GourmetGram against one backend; stopped when the test ends."""
    stacks = []

    def start(backend: str, backend_ports: Ports = ports) -> str:
        port = Ports.free().gourmetgram
        stack = LocalStack([gourmetgram_service(port, backend, backend_ports)], log_dir=tmp_path / "logs").start()
        stacks.append(stack)
        return f"http://127.0.0.1:{port}"

    yield start
    for stack in stacks:
        stack.stop()


def pytest_collection_modifyitems(items):
    for item in items:
        if {"model_servers", "start_gourmetgram"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
