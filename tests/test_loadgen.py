"""The load generator against a synthetic server whose latency we control, then against the real ones.

The synthetic server is a real aiohttp server in its own process (`python -m tests.test_loadgen`
from the repository starts one). It answers POST /predict after sleeping a time set per test through POST /control:
a fixed sleep, a slow request every k-th or for the first n, a one-off stall, failures with a
given status, and a "serial" mode in which one request is served at a time. It logs when each
request arrived, so tests can check the generator's arrival process from the server's side.
"""

from __future__ import annotations

import _thread
import asyncio
import base64
import logging
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from aiohttp import web

import food11
from food11 import LABELS
from servelab import loadgen, paths
from servelab.loadgen import FastAPITarget, TritonHttpTarget, closed_loop, open_loop, runners
from servelab.loadgen.lag import LAG_LIMIT_S
from servelab.results import RunResult, load_results
from tests.helpers import kept_schedule, until

REPO_ROOT = Path(__file__).resolve().parent.parent
IMAGE = b"not really a JPEG: the synthetic server does not look"


# ---- the synthetic server (runs in a child process) ----------------------------------------

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


def _serve() -> None:
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


@pytest.fixture(scope="module")
def server():
    # As a module of the tests package, which it imports from (`python -m`, from the repository).
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.test_loadgen"], stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT
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


# ---- closed loop ---------------------------------------------------------------------------


@pytest.mark.integration
def test_closed_loop_one_sender_measures_the_server_latency(server):
    result = kept_schedule(lambda: closed(server.configure(sleep_ms=20), 1, requests=50))
    assert (result.tool, result.mode, result.concurrency) == ("loadgen", "closed", 1)
    assert result.requests == 50 and len(result.latencies_ms) == 50 and result.errors == {}
    assert len(server.arrivals()) == 50
    # The server's 20 ms, plus no more than an independent client pays for a round trip here.
    assert 20 <= result.latency.p50_ms <= plain_client_p50_ms(server) + 10
    # One sender: one request at a time, so throughput is the inverse of latency.
    assert result.throughput_rps == pytest.approx(1000 / result.latency.mean_ms, rel=0.25)


@pytest.mark.integration
def test_every_measured_request_is_on_the_timeline_when_it_ended_with_its_outcome(server):
    server.configure(sleep_ms=10)
    result = closed(server, 2, requests=40)
    assert len(result.timeline) == result.requests == 40
    ended = [entry[0] for entry in result.timeline]
    assert ended == sorted(ended) and 0 < ended[0] and ended[-1] <= result.wall_s
    assert [entry[1] for entry in result.timeline] == result.latencies_ms
    assert {entry[2] for entry in result.timeline} == {"ok"}


@pytest.mark.integration
def test_off_a_terminal_progress_is_one_line_per_phase_not_a_bar(server, caplog, capsys):
    server.configure(sleep_ms=5)
    with caplog.at_level(logging.INFO, logger="servelab.loadgen"):
        closed_loop(
            loadgen.Endpoint("fastapi", server.url, image_bytes=IMAGE),
            loadgen.Load(2, 30, warmup_requests=4),
            progress=True,
        )
    lines = [record.getMessage() for record in caplog.records if " requests in " in record.getMessage()]
    assert len(lines) == 2 and lines[0].startswith("warm-up: 4 requests in ")
    assert lines[1].startswith("c=2: 30 requests in ")
    assert "\r" not in capsys.readouterr().err  # pytest's stderr is not a terminal: no bar redrawn


@pytest.mark.integration
def test_closed_loop_throughput_grows_with_concurrency_when_the_server_serves_in_parallel(server):
    server.configure(sleep_ms=20)
    one = kept_schedule(lambda: closed(server, 1, requests=40))
    four = kept_schedule(lambda: closed(server, 4, requests=160))
    assert four.errors == {} and four.requests == 160
    assert four.throughput_rps / one.throughput_rps == pytest.approx(4, rel=0.3)


