"""The process supervisor: readiness, port conflicts, failure reports, restarts after a crash and
full clean-up."""

import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
import requests

from servelab import paths, service_exits
from servelab.stack import supervision
from servelab.stack.supervision import LocalStack, Ports, StackError, answers, port_is_free
from servelab.triton import server as triton_local
from servelab.triton.models import ModelRepository
from tests.helpers import toy_service, until


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited; it only waits to be reaped by its parent.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"


@pytest.fixture
def port() -> int:
    """A free port on 127.0.0.1 for the test's toy service."""
    return Ports.found_free().fastapi_pt


# Serves, then exits with code 3 a second later: a service that crashes every time it starts.
SERVER_THAT_EXITS = textwrap.dedent(
    """
    import http.server, os, sys, threading
    server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), http.server.SimpleHTTPRequestHandler)
    threading.Timer(1.0, lambda: os._exit(3)).start()
    server.serve_forever()
    """
)

# Serves the first time; started again, it never answers (a restart stuck loading its model).
SERVER_STUCK_ON_RESTART = textwrap.dedent(
    """
    import http.server, pathlib, sys, time
    started = pathlib.Path(sys.argv[2] + ".started")
    if started.exists():
        time.sleep(600)
    started.write_text("once")
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), http.server.SimpleHTTPRequestHandler).serve_forever()
    """
)


def test_stack_waits_for_readiness_and_stops_the_whole_process_group(tmp_path, port):
    with LocalStack([toy_service(tmp_path, port)], log_dir=tmp_path) as stack:
        assert not port_is_free(port)
        leader = stack.processes[0].process.pid
        child = int((tmp_path / "child.pid").read_text())
        assert _pid_alive(leader) and _pid_alive(child)
    until(lambda: not _pid_alive(child), 5, "the service's child process stopped with it")
    assert port_is_free(port)


def test_a_stopped_service_s_children_are_gone_when_stop_returns_even_those_that_ignore_sigterm(tmp_path):
    # A child that outlives its parent's SIGTERM, as Triton's backend stubs may.
    code = (
        "import signal, subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "time.sleep(600)']); time.sleep(600)"
    )
    spec = supervision.ServiceSpec("toy", [sys.executable, "-c", code], tmp_path, [], "http://127.0.0.1:9/")
    managed = supervision.ManagedProcess(spec, tmp_path)
    managed.start()
    pids = until(lambda: len(found := managed.pids()) == 2 and found, 30, "the service and its child")
    managed.stop()
    assert not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is a Linux feature (prctl)")
@pytest.mark.parametrize("restarted", [False, True], ids=["as-started", "restarted"])
def test_a_service_stops_when_the_process_that_started_it_is_killed(tmp_path, port, restarted):
    """A notebook kernel killed before its clean-up ran must not leave its services running, nor
    one that the supervisor's thread restarted."""
    starter = [
        "import os, signal, sys, time",
        "from pathlib import Path",
        f"sys.path.insert(0, {str(paths.REPO_ROOT)!r})",
        "from servelab.stack.supervision import LocalStack",
        "from tests.helpers import toy_service, until",
        f"stack = LocalStack([toy_service(Path({str(tmp_path)!r}), {port})], log_dir=Path({str(tmp_path)!r})).start()",
    ]
    if restarted:
        starter += [
            "os.kill(stack.processes[0].process.pid, signal.SIGKILL)",
            "until(lambda: stack.exits and stack.exits[0].back_at, 30, 'restarted')",
        ]
    leader_pid = tmp_path / "leader.pid"
    starter += [f"Path({str(leader_pid)!r}).write_text(str(stack.processes[0].process.pid))", "time.sleep(600)"]
    parent = subprocess.Popen([sys.executable, "-c", "\n".join(starter)], cwd=paths.REPO_ROOT)
    try:
        leader = int(until(lambda: leader_pid.exists() and leader_pid.read_text(), 60, "the service's pid"))
        assert _pid_alive(leader)
    finally:
        parent.kill()  # no clean-up runs: SIGKILL, as when a kernel's shutdown wait runs out
        parent.wait()
    until(lambda: not _pid_alive(leader), 10, "the service stopped with its starter")
    until(lambda: port_is_free(port), 10, "its port free")


