"""Faults survived against the real servers: each model server killed (SIGKILL) under load.

The load generator records the failed requests with their cause and returns on time, the stack's
supervisor brings the server back, and the next load is served in full; GourmetGram says its
backend is unavailable while it is down, and classifies again once it is back. The session's own
servers are the ones killed: a crash is what the supervisor is for, and every later test finds them
back (each test here waits for that).
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import requests

from servelab import loadgen, paths, service_exits
from servelab.lab import Lab, run_keeper, ui
from servelab.profiles import profile
from servelab.results import append_result, load_appended
from servelab.stack.supervision import ManagedProcess

pytestmark = pytest.mark.integration

LOAD_S = 4.0
KILL_AFTER_S = 1.0
# Triton reloads every model after a restart: a busy 2-core machine takes up to a minute or two.
BACK_WITHIN_S = 240.0
# Errors that say the server went away: the connection refused or reset, gRPC's UNAVAILABLE.
LOST_SERVER = {"connection", "grpc_UNAVAILABLE"}


def service(stack, name: str) -> ManagedProcess:
    return next(managed for managed in stack.processes if managed.spec.name == name)


def back(stack, name: str, exits_before: int) -> service_exits.ServiceExit:
    """The service's new exit once the supervisor has it back, polled: never a fixed sleep."""
    deadline = time.monotonic() + BACK_WITHIN_S
    while time.monotonic() < deadline:
        new = [event for event in stack.exits[exits_before:] if event.service == name]
        if new and new[-1].outcome == service_exits.BACK:
            return new[-1]
        assert not (new and new[-1].outcome == service_exits.GIVEN_UP), new[-1].detail
        time.sleep(0.2)
    raise AssertionError(f"{name} was not back within {BACK_WITHIN_S:g} s; its log: {service(stack, name).log_path}")


@pytest.mark.parametrize(
    ("name", "kind", "model"),
    [
        ("fastapi_pt", "fastapi", None),
        ("fastapi_onnx", "fastapi", None),
        ("triton", "triton-grpc", "food_classifier_onnx"),
    ],
)
def test_a_server_killed_under_load_fails_requests_with_their_cause_comes_back_and_serves_again(
    model_servers, ports, tmp_path, name, kind, model
):
    address = {
        "fastapi_pt": f"http://127.0.0.1:{ports.fastapi_pt}",
        "fastapi_onnx": f"http://127.0.0.1:{ports.fastapi_onnx}",
        "triton": f"127.0.0.1:{ports.triton_grpc}",
    }[name]
    managed, exits_before = service(model_servers, name), len(model_servers.exits)
    killed = managed.process.pid
    threading.Timer(KILL_AFTER_S, os.kill, (killed, signal.SIGKILL)).start()
    began = time.monotonic()
    endpoint = loadgen.Endpoint(kind, address, model)
    during = loadgen.closed_loop(endpoint, loadgen.Load(4, duration_s=LOAD_S), progress=False)
    assert time.monotonic() - began < LOAD_S + 15, "the load generator hung on a dead server"
    assert during.error_count > 0 and set(during.errors) <= LOST_SERVER, during.errors
    assert len(during.latencies_ms) > 0, "the requests before the kill were answered"

    event = back(model_servers, name, exits_before)
    assert event.cause == "was killed by signal 9 (SIGKILL)" and managed.process.pid != killed
    after = loadgen.closed_loop(endpoint, loadgen.Load(4, duration_s=2.0), progress=False)
    assert after.error_count == 0 and after.requests > 0, after.errors

    saved = tmp_path / "runs.jsonl"  # both runs, whole, as a notebook saves them
    append_result(saved, during, {"service": name})
    append_result(saved, after, {"service": name})
    assert [run.to_dict() for run, _ in load_appended(saved)] == [during.to_dict(), after.to_dict()]


def test_a_lab_run_that_spans_a_crash_is_marked_and_saved_as_such(model_servers, ports, monkeypatch, tmp_path):
    monkeypatch.setattr(run_keeper, "SAVED_RUNS_DIR", tmp_path)
    url = f"http://127.0.0.1:{ports.fastapi_onnx}"
    # The stack is watched as a notebook watches the stack it started.
    lab = Lab("local", profile("quick"), {"onnx": url}, None, None, None, notebook="faults", stacks=[model_servers])
    managed, exits_before = service(model_servers, "fastapi_onnx"), len(model_servers.exits)
    threading.Timer(KILL_AFTER_S, os.kill, (managed.process.pid, signal.SIGKILL)).start()
    crashed = lab.measurer.closed_loop(url, 4, LOAD_S, name="fastapi_onnx, killed")
    assert crashed.interrupted_by and "fastapi_onnx was killed by signal 9 (SIGKILL)" in crashed.interrupted_by[0]
    back(model_servers, "fastapi_onnx", exits_before)
    clean = lab.measurer.closed_loop(url, 4, 2.0, name="fastapi_onnx, after")
    assert clean.clean and clean.error_count == 0
    saved = [run for run, _ in load_appended(tmp_path / "faults.jsonl")]
    assert [(run.name, run.clean) for run in saved] == [
        ("fastapi_onnx, killed", False),
        ("fastapi_onnx, after", True),
    ]


def test_gourmetgram_says_its_backend_is_down_and_classifies_again_once_it_is_back(model_servers, gourmetgram):
    ui_url = gourmetgram("fastapi_pt")
    photo = paths.SAMPLE_IMAGE.read_bytes()
    assert ui.upload(ui_url, "soup.jpg", photo).status == 200
    managed, exits_before = service(model_servers, "fastapi_pt"), len(model_servers.exits)
    os.kill(managed.process.pid, signal.SIGKILL)
    down = ui.upload(ui_url, "soup.jpg", photo, timeout_s=30)  # PyTorch takes seconds to come back
    assert down.status == 503 and "backend is unavailable" in down.error, down
    back(model_servers, "fastapi_pt", exits_before)
    again = ui.upload(ui_url, "soup.jpg", photo)
    assert again.status == 200 and again.label, again
    # The banner no longer says the backend is unreachable: the answer proved it is back.
    assert requests.get(f"{ui_url}/healthz", timeout=10).json()["backend_reachable"] is True
