"""What the tests share (a test module imports this, never another test module or a conftest):
waiting on a state, never on a sleep a busy machine can outlast; test images; the bad requests
every predict service must refuse; a toy service for the supervisor; synthetic runs for the
lessons' checks."""

from __future__ import annotations

import base64
import io
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest
import requests
from PIL import Image

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


def synthetic_run(
    target: str = "t",
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
    return RunResult(target, fields.pop("tool", "loadgen"), mode, fields.pop("requests", 100), throughput_rps,
                     latency, fields.pop("wall_s", 10.0), concurrency=concurrency, **fields)  # fmt: skip


def service_stages(**means_ms: float) -> dict:
    """A FastAPI service's account of a run (`RunResult.service_stats`) with these stage means."""
    return {"stage_mean_ms": {"download": float("nan"), "slot_wait": 0.0, "preprocess": 0.0, "inference": 0.0,
                              **means_ms}}  # fmt: skip


# ---- images and requests -----------------------------------------------------------------------

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