def test_a_service_killed_while_running_is_restarted_its_log_kept_and_its_exit_recorded(tmp_path, port):
    with LocalStack([toy_service(tmp_path, port)], log_dir=tmp_path / "logs") as running:
        first = running.processes[0].process.pid
        first_child = int((tmp_path / "child.pid").read_text())
        os.kill(first, signal.SIGKILL)
        event = until(lambda: running.exits and running.exits[0].back_at and running.exits[0], 30, "back up")
        assert running.processes[0].process.pid != first and answers(f"http://127.0.0.1:{port}/")
        assert (event.service, event.cause, event.outcome) == ("toy", "was killed by signal 9 (SIGKILL)", "back")
        assert "GET / HTTP/1.1" in event.log_tail, "the exit carries the last lines of the service's log"
        until(lambda: not _pid_alive(first_child), 5, "the crashed service's child process cleared")
        log_text = (tmp_path / "logs" / "toy.log").read_text()
        before, marker, after = log_text.partition("---- servelab: toy restarted after it was killed by signal 9")
        assert marker and "GET / HTTP/1.1" in before and "GET / HTTP/1.1" in after, "both runs' lines, in order"
        recorded = service_exits.read(tmp_path / "logs" / service_exits.EVENTS_FILE)
        assert [(item.service, item.cause, item.outcome) for item in recorded] == [(event.service, event.cause, "back")]
        assert recorded[0].exited_at <= recorded[0].back_at
    assert port_is_free(port)


def test_a_service_that_keeps_crashing_is_given_up_after_the_restart_limit(tmp_path, port, monkeypatch):
    monkeypatch.setattr(supervision, "MAX_RESTARTS", 2)
    with LocalStack([toy_service(tmp_path, port, script=SERVER_THAT_EXITS)], log_dir=tmp_path / "logs") as running:
        until(running.given_up, 30, "the supervisor gives up")
        exits = service_exits.read(tmp_path / "logs" / service_exits.EVENTS_FILE)
        assert [item.outcome for item in exits] == ["back", "back", "given up"]
        assert {item.cause for item in exits} == {"exited with code 3"}
        assert "restarted 2 times" in exits[-1].detail and str(tmp_path / "logs" / "toy.log") in exits[-1].detail
        time.sleep(3 * supervision.POLL_S)
        assert len(running.exits) == 3 and not running.processes[0].alive(), "given up: not started again"
    assert port_is_free(port)


def test_stopping_the_stack_while_a_restart_waits_for_readiness_returns_at_once(tmp_path, port):
    running = LocalStack([toy_service(tmp_path, port, script=SERVER_STUCK_ON_RESTART, timeout=120)], log_dir=tmp_path)
    running.start()
    os.kill(running.processes[0].process.pid, signal.SIGKILL)
    until(lambda: running.processes[0].alive() and running.exits, 10, "the restart under way")
    restarted = running.processes[0].process.pid
    began = time.monotonic()
    running.stop()
    assert time.monotonic() - began < 15, "stop waited out the restart's readiness timeout"
    assert not _pid_alive(restarted)


