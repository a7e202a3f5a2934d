"""The process supervisor: readiness, port conflicts, failure reports and full clean-up."""

import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from servelab import paths, triton_local
from servelab.models import ModelRepository
from servelab.stack import LocalStack, Ports, ServiceSpec, StackError, port_is_free

SERVER_WITH_A_CHILD = textwrap.dedent(
    """
    import http.server, subprocess, sys
    # A grandchild that would outlive a naive kill of the parent only (like Triton's backend stubs).
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(sys.argv[2], "w").write(str(child.pid))
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), http.server.SimpleHTTPRequestHandler).serve_forever()
    """
)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited; it only waits to be reaped by its parent.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"


def _spec(tmp_path, port: int, script: str = SERVER_WITH_A_CHILD, timeout: float = 20) -> ServiceSpec:
    return ServiceSpec(
        name="toy",
        command=[sys.executable, "-c", script, str(port), str(tmp_path / "child.pid")],
        cwd=tmp_path,
        ports=[port],
        ready_url=f"http://127.0.0.1:{port}/",
        ready_timeout_s=timeout,
    )


def test_stack_waits_for_readiness_and_stops_the_whole_process_group(tmp_path):
    port = Ports.free().fastapi_pt
    with LocalStack([_spec(tmp_path, port)], log_dir=tmp_path) as stack:
        assert not port_is_free(port)
        leader = stack.processes[0].process.pid
        child = int((tmp_path / "child.pid").read_text())
        assert _pid_alive(leader) and _pid_alive(child)
    deadline = time.monotonic() + 5
    while _pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _pid_alive(child), "the service's child process survived the stop"
    assert port_is_free(port)


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is a Linux feature (prctl)")
def test_a_service_stops_when_the_process_that_started_it_is_killed(tmp_path):
    """A notebook kernel killed before its clean-up ran must not leave its services running."""
    port = Ports.free().fastapi_pt
    starter = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        sys.path.insert(0, {str(paths.REPO_ROOT)!r})
        from servelab.stack import LocalStack
        from tests.test_stack import _spec
        stack = LocalStack([_spec(Path({str(tmp_path)!r}), {port})], log_dir=Path({str(tmp_path)!r})).start()
        Path({str(tmp_path / "leader.pid")!r}).write_text(str(stack.processes[0].process.pid))
        time.sleep(600)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", starter], cwd=paths.REPO_ROOT)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "leader.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        leader = int((tmp_path / "leader.pid").read_text())
        assert _pid_alive(leader)
    finally:
        parent.kill()  # no clean-up runs: SIGKILL, as when a kernel's shutdown wait runs out
        parent.wait()
    deadline = time.monotonic() + 10
    while _pid_alive(leader) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _pid_alive(leader), "the service outlived the process that started it"
    deadline = time.monotonic() + 10
    while not port_is_free(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert port_is_free(port)


def test_a_taken_port_is_reported_clearly_and_nothing_is_left_running(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        stack = LocalStack([_spec(tmp_path, port)], log_dir=tmp_path)
        with pytest.raises(StackError, match=f"port {port} .* already in use.*SERVELAB_PORT_"):
            stack.start()
        assert stack.processes[0].process is None


def test_a_service_that_dies_at_start_up_is_reported_with_its_log(tmp_path):
    port = Ports.free().fastapi_pt
    crashing = "import sys; print('model file missing: run make artifacts'); sys.exit(3)"
    with pytest.raises(StackError, match="(?s)exited with code 3.*model file missing"):
        LocalStack([_spec(tmp_path, port, script=crashing)], log_dir=tmp_path).start()


def test_a_service_that_never_becomes_ready_times_out_and_is_stopped(tmp_path):
    port = Ports.free().fastapi_pt
    silent = "import time; print('still loading'); time.sleep(600)"
    stack = LocalStack([_spec(tmp_path, port, script=silent, timeout=1.5)], log_dir=tmp_path)
    with pytest.raises(StackError, match="(?s)not ready.*still loading"):
        stack.start()
    assert stack.processes[0].process.poll() is not None


def test_up_stops_everything_on_ctrl_c(tmp_path):
    """`python -m servelab up` as a student runs it: SIGINT must leave no process and no port behind."""
    ports = Ports.free()
    env = {
        **os.environ,
        **{f"SERVELAB_PORT_{name.upper()}": str(getattr(ports, name)) for name in Ports.__dataclass_fields__},
        "SERVELAB_DIR": str(tmp_path / "lab"),
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
        up.send_signal(2)
        _, rest = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 0, rest[-2000:]
    for name in Ports.__dataclass_fields__:
        assert port_is_free(getattr(ports, name)), f"{name} port still taken after Ctrl-C"
    assert "stopped triton" in rest and "stopped gourmetgram" in rest and "stopped image_host" in rest


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