@pytest.mark.integration
def test_percentiles_follow_the_server_latency_distribution(server):
    # 90% at 10 ms, 10% at 100 ms
    result = kept_schedule(lambda: closed(server.configure(sleep_ms=10, slow_ms=100, slow_every=10), 1, requests=100))
    fast = [latency for latency in result.latencies_ms if latency < 100]
    assert len(fast) == 90 and result.latency.max_ms >= 100
    assert 10 <= result.latency.p50_ms <= max(fast), "the median is a fast request's"
    assert result.latency.p95_ms >= 90
    # The server's mean, 0.9 x 10 + 0.1 x 100 ms, plus the round trip of this run's own fast
    # requests (a plain client's, measured apart, moved by several ms on a busy machine).
    round_trip_ms = float(np.median(fast)) - 10
    assert result.latency.mean_ms == pytest.approx(0.9 * 10 + 0.1 * 100 + round_trip_ms, abs=5)


@pytest.mark.integration
def test_duration_bounds_the_run(server):
    server.configure(sleep_ms=20)
    result = kept_schedule(lambda: closed(server, 2, duration_s=1.0))
    # It stops sending at 1 s, and ends once the requests then in flight are answered.
    assert 0.95 <= result.wall_s <= 1.0 + result.latency.max_ms / 1000 + 0.1
    assert result.requests == pytest.approx(2 * result.wall_s / (result.latency.mean_ms / 1000), rel=0.2)
    # With both bounds, the first reached ends the run.
    assert closed(server, 2, requests=5, duration_s=30).requests == 5


@pytest.mark.integration
def test_warmup_requests_are_not_measured(server):
    settings = {"sleep_ms": 5, "slow_ms": 300, "slow_first": 5}
    result = kept_schedule(lambda: closed(server.configure(**settings), 2, requests=20, warmup_requests=5))
    assert result.requests == 20 and len(server.arrivals()) == 25
    assert result.latency.max_ms < 300  # none of the 300 ms warm-up requests


@pytest.mark.integration
def test_the_caller_is_told_when_measurement_starts_after_the_warmup(server):
    """What a caller counts from `on_measuring` (a service's counters) covers the measured requests only."""
    server.configure(sleep_ms=5)
    seen_then: list[int] = []
    endpoint = loadgen.Endpoint("fastapi", server.url, image_bytes=IMAGE)
    load = loadgen.Load(2, requests=20, warmup_requests=5)
    result = closed_loop(endpoint, load, progress=False, on_measuring=lambda: seen_then.append(len(server.arrivals())))
    assert seen_then == [5], "called once, with the warm-up's requests all answered and none measured yet"
    assert result.requests == 20 and len(server.arrivals()) == 25


@pytest.mark.integration
def test_open_loop_warmup_seconds_are_not_measured(server):
    settings = {"sleep_ms": 5, "slow_ms": 300, "slow_first": 9}  # the 9 arrivals before 0.5 s at 20 req/s
    result = kept_schedule(lambda: opened(server.configure(**settings), 20, requests=10, warmup_s=0.5))
    assert result.requests == 10 and len(server.arrivals()) == 19
    assert result.latency.max_ms < 300  # none of the 300 ms warm-up requests


# ---- open loop -----------------------------------------------------------------------------


@pytest.mark.integration
def test_open_loop_keeps_a_constant_rate(server):
    server.configure(sleep_ms=5)
    result = kept_schedule(lambda: opened(server, 50, requests=100))
    assert (result.mode, result.rate_rps, result.arrival) == ("open", 50, "constant")
    assert result.requests == 100 and result.errors == {}
    assert result.throughput_rps == pytest.approx(50, rel=0.1)
    lag = result.schedule_lag
    # Timers wake about a millisecond late, a busy machine runs the generator a few more later.
    assert lag["mean_ms"] < 1000 * LAG_LIMIT_S and "kept to its schedule" in lag["message"]


class BlockingTarget(loadgen.Target):
    """A target whose every request blocks the event loop for 5 ms: a generator that is too slow."""

    name = "blocking"

    async def open(self, connections: int) -> None:
        pass

    async def send(self) -> None:
        time.sleep(0.005)

    async def close(self) -> None:
        pass


def test_open_loop_says_when_the_generator_falls_behind():
    result = asyncio.run(loadgen.run_open(BlockingTarget(), 500, requests=100, progress=False))
    assert result.errors == {} and result.requests == 100
    assert result.schedule_lag["fell_behind"] is True
    assert result.schedule_lag["max_ms"] > 200  # 100 x 5 ms of work scheduled within 200 ms
    assert "fell behind" in result.schedule_lag["message"]