def test_a_taken_port_is_reported_clearly_and_nothing_is_left_running(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        stack = LocalStack([toy_service(tmp_path, port)], log_dir=tmp_path)
        with pytest.raises(StackError, match=f"port {port} .* already in use.*SERVELAB_PORT_"):
            stack.start()
        assert stack.processes[0].process is None


def test_a_service_that_dies_at_start_up_is_reported_with_its_log(tmp_path, port):
    crashing = "import sys; print('model file missing: run make artifacts'); sys.exit(3)"
    with pytest.raises(StackError, match="(?s)exited with code 3.*model file missing"):
        LocalStack([toy_service(tmp_path, port, script=crashing)], log_dir=tmp_path).start()


def test_a_service_that_never_becomes_ready_times_out_and_is_stopped(tmp_path, port):
    silent = "import time; print('still loading'); time.sleep(600)"
    stack = LocalStack([toy_service(tmp_path, port, script=silent, timeout=1.5)], log_dir=tmp_path)
    with pytest.raises(StackError, match="(?s)not ready.*still loading"):
        stack.start()
    assert stack.processes[0].process.poll() is not None


@pytest.mark.integration
def test_up_restarts_a_crashed_service_and_stops_everything_on_ctrl_c(tmp_path):
    """`python -m servelab up` as a student runs it: a service killed while the lab runs comes back,
    and SIGINT must leave no process (Ray's and Triton's included) and no port behind."""
    ports = Ports.found_free()
    env = {
        **os.environ,
        **{f"SERVELAB_PORT_{name.upper()}": str(getattr(ports, name)) for name in Ports.__dataclass_fields__},
        "SERVELAB_STACK_DIR": str(tmp_path / "lab"),
    }
    up = subprocess.Popen([sys.executable, "-m", "servelab", "up"], env=env, stderr=subprocess.PIPE, text=True)
    output = []
    try:
        for line in up.stderr:
            output.append(line)
            if "Press Ctrl-C" in line or up.poll() is not None:
                break
        assert any("The lab is up" in line for line in output), "".join(output[-30:])
        assert any("UNTRAINED" in line or "trained" in line for line in output)
        # The URL printed opens the student's copies (notebooks/student/), answers cleared.
        (printed,) = {
            found.group(0) for line in output if (found := re.search(r"http://\S+/lab/tree/student\?\S+", line))
        }
        assert requests.get(printed, timeout=30).status_code == 200
        token = printed.partition("token=")[2]
        listing = requests.get(
            f"http://127.0.0.1:{ports.jupyter}/api/contents/student", params={"token": token}, timeout=30
        )
        assert "6_triton_bench.ipynb" in {item["name"] for item in listing.json()["content"]}, listing.text[:300]
        # nbgrader, installed for `make notebooks`, shows students none of its instructor's pages or menus.
        lab_page = requests.get(printed, timeout=30).text
        assert re.search(r'"disabledExtensions": \[[^]]*"@jupyter/nbgrader"', lab_page), "nbgrader's menus are off"
        formgrader = requests.get(f"http://127.0.0.1:{ports.jupyter}/formgrader", params={"token": token}, timeout=30)
        assert formgrader.status_code == 404, "nbgrader's Formgrader is not served to students"
        started = psutil.Process(up.pid).children(recursive=True)
        assert any("raylet" in " ".join(child.cmdline()) for child in started), "Ray runs under `up`"
        image_host = next(child for child in started if "server.py" in child.cmdline())
        image_host.kill()
        events = tmp_path / "lab" / "logs" / service_exits.EVENTS_FILE
        back = until(lambda: [item for item in service_exits.read(events) if item.back_at], 60, "image host back")
        assert (back[0].service, back[0].cause) == ("image_host", "was killed by signal 9 (SIGKILL)")
        assert answers(f"http://127.0.0.1:{ports.image_host}/health")
        started = psutil.Process(up.pid).children(recursive=True)  # the image host's new process too
        up.send_signal(2)
        _, rest = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 0, rest[-2000:]
    for name in Ports.__dataclass_fields__:
        assert port_is_free(getattr(ports, name)), f"{name} port still taken after Ctrl-C"
    _, alive = psutil.wait_procs(started, timeout=15)  # a killed process is gone once the kernel reaps it
    assert all(child.status() == psutil.STATUS_ZOMBIE for child in alive), [child.cmdline()[:3] for child in alive]
    assert "stopped triton" in rest and "stopped gourmetgram" in rest and "stopped image_host" in rest
    log = "".join(output) + rest
    assert "image_host was killed by signal 9 (SIGKILL) unexpectedly" in log and "image_host is back" in log


def test_staged_configs_are_adapted_for_the_cpu_and_the_difference_is_printed(tmp_path, built_artifacts):
    staged = {model.name: model for model in triton_local.stage_model_repository(tmp_path / "models")}
    assert sorted(staged) == ModelRepository().names(), "every model folder is staged, none skipped"
    onnx_config = (tmp_path / "models" / "food_classifier_onnx" / "config.pbtxt").read_text()
    assert 'backend: "python"' in onnx_config and "served_by" in onnx_config
    assert '-backend: "onnxruntime"' in staged["food_classifier_onnx"].changes
    for name in staged:
        config = (tmp_path / "models" / name / "config.pbtxt").read_text()
        assert "KIND_CPU" in config and "KIND_GPU" not in config and "gpus" not in config
        assert "+    kind: KIND_CPU" in staged[name].changes
        assert (tmp_path / "models" / name / "1" / "model.py").read_text().startswith("# Added by servelab")
        # The shipped comments are teaching material: staging keeps every one of them.
        shipped = (paths.MODELS_STAGING_DIR / name / "config.pbtxt").read_text()
        assert [line for line in shipped.splitlines() if line.startswith("#")] == [
            line for line in config.splitlines() if line.startswith("#")
        ]


def test_shipped_configs_target_the_gpu_node():
    for model in ModelRepository():
        config = model.config.proto
        # A stateful model's batch is one frame per sequence: it ships with a batch size of its own.
        assert config.name == model.name and config.max_batch_size == (8 if model.stateful else 16)
        assert all(group.kind == group.KIND_GPU for group in config.instance_group)
    assert ModelRepository().get("food_classifier_onnx").backend == "onnxruntime"


@pytest.mark.parametrize(("clashes", "started"), [(0, 1), (1, 2), (2, None)])
def test_a_port_taken_at_start_up_is_tried_once_more_on_new_ports_and_logged(
    tmp_path, monkeypatch, caplog, clashes, started
):
    attempts: list[Ports] = []

    class Stack:  # the services' start, which finds its port taken `clashes` times
        def __init__(self, services, log_dir):
            self.processes = []

        def start(self):
            if len(attempts) <= clashes:
                raise supervision.PortClash(f"port {attempts[-1].fastapi_pt} on 127.0.0.1 is already in use")
            return self

    def services(ports: Ports) -> list:
        attempts.append(ports)
        return [toy_service(tmp_path, ports.fastapi_pt)]

    monkeypatch.setattr(supervision, "LocalStack", Stack)
    if started is None:
        with pytest.raises(supervision.PortClash):
            supervision.start_on_free_ports(services, tmp_path)
        assert len(attempts) == 2
    else:
        _, ports = supervision.start_on_free_ports(services, tmp_path)
        assert len(attempts) == started and ports == attempts[-1]
    assert len({ports.fastapi_pt for ports in attempts}) == len(attempts) or clashes == 0  # new ports each time
    logged = [record.getMessage() for record in caplog.records if record.name == "servelab.retry"]
    assert len(logged) == min(clashes, 1), logged
    assert all(line.startswith("RETRY starting toy on new ports, after: port ") for line in logged), logged


def test_a_known_transient_start_failure_is_tried_once_more_and_logged(tmp_path, port, caplog):
    """A service whose first start fails with the words its spec names (Ray's node slow to
    register) is started once more, in the same log; any other failure is reported at once."""
    flaky = textwrap.dedent(
        """
        import http.server, pathlib, sys
        tried = pathlib.Path(sys.argv[2] + ".tried")
        if not tried.exists():
            tried.write_text("once")
            sys.exit("The current node timed out during startup.")
        http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), http.server.SimpleHTTPRequestHandler).serve_forever()
        """
    )
    spec = dataclasses.replace(toy_service(tmp_path, port, script=flaky), retry_start_on="timed out during startup")
    with LocalStack([spec], log_dir=tmp_path) as started:
        assert answers(f"http://127.0.0.1:{port}/")
        log = started.processes[0].log_path.read_text()
    assert "timed out during startup" in log and "did not start: timed out during startup" in log
    logged = [record.getMessage() for record in caplog.records if record.name == "servelab.retry"]
    assert logged == ["RETRY starting toy once more, after: timed out during startup"]
    (tmp_path / "child.pid.tried").unlink()
    with pytest.raises(StackError, match="timed out during startup"):
        LocalStack([dataclasses.replace(spec, retry_start_on="another failure")], log_dir=tmp_path / "again").start()
