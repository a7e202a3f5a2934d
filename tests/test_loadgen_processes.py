"""The load in client processes (servelab/loadgen/processes.py): how many client processes carry a point,
their figures together, how busy each was, and each server process's own count of the connections,
against real sockets and a real HTTP server in this process."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from servelab.bench.gpu_check import check
from servelab.bench.gpu_check.verdicts import FAIL
from servelab.loadgen import processes as load
from servelab.loadgen.targets import HttpTarget
from servelab.stack.supervision import ManagedProcess, ServiceSpec
from tests.helpers import synthetic_run, until


@pytest.mark.parametrize(
    "concurrency, cores, expected",
    [(1, 16, 1), (16, 16, 2), (64, 16, 4), (64, 48, 8), (64, 2, 1), (16, 2, 1), (3, 64, 1)],
)
def test_a_point_gets_a_client_for_every_8_senders_and_at_most_a_quarter_of_the_cores(concurrency, cores, expected):
    assert load.client_processes(concurrency, cores) == expected


def test_the_senders_are_shared_as_evenly_as_they_go():
    assert load.shares(16, 2) == [8, 8]
    assert load.shares(10, 4) == [3, 3, 2, 2]
    assert sum(load.shares(64, 3)) == 64


def test_the_clients_runs_add_up_and_one_busy_client_marks_the_point_saturated():
    parts = [
        synthetic_run("fastapi_pt", concurrency=8, throughput_rps=200.0, latencies_ms=[5.0, 7.0], client=client)
        for client in ({"processes": 1, "cpu_percent": [35.0]}, {"processes": 1, "cpu_percent": [92.5]})
    ]
    run = load.combined("fastapi_pt", parts, {"11": 9, "12": 7})
    assert (run.concurrency, run.throughput_rps, run.requests) == (16, 400.0, 200)
    assert run.latencies_ms == [5.0, 7.0, 5.0, 7.0]
    assert run.client == {
        "processes": 2,
        "cpu_percent": [35.0, 92.5],
        "saturated": True,
        "connections_by_worker": {"11": 9, "12": 7},
    }
    calm = load.combined("fastapi_pt", parts[:1], {})
    assert calm.client["saturated"] is False


def listening(port: int = 0) -> socket.socket:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    server.bind(("127.0.0.1", port))
    server.listen(16)
    return server


def test_each_process_counts_the_connections_it_accepted_and_an_idle_supervisor_is_left_out():
    server = listening()
    port = server.getsockname()[1]
    # A second process listening on the same port (SO_REUSEPORT), which accepts nothing: a supervisor.
    code = (
        "import socket, sys, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1); "
        f"s.bind(('127.0.0.1', {port})); s.listen(16); print('up', flush=True); time.sleep(60)"
    )
    supervisor = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    clients, accepted = [], []
    try:
        assert supervisor.stdout.readline().strip() == "up"
        server.settimeout(0.05)
        # The kernel shares connections between the two listeners: connect until some came here.
        while len(accepted) < 2 and len(clients) < 64:
            clients.append(socket.create_connection(("127.0.0.1", port)))
            with contextlib.suppress(TimeoutError):
                accepted.append(server.accept()[0])
        assert len(accepted) == 2, f"2 of {len(clients)} connections came to this process"
        mine = str(os.getpid())
        assert load.connections_by_worker([supervisor.pid, os.getpid()], port) == {mine: len(accepted)}
        # Where the leader accepts connections itself, every process with a socket on the port counts.
        both = load.connections_by_worker([os.getpid(), supervisor.pid], port)
        assert both == {mine: len(accepted), str(supervisor.pid): 0}
        assert load.connections_by_worker([supervisor.pid], port + 1 if port < 65535 else port - 1) == {}
    finally:
        supervisor.kill()
        for sock in clients + accepted + [server]:
            sock.close()


class ToyService(ThreadingHTTPServer):
    """GET answers a /health of the CPU; POST answers `status` with a small body after `delay_s` (so
    that every sender has a request in flight, on a connection of its own), kept alive."""

    daemon_threads = True
    request_queue_size = 64

    def __init__(self, status: int, delay_s: float = 0.0) -> None:
        super().__init__(("127.0.0.1", 0), _ToyHandler)
        self.status, self.delay_s = status, delay_s
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _ToyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # kept-alive connections, as the services keep them

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer(200, json.dumps({"device": "cpu"}).encode())

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(self.server.delay_s)
        self._answer(self.server.status, b'{"prediction": "Soup"}')

    def log_message(self, *args) -> None:
        pass


@pytest.mark.timeout(120)
def test_a_point_of_16_senders_runs_in_two_client_processes_that_each_report_their_cpu():
    service = ToyService(200, delay_s=0.02)
    try:
        run = load.load_point(
            service.url + "/predict", b"x" * 1000, {}, "toy", 16, 1.0, 0.2, [os.getpid()], service.server_address[1], 16
        )
    finally:
        service.shutdown()
    assert run.concurrency == 16 and run.errors == {}
    assert run.client["processes"] == 2 and len(run.client["cpu_percent"]) == 2
    assert all(0 < percent < 200 for percent in run.client["cpu_percent"])
    assert run.requests == len(run.latencies_ms) > 0
    # Every sender's kept-alive connection, as this process (the only server) held them while the load ran.
    assert run.client["connections_by_worker"] == {str(os.getpid()): 16}
    assert "2 client process(es)" in run.notes[-1]


@pytest.mark.timeout(120)
def test_a_service_that_answers_no_request_of_a_point_is_not_loaded_at_the_others(tmp_path):
    service = ToyService(500)
    # Started as the check starts a service; what it runs is a process that only waits, while this
    # test's own ToyService answers: the load, the verdict and the early stop are the check's own.
    waiting = ServiceSpec(
        "naive_pt", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path, [], service.url + "/health"
    )
    running = check.Started(
        ManagedProcess(waiting, tmp_path), HttpTarget("toy", service.url + "/predict", b"{}", {}, 5)
    )
    running.process.start()
    steps = SimpleNamespace(total=3, done=0)
    steps.update = lambda count=1: setattr(steps, "done", steps.done + count)
    args = SimpleNamespace(device="cpu", seconds=0.5, warmup=0.1, concurrency=[1, 16, 64])
    try:
        until(lambda: running.process.pids(), 10, "the toy's process")
        checked = check.checked_service(running, args, None, steps)
    finally:
        running.process.stop()
        service.shutdown()
    assert [run.concurrency for run in checked.runs] == [1]
    assert checked.verdict.status == FAIL and "requests failed under load (http_500 x" in checked.verdict.reason
    assert steps.done == 3, "the points not run leave the bar's total"
    assert checked.verdict.reason.startswith(f"{checked.runs[0].requests} of {checked.runs[0].requests} requests")