class CountingTarget(loadgen.Target):
    """A target that answers at once and counts what it was sent."""

    name = "counting"

    def __init__(self) -> None:
        self.sent = 0
        self.connections: list[int] = []

    async def open(self, connections: int) -> None:
        self.connections.append(connections)

    async def send(self) -> None:
        self.sent += 1
        await asyncio.sleep(0)

    async def close(self) -> None:
        pass


def test_a_closed_loop_says_when_its_event_loop_was_held_up_and_only_then():
    """A closed loop has no schedule of arrivals: its loop's own timer is its schedule. Requests that
    hold the loop (5 ms each, above) make the timer late; requests that wait, as on a server, do not."""
    held = asyncio.run(loadgen.run_closed(BlockingTarget(), loadgen.Load(1, requests=100), progress=False))
    assert held.schedule_lag["fell_behind"] is True and held.schedule_lag["max_ms"] >= 4
    assert "other work held it up" in loadgen.describe_result(held)

    class WaitingTarget(CountingTarget):
        async def send(self) -> None:
            await asyncio.sleep(0.005)

    load = loadgen.Load(1, requests=100)
    waited = kept_schedule(lambda: asyncio.run(loadgen.run_closed(WaitingTarget(), load, progress=False)))
    assert waited.schedule_lag["p99_ms"] < held.schedule_lag["p99_ms"]
    assert "schedule" not in loadgen.describe_result(waited)  # a closed loop speaks only when held up


def test_a_closed_loop_sends_its_load_as_described_once_warm_up_unmeasured():
    target = CountingTarget()
    load = loadgen.Load(3, requests=20, warmup_requests=5)
    result = asyncio.run(loadgen.run_closed(target, load, progress=False))
    assert (result.requests, len(result.latencies_ms), result.concurrency) == (20, 20, 3)
    assert target.sent == 25 and target.connections == [3]  # the warm-up was sent, not measured
    assert load.warmup() == loadgen.Load(3, requests=5)  # the same senders, patient, no back-off
    assert (
        load.bounds() == "20 requests"
        and loadgen.Load(1, 5, 2.0).bounds() == "5 requests or 2 s, whichever comes first"
    )


@pytest.mark.parametrize(
    ("load", "refused"),
    [
        ({"concurrency": 0, "requests": 1}, "concurrency"),
        ({"concurrency": 1, "requests": 1, "backoff_s": -1}, "backoff_s"),
        ({"concurrency": 1, "requests": 0}, "requests and duration_s must be positive"),
        ({"concurrency": 1, "duration_s": 0}, "requests and duration_s must be positive"),
        ({"concurrency": 1, "requests": 1, "warmup_s": -1}, "warmup"),
        ({"concurrency": 2, "requests": 1, "impatient": 3}, "impatient"),
        ({"concurrency": 2, "requests": 1, "impatient": 1, "patience_s": 0}, "patience_s"),
    ],
)
def test_a_load_that_cannot_be_sent_is_refused_as_it_is_built(load, refused):
    with pytest.raises(ValueError, match=refused):
        loadgen.Load(**load)


@pytest.mark.parametrize(
    ("endpoint", "refused"),
    [
        ({"kind": "grpc", "address": "127.0.0.1:1"}, "unknown target kind 'grpc'"),
        (
            {
                "kind": "triton-http",
                "address": "127.0.0.1:1",
                "model": "food_classifier",
                "image_url": "http://h/a.jpg",
            },
            "image_url is for FastAPI targets",
        ),
        ({"kind": "triton-grpc", "address": "127.0.0.1:1"}, "needs a model: one of .*food_classifier"),
        ({"kind": "fastapi", "address": "http://127.0.0.1:1", "timeout_s": 0}, "timeout_s must be positive"),
    ],
)
def test_an_endpoint_no_target_can_serve_is_refused_as_it_is_built(endpoint, refused):
    with pytest.raises(ValueError, match=refused):
        loadgen.Endpoint(**endpoint)


