"""The load generator's closed and open loops, against a synthetic server whose latency the tests
control (tests/helpers/synthetic_server.py): what they measure, what they leave out, the load they
send, and the loads and endpoints they refuse. Its errors and early stops: test_loadgen_errors.py;
against the lab's real servers: test_loadgen_servers.py.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Iterator

import numpy as np
import pytest

from servelab import loadgen, paths
from servelab.loadgen import FastAPITarget, closed_loop, runners
from servelab.loadgen.lag import LAG_LIMIT_S
from tests.helpers import kept_schedule, synthetic_server
from tests.helpers.synthetic_server import IMAGE, SyntheticServer, closed, opened, plain_client_p50_ms


@pytest.fixture(scope="module")
def server() -> Iterator[SyntheticServer]:
    with synthetic_server.running() as running:
        yield running


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
