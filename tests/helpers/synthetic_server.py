"""A synthetic server whose latency the tests control, in a child process of its own (`python -m
tests.helpers.synthetic_server` from the repository starts one), and the load generator's runs
against it, for the load generator's tests.

It answers POST /predict after sleeping a time set per test through POST /control: a fixed sleep,
a slow request every k-th or for the first n, a one-off stall, failures with a given status, and a
"serial" mode in which one request is served at a time. It logs when each request arrived, so
tests can check the generator's arrival process from the server's side.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import requests
from aiohttp import web

from servelab import loadgen
from servelab.loadgen import closed_loop, open_loop
from servelab.results import RunResult

REPO_ROOT = Path(__file__).resolve().parents[2]
IMAGE = b"not really a JPEG: the synthetic server does not look"

DEFAULTS = {
    "sleep_ms": 0.0,  # every request sleeps this long...
    "slow_ms": 0.0,  # ...except slow ones:
    "slow_every": 0,  # every k-th request (the k-th, 2k-th, ...),
    "slow_first": 0,  # and the first n requests
    "stall_at": -1,  # this request (0-based) sleeps stall_s instead
    "stall_s": 0.0,
    "fail_every": 0,  # every k-th request answers fail_status
    "fail_status": 503,
    "serial": False,  # one request at a time: the others queue behind a lock
}


def serve() -> None:
    state = {"config": dict(DEFAULTS), "count": 0, "arrivals": [], "answered_to_nobody": 0}
    lock = asyncio.Lock()

    def delay_s(index: int, config: dict) -> float:
        if index == config["stall_at"]:
            return config["stall_s"]
        number = index + 1
        slow = index < config["slow_first"] or (config["slow_every"] and number % config["slow_every"] == 0)
        return (config["slow_ms"] if slow else config["sleep_ms"]) / 1000.0

    async def predict(request: web.Request) -> web.Response:
        index = state["count"]
        state["count"] += 1
        state["arrivals"].append(time.monotonic())
        await request.read()
        config = state["config"]
        if config["serial"]:
            async with lock:  # FIFO: a stalled request holds up every later one
                await asyncio.sleep(delay_s(index, config))
        else:
            await asyncio.sleep(delay_s(index, config))
        if request.transport is None or request.transport.is_closing():
            state["answered_to_nobody"] += 1  # the client left while its request was served
        if config["fail_every"] and (index + 1) % config["fail_every"] == 0:
            return web.json_response({"detail": "synthetic failure"}, status=config["fail_status"])
        return web.json_response({"prediction": "Soup", "probability": 0.9})

    async def control(request: web.Request) -> web.Response:
        state.update(config={**DEFAULTS, **await request.json()}, count=0, arrivals=[], answered_to_nobody=0)
        return web.json_response(state["config"])

    async def arrivals(request: web.Request) -> web.Response:
        return web.json_response(state["arrivals"])

    async def answered_to_nobody(request: web.Request) -> web.Response:
        return web.json_response(state["answered_to_nobody"])

    app = web.Application()
    app.add_routes(
        [
            web.post("/predict", predict),
            web.post("/control", control),
            web.get("/arrivals", arrivals),
            web.get("/answered_to_nobody", answered_to_nobody),
        ]
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)  # before the port is announced: connections wait in the backlog until the app runs
    print(sock.getsockname()[1], flush=True)
    web.run_app(app, sock=sock, print=None, access_log=None, backlog=1024)


class SyntheticServer:
    def __init__(self, url: str) -> None:
        self.url = url

    def configure(self, **settings) -> SyntheticServer:
        """New settings (the rest back to defaults); also resets the request counter and log.
        Returns the server, so that a run measured again (`kept_schedule`) starts afresh:
        `kept_schedule(lambda: closed(server.configure(...), ...))`."""
        unknown = set(settings) - set(DEFAULTS)
        assert not unknown, f"unknown server settings {unknown}"
        requests.post(f"{self.url}/control", json=settings, timeout=5).raise_for_status()
        return self

    def arrivals(self) -> np.ndarray:
        return np.array(requests.get(f"{self.url}/arrivals", timeout=5).json())

    def answered_to_nobody(self) -> int:
        """Requests whose client had closed the connection by the time they were answered."""
        return requests.get(f"{self.url}/answered_to_nobody", timeout=5).json()


@contextlib.contextmanager
def running() -> Iterator[SyntheticServer]:
    """The server started, and stopped after the block (a test module's fixture wraps it)."""
    # As a module of the tests package, which it imports from (`python -m`, from the repository).
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.synthetic_server"], stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT
    )
    try:
        port = int(process.stdout.readline())
        yield SyntheticServer(f"http://127.0.0.1:{port}")
    finally:
        process.terminate()
        process.wait(timeout=10)
        process.stdout.close()


def plain_client_p50_ms(server: SyntheticServer, count: int = 20) -> float:
    """The median latency of the server as it is configured now, one request at a time, measured
    by a plain client, not the load generator: the bound its figures are judged against."""
    latencies = []
    with requests.Session() as session:
        for _ in range(count):
            started = time.perf_counter()
            session.post(f"{server.url}/predict", json={"image": "x"}, timeout=30).raise_for_status()
            latencies.append((time.perf_counter() - started) * 1000)
    return float(np.median(latencies))


def closed(
    server: SyntheticServer, concurrency: int, timeout_s: float = loadgen.DEFAULT_TIMEOUT_S, **load
) -> RunResult:
    endpoint = loadgen.Endpoint("fastapi", server.url, image_bytes=IMAGE, timeout_s=timeout_s)
    return closed_loop(endpoint, loadgen.Load(concurrency, **load), progress=False)


def opened(server: SyntheticServer, rate_rps: float, **kwargs) -> RunResult:
    return open_loop(loadgen.Endpoint("fastapi", server.url, image_bytes=IMAGE), rate_rps, progress=False, **kwargs)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


if __name__ == "__main__":
    serve()