def test_each_target_refuses_the_endpoint_it_cannot_serve():
    with pytest.raises(ValueError, match="streams go to fastapi or triton-grpc targets, not 'triton-http'"):
        loadgen.make_stream_target(loadgen.Endpoint("triton-http", "127.0.0.1:1", "food_refine"))
    with pytest.raises(ValueError, match="image_url is for closed and open loops"):
        loadgen.make_stream_target(loadgen.Endpoint("fastapi", "http://127.0.0.1:1", image_url="http://h/a.jpg"))
    # What every request sends, the sample photo unless told otherwise, is the endpoint's:
    target = loadgen.make_target(loadgen.Endpoint("fastapi", "http://127.0.0.1:1"))
    assert isinstance(target, FastAPITarget) and base64.b64encode(paths.SAMPLE_IMAGE.read_bytes()) in target.body


def test_each_runner_refuses_the_load_it_cannot_send():
    with pytest.raises(ValueError, match="give requests, duration_s or both"):
        asyncio.run(loadgen.run_closed(CountingTarget(), loadgen.Load(1), progress=False))
    with pytest.raises(ValueError, match="patience_s"):
        asyncio.run(loadgen.run_closed(CountingTarget(), loadgen.Load(2, 1, impatient=1), progress=False))
    stream_target = loadgen.HttpStreamTarget("http://127.0.0.1:1", IMAGE, 1.0)  # never opened: refused first
    with pytest.raises(ValueError, match="without warm-up"):
        asyncio.run(loadgen.run_streams(stream_target, loadgen.Load(1, requests=5, duration_s=1.0), 3))
    with pytest.raises(ValueError, match="duration_s"):
        asyncio.run(loadgen.run_streams(stream_target, loadgen.Load(1, requests=5), 3))


def _gaps(arrivals: np.ndarray) -> np.ndarray:
    return np.diff(np.sort(arrivals))


def _kept_to_schedule(server: SyntheticServer, rate_rps: float, **kwargs) -> np.ndarray:
    """The gaps the server saw in a run the generator says it sent on time: a run it reports late
    (a stall of the shared machine) has gaps that are no longer the schedule's."""
    result = kept_schedule(lambda: opened(server.configure(sleep_ms=1), rate_rps, **kwargs))
    assert result.errors == {} and result.arrival == kwargs.get("arrival", "constant")
    return _gaps(server.arrivals())


@pytest.mark.integration
def test_poisson_arrivals_seen_by_the_server_are_exponential(server):
    """The server sees the generator's schedule: exponential gaps for Poisson arrivals, equal gaps
    for constant ones. Judged on spans, medians and fractions, which a few sends made late by a busy
    machine hardly move (a late send shortens the gap after it as much as it lengthens the one before)."""
    rate = 100.0
    gaps = _kept_to_schedule(server, rate, arrival="poisson", requests=400, seed=3)
    assert len(gaps) == 399
    scheduled = np.diff(np.fromiter(runners.arrival_offsets(rate, "poisson", seed=3), float, count=400))
    assert gaps.mean() == pytest.approx(scheduled.mean(), rel=0.05)  # the span the schedule set
    # An exponential's median is ln 2 = 0.69 of its mean, and e^-2 = 14% of its gaps exceed twice
    # the mean; equal gaps would give 1 and none.
    assert 0.55 <= np.median(gaps) / gaps.mean() <= 0.85
    assert 0.08 <= (gaps > 2 * gaps.mean()).mean() <= 0.20

    # A slower constant rate, so that scheduling jitter on a busy machine stays small beside the gaps.
    constant = _kept_to_schedule(server, rate / 2, requests=150)
    assert constant.mean() == pytest.approx(2 / rate, rel=0.05)
    assert np.median(constant) == pytest.approx(2 / rate, rel=0.1)
    # The middle half of the gaps within 5 ms of 20 ms, where an exponential's quartiles would be
    # 0.29 and 1.39 of its mean (6 and 28 ms). A send made late by a busy machine moves two gaps; a
    # fifth of the gaps more than 5 ms off (one core kept busy, 2026-11-28) leaves the quartiles inside.
    quartiles = np.percentile(constant, [25, 75])
    assert np.abs(quartiles - 2 / rate).max() < 0.005, f"quartiles {quartiles * 1000} ms of a constant 20 ms"


