"""Fixtures of the tests alone: test images, and the session's service addresses as the tests use
them. The servers themselves, which the notebooks share, are in tests/lab_servers.py, a plugin of
the root conftest.py."""

from __future__ import annotations

import base64

import pytest

from tests.helpers import make_image_bytes


@pytest.fixture(scope="session")
def test_images() -> list[bytes]:
    return [make_image_bytes(seed) for seed in range(6)]


@pytest.fixture(scope="session")
def image_b64(test_images) -> str:
    return base64.b64encode(test_images[0]).decode()


@pytest.fixture(scope="session")
def fastapi_urls(ports) -> dict[str, str]:
    return {"pt": f"http://127.0.0.1:{ports.fastapi_pt}", "onnx": f"http://127.0.0.1:{ports.fastapi_onnx}"}


@pytest.fixture(scope="session")
def triton_http_url(ports) -> str:
    return f"127.0.0.1:{ports.triton_http}"


@pytest.fixture(scope="session")
def triton_grpc_url(ports) -> str:
    return f"127.0.0.1:{ports.triton_grpc}"
