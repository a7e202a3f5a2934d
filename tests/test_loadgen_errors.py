"""The load generator's errors (counted by kind, backed off, timed out, cancelled at a deadline) and
its early stops (a cancel, Ctrl-C, SIGINT to its command), against the synthetic server
(tests/helpers/synthetic_server.py).
"""

from __future__ import annotations

import _thread
import asyncio
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from servelab import loadgen
from servelab.loadgen import FastAPITarget, closed_loop
from servelab.results import load_results
from tests.helpers import kept_schedule, synthetic_server, until
from tests.helpers.synthetic_server import (
    IMAGE,
    REPO_ROOT,
    SyntheticServer,
    closed,
    free_port,
)


@pytest.fixture(scope="module")
def server() -> Iterator[SyntheticServer]:
    with synthetic_server.running() as running:
        yield running


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