def test_arrival_schedules():
    constant = np.fromiter(loadgen.arrival_offsets(20, "constant"), float, count=5)
    assert constant == pytest.approx([0.05, 0.10, 0.15, 0.20, 0.25])
    poisson = np.fromiter(loadgen.arrival_offsets(50, "poisson", seed=1), float, count=20_000)
    gaps = np.diff(poisson, prepend=0.0)
    assert gaps.mean() == pytest.approx(0.02, rel=0.03) and gaps.std() / gaps.mean() == pytest.approx(1, abs=0.03)
    again = np.fromiter(loadgen.arrival_offsets(50, "poisson", seed=1), float, count=20_000)
    assert (poisson == again).all()  # the seed makes a run repeatable
    with pytest.raises(ValueError, match="poisson"):
        next(loadgen.arrival_offsets(50, "bursty"))


@pytest.mark.integration
def test_open_loop_shows_a_stall_that_a_closed_loop_hides(server):
    """Coordinated omission: a closed loop stops sending while the server stalls, so only one
    request sees the stall. Users keep arriving, and an open loop measures their wait too."""
    # The generator did not wait for the server: it kept its schedule, where waiting would have
    # sent a third of the requests up to a second late (a busy machine's own stall is sent again).
    settings = {"sleep_ms": 5, "serial": True, "stall_s": 1.0}
    open_result = kept_schedule(lambda: opened(server.configure(**settings, stall_at=50), 50, duration_s=3.0))
    assert open_result.errors == {}
    assert open_result.latency.max_ms >= 900
    assert sum(latency > 300 for latency in open_result.latencies_ms) >= 20
    assert open_result.latency.p99_ms >= 500

    closed_result = kept_schedule(lambda: closed(server.configure(**settings, stall_at=20), 1, requests=100))
    assert closed_result.latency.max_ms >= 900
    assert sum(latency > 300 for latency in closed_result.latencies_ms) == 1
    assert closed_result.latency.p99_ms < 100


@pytest.mark.integration
def test_open_loop_drops_and_reports_arrivals_beyond_max_outstanding(server):
    server.configure(sleep_ms=1000)
    result = opened(server, 100, requests=30, max_outstanding=5)
    assert result.errors == {"generator_overload": 25} and result.requests == 30
    assert len(result.latencies_ms) == 5
    assert any("could not keep up" in note for note in result.notes)


# ---- errors ----------------------------------------------------------------------------------


@pytest.mark.integration
def test_http_errors_are_counted_by_status(server):
    server.configure(sleep_ms=1, fail_every=4, fail_status=503)
    result = closed(server, 2, requests=40)
    assert result.errors == {"http_503": 10} and result.requests == 40
    assert len(result.latencies_ms) == 30  # latencies are of successful requests only
    # The timeline has every request, a failure with how long it took to fail.
    failed = [entry for entry in result.timeline if entry[2] == "http_503"]
    assert len(failed) == 10 and all(entry[1] > 0 for entry in failed)
    server.configure(fail_every=1, fail_status=400)
    assert closed(server, 1, requests=3).errors == {"http_400": 3}


@pytest.mark.integration
def test_a_sender_backs_off_after_a_refusal_and_only_then(server):
    """A refused request (503 here) makes its sender wait `backoff_s` before the next; an answered
    one does not. Every request is still measured."""
    server.configure(sleep_ms=1, fail_every=1, fail_status=503)
    polite = closed(server, 1, requests=5, backoff_s=0.2)
    assert polite.errors == {"http_503": 5} and polite.wall_s >= 4 * 0.2
    assert any("waited 0.2 s" in note for note in polite.notes)
    server.configure(sleep_ms=1)
    without = closed(server, 1, requests=5)
    answered = closed(server, 1, requests=5, backoff_s=1.0)
    assert answered.error_count == 0 and answered.wall_s < without.wall_s + 1.0  # not one wait
    with pytest.raises(ValueError, match="backoff_s"):
        closed(server, 1, requests=1, backoff_s=-1)


