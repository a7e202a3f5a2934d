"""Fixtures of the tests alone: test images, the photo host and event loop of the in-process
service tests, and the session's service addresses as the tests use them. The servers themselves,
which the notebooks share, are in tests/lab_servers.py, a plugin of the root conftest.py."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest

from servelab import paths
from tests.helpers import LIMIT_BYTES, PhotoHost, make_image_bytes


@pytest.fixture(scope="session")
def test_images() -> list[bytes]:
    return [make_image_bytes(seed) for seed in range(6)]


@pytest.fixture(scope="session")
def image_b64(test_images) -> str:
    return base64.b64encode(test_images[0]).decode()


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """The event loop of the tests marked anyio: asyncio's, which the services run on (uvicorn's)
    and whose own API they use."""
    return "asyncio"


@pytest.fixture
def photo_host() -> Iterator[PhotoHost]:
    """The in-process service's image host (tests/helpers/): a photo, a text file and
    a file one byte over LIMIT_BYTES."""
    host = PhotoHost(
        {
            "soup.jpg": paths.SAMPLE_IMAGE.read_bytes(),
            "notes.txt": b"a shopping list, not a photo",
            "big.bin": b"\xff" * (LIMIT_BYTES + 1),
        }
    )
    yield host
    host.close()


@pytest.fixture(scope="session")
def fastapi_urls(ports) -> dict[str, str]:
    return {"pt": f"http://127.0.0.1:{ports.fastapi_pt}", "onnx": f"http://127.0.0.1:{ports.fastapi_onnx}"}


@pytest.fixture(scope="session")
def triton_http_url(ports) -> str:
    return f"127.0.0.1:{ports.triton_http}"


@pytest.fixture(scope="session")
def triton_grpc_url(ports) -> str:
    return f"127.0.0.1:{ports.triton_grpc}"