@pytest.mark.integration
def test_impatient_senders_cancel_at_their_deadline_and_only_answers_count_as_goodput(server):
    """Every request takes 300 ms; 2 of 4 senders give up after 100 ms and close their connection.
    Their requests are cancelled, not errors; the server sees those clients gone; the patient
    senders' answers are the goodput and have their own latency."""
    result = kept_schedule(
        lambda: closed(server.configure(sleep_ms=300), 4, duration_s=1.0, impatient=2, patience_s=0.1)
    )
    assert result.error_count == 0 and result.cancelled >= 2 * 8  # each impatient sender: one per 100 ms
    answered = len(result.latencies_ms)
    assert answered >= 2 * 3 and min(result.latencies_ms) > 200  # only patient senders were answered
    assert result.patient_latency.p50_ms == pytest.approx(300, abs=60)
    assert result.throughput_rps == pytest.approx(answered / result.wall_s)
    assert result.requests == answered + result.cancelled
    assert {outcome for _, _, outcome in result.timeline} == {"ok", "cancelled"}
    assert all(
        latency == pytest.approx(100, abs=30) for _, latency, outcome in result.timeline if outcome == "cancelled"
    )
    # The last cancelled requests finish their 300 ms on the server.
    until(
        lambda: server.answered_to_nobody() >= result.cancelled - 2, 10, "the server to finish the cancelled requests"
    )
    assert server.answered_to_nobody() == pytest.approx(result.cancelled, abs=2)
    assert any("2 of the 4 senders gave up" in note for note in result.notes)
    paced = kept_schedule(lambda: closed(server, 1, duration_s=1.0, impatient=1, patience_s=0.05, backoff_s=0.2))
    assert 3 <= paced.cancelled <= 5  # a new impatient client every 0.25 s
    with pytest.raises(ValueError, match="patience_s"):
        closed(server, 2, requests=1, impatient=1)


def test_connection_refused_and_timeouts_are_counted():
    nobody = f"http://127.0.0.1:{free_port()}"
    refused = closed_loop(loadgen.Endpoint("fastapi", nobody, image_bytes=IMAGE), loadgen.Load(2, 5), progress=False)
    assert refused.errors == {"connection": 5} and refused.throughput_rps == 0
    grpc = closed_loop(
        loadgen.Endpoint("triton-grpc", nobody.removeprefix("http://"), "food_classifier"),
        loadgen.Load(1, 3),
        progress=False,
    )
    assert grpc.errors == {"grpc_UNAVAILABLE": 3}


@pytest.mark.integration
def test_a_request_slower_than_the_timeout_counts_as_a_timeout(server):
    server.configure(sleep_ms=2000)
    result = closed(server, 2, requests=2, timeout_s=0.3)
    assert result.errors == {"timeout": 2}


# ---- stopping early --------------------------------------------------------------------------


@pytest.mark.integration
def test_cancelling_a_run_returns_what_was_measured(server):
    server.configure(sleep_ms=10)
    target = FastAPITarget(server.url, IMAGE)

    async def cancel_after(coroutine, seconds):
        task = asyncio.create_task(coroutine)
        await asyncio.sleep(seconds)
        task.cancel()
        return await task

    for run in (
        loadgen.run_closed(target, loadgen.Load(2, requests=100_000), progress=False),
        loadgen.run_open(target, 100, requests=100_000, progress=False),
    ):
        started = time.perf_counter()
        result = asyncio.run(cancel_after(run, 0.6))
        elapsed_s = time.perf_counter() - started
        assert result.requests > 10 and len(result.latencies_ms) == result.requests
        assert result.notes == [f"stopped early by Ctrl-C after {result.requests} requests"]
        # The run measured until it was stopped, and not a moment past it: not the 100,000 requests.
        assert result.timeline[-1][0] <= result.wall_s <= elapsed_s
        assert target.idle_connections == 0  # closed


@pytest.mark.integration
def test_ctrl_c_stops_the_synchronous_run_and_keeps_the_result(server):
    server.configure(sleep_ms=10)
    # interrupt_main does nothing unless Python's own handler is installed: make sure it is (a
    # full suite run once left another one in place), and put back whatever was there.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.8, _thread.interrupt_main)
    timer.start()
    try:
        result = closed(server, 2, requests=100_000, duration_s=30)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert result.wall_s < 5 and result.requests > 10, f"SIGINT handler before the test: {previous}"
    assert result.notes == [f"stopped early by Ctrl-C after {result.requests} requests"]


@pytest.mark.integration
def test_the_synchronous_api_works_where_an_event_loop_is_already_running(server):
    """As in a Jupyter notebook, whose cells run while the kernel's event loop runs."""
    server.configure(sleep_ms=1)

    async def notebook_cell():
        return closed(server, 2, requests=10)

    assert asyncio.run(notebook_cell()).errors == {}


@pytest.mark.integration
def test_cli_saves_the_partial_result_on_sigint(server, tmp_path):
    server.configure(sleep_ms=10)
    out = tmp_path / "partial.json"
    command = [
        sys.executable,
        "-m",
        "servelab.loadgen",
        "--target",
        "fastapi",
        "--address",
        server.url,
        "--concurrency",
        "2",
        "--requests",
        "1000000",
        "--out",
        str(out),
    ]
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while len(server.arrivals()) < 20 and time.monotonic() < deadline:
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == 130, stderr
    [result], metadata = load_results(out)
    # 20 had arrived at the server; up to 2 (the concurrency) were still in flight at the signal.
    assert result.requests >= 20 - 2 and result.latencies_ms
    assert result.notes == [f"stopped early by Ctrl-C after {result.requests} requests"]
    assert "Stopped early by Ctrl-C" in stdout and "Closed loop, 2 concurrent senders" in stdout
    assert metadata["command"][0] == "loadgen"


def test_cli_refuses_a_run_without_bounds():
    with pytest.raises(SystemExit):
        loadgen.main(["--target", "fastapi", "--address", "http://127.0.0.1:1", "--concurrency", "1"])


# ---- the real servers ----------------------------------------------------------------------

TRITON_MODELS = ["food_classifier", "food_classifier_onnx"]


@pytest.mark.integration
@pytest.mark.parametrize("flavor", ["pt", "onnx"])
def test_fastapi_services_answer_every_request(fastapi_urls, flavor):
    result = closed_loop(loadgen.Endpoint("fastapi", fastapi_urls[flavor]), loadgen.Load(2, 10), progress=False)
    assert result.errors == {} and result.requests == 10


@pytest.mark.integration
@pytest.mark.parametrize("model", TRITON_MODELS)
@pytest.mark.parametrize("kind", ["triton-http", "triton-grpc"])
def test_triton_answers_every_request(triton_http_url, triton_grpc_url, kind, model):
    address = triton_http_url if kind == "triton-http" else triton_grpc_url
    result = closed_loop(loadgen.Endpoint(kind, address, model), loadgen.Load(2, 10), progress=False)
    assert result.errors == {} and result.requests == 10, result.errors
    assert result.name == f"triton/{model} ({kind.split('-')[1]})"


def _post_binary(target: TritonHttpTarget) -> httpclient.InferResult:
    response = requests.post(str(target.url), data=target.body, headers=target.headers, timeout=30)
    assert response.status_code == 200, response.text
    header_length = response.headers.get("Inference-Header-Content-Length")
    return httpclient.InferResult.from_response_body(response.content, header_length=int(header_length))


@pytest.mark.integration
def test_binary_http_requests_are_understood_by_triton(triton_http_url, fastapi_urls, test_images):
    """The hand-built binary bodies give the same answers as the FastAPI services."""
    image = test_images[1]
    expected = {
        flavor: requests.post(
            f"{fastapi_urls[flavor]}/predict", json={"image": base64.b64encode(image).decode()}, timeout=30
        ).json()
        for flavor in ("pt", "onnx")
    }
    answer = _post_binary(TritonHttpTarget(triton_http_url, "food_classifier", image))
    assert answer.as_numpy("FOOD_LABEL").reshape(-1)[0].decode() == expected["pt"]["prediction"]
    assert answer.as_numpy("PROBABILITY").reshape(-1)[0] == pytest.approx(expected["pt"]["probability"], abs=1e-4)

    logits = _post_binary(TritonHttpTarget(triton_http_url, "food_classifier_onnx", image)).as_numpy("output")
    assert logits.shape == (1, 11)
    [(label, probability)] = food11.top_prediction(logits)
    assert label in LABELS and label == expected["onnx"]["prediction"]
    assert probability == pytest.approx(expected["onnx"]["probability"], abs=1e-4)


@pytest.mark.integration
def test_triton_errors_are_counted_by_status(triton_http_url, triton_grpc_url):
    # The Python backend reports a bad image as an internal error: HTTP 500, gRPC INTERNAL.
    def bad(kind: str, address: str) -> RunResult:
        return closed_loop(
            loadgen.Endpoint(kind, address, "food_classifier", b"no image"), loadgen.Load(1, 2), progress=False
        )

    assert bad("triton-http", triton_http_url).errors == {"http_500": 2}
    assert bad("triton-grpc", triton_grpc_url).errors == {"grpc_INTERNAL": 2}


if __name__ == "__main__":
    _serve()
