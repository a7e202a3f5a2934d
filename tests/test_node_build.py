"""The node's build (servelab.node_build), run for real: the runner is a detached process, and a
script that stands for `docker compose` does the building (it prints what a build prints, records
each call, and can be held at a service, or fail it). Commands reach the "node" through a local
shell, as notebook 2's SSH commands do. A step that prints nothing (servelab.node_traffic) is
watched on a fake clock, with a fake count of the bytes the node receives.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from servelab import node_build, node_env, node_traffic, paths
from servelab.node_build import Progress

STAND_IN = textwrap.dedent(
    """\
    import os, sys, time
    from pathlib import Path

    args = sys.argv[1:]
    with open(os.environ["STANDIN_CALLS"], "a") as calls:
        calls.write(" ".join(args) + "\\n")
    action, *services = [arg for arg in args if not arg.startswith("-") and arg != "plain"]
    for service in services:
        print(f"#7 [{service} 2/5] RUN pip install torch", flush=True)
        while (Path(os.environ["STANDIN_HOLD"]) / service).exists() and action == "build":
            print(f"#7 [{service} 2/5] 1.2GB / 2.5GB downloaded", flush=True)
            time.sleep(0.05)
        if service == os.environ.get("STANDIN_FAIL") and action == "build":
            print(f"ERROR: failed to solve: {service}: no space left on device", flush=True)
            sys.exit(1)
    """
)
CALLS_BUILDING = [
    "--progress plain build torch fastapi_pt fastapi_onnx image_host gourmetgram jupyter",
    "up -d --no-build fastapi_pt fastapi_onnx image_host gourmetgram jupyter",
    "--progress plain build triton",
    "up -d --no-build triton",
    "--progress plain build ray_serve",
    "up -d --no-build ray_serve",
]


class Node:
    """A clone on "the node", and a shell there: `ask` runs a command as notebook 2 does over SSH."""

    def __init__(self, tmp_path: Path):
        self.repo = tmp_path / "serve-system"
        (self.repo / "notebooks").mkdir(parents=True)
        self.hold, self.calls = tmp_path / "hold", tmp_path / "calls"
        self.hold.mkdir()
        stand_in = tmp_path / "compose_stand_in.py"
        stand_in.write_text(STAND_IN)
        # `python3` on the node's PATH: this Python, which has servelab.
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
        (bin_dir / "python3").chmod(0o755)
        # What `docker compose` is on this node: the stand-in (`start` passes it to the runner).
        self.env = {
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "STANDIN_CALLS": str(self.calls),
            "STANDIN_HOLD": str(self.hold),
        }
        self.env.pop("SERVELAB_IMAGE_PREFIX", None)
        self.compose = f"{sys.executable} {stand_in}"

    def ask(self, command: str) -> str:
        command = command.replace("servelab.node_build start", f"servelab.node_build start --compose '{self.compose}'")
        done = subprocess.run(
            command, shell=True, cwd=self.repo.parent, env=self.env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def follow(self, until: str, **kwargs) -> Progress:
        return node_build.follow(self.ask, self.repo.name, until=until, poll_s=0.05, **kwargs)

    def called(self) -> list[str]:
        return self.calls.read_text().splitlines()

    def runner_pid(self) -> int:
        return node_build.read_state(self.repo)["runner_pid"]


def wait_until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture
def node(tmp_path):
    node = Node(tmp_path)
    yield node
    state = node_build.read_state(node.repo)
    if node_build.runner_alive(state):  # a test that failed midway: end its runner (and the stand-in)
        os.killpg(state["runner_pid"], signal.SIGKILL)


def test_the_build_runs_detached_shows_progress_and_resumes_where_it_stopped(node, capsys):
    for service in ("jupyter", "triton"):  # each image "downloads" until released
        (node.hold / service).touch()
    polls = []

    def sleep(seconds: float) -> None:  # between polls, the first stage's download ends
        polls.append(seconds)
        if len(polls) == 3:
            (node.hold / "jupyter").unlink()
        time.sleep(seconds)

    progress = node.follow(until="fastapi", sleep=sleep)
    out = capsys.readouterr().out
    assert out.startswith("Started the build (process ")
    first_stage = "the FastAPI services, GourmetGram, the image host and Jupyter (notebooks 3 and 4)"
    assert re.search(rf"\nBuilding {re.escape(first_stage)}: \d+ s so far\. Log: ", out), out
    assert progress.stage_done("fastapi") and not progress.stage_done("triton")
    assert "Done: the FastAPI services, GourmetGram, the image host and Jupyter (notebooks 3 and 4)." in out
    runner = node.runner_pid()
    assert os.getsid(runner) != os.getsid(0), "the runner has a session of its own: the SSH connection may go"

    wait_until(lambda: "triton" in Progress(node_build.status(node.repo)).line())
    line = node.ask(f"cd {node.repo.name} && python3 -m servelab.node_build status")
    assert (
        line.startswith("Building Triton (notebooks 5 to 7 and 9 to 11): ") and " so far. Log: #7 [triton 2/5] " in line
    )
    assert node.ask(f"cd {node.repo.name} && python3 -m servelab.node_build start").startswith(
        f"The build runs already (process {runner})"
    )

    os.killpg(runner, signal.SIGKILL)  # the node's runner ends with the build half done
    wait_until(lambda: Progress(node_build.status(node.repo)).stopped())
    with pytest.raises(RuntimeError, match="it resumes where it stopped"):
        node_build.follow(lambda command: node.ask(command.replace(" start", " status")), node.repo.name, "triton")

    (node.hold / "triton").unlink()
    progress = node.follow(until="ray_serve")
    assert progress.current() is None and "resuming after fastapi:build, fastapi:start" in capsys.readouterr().out
    assert node.called() == [*CALLS_BUILDING[:3], *CALLS_BUILDING[2:]], "only the step cut short runs again"
    measured = json.loads((node.repo / node_build.MEASURED_TIMES).read_text())
    assert set(measured) == {"fastapi", "ray_serve"}, "a stage that was resumed has no time of its own"
    assert measured["fastapi"]["mode"] == "build" and measured["fastapi"]["seconds"] >= 0
    assert node.ask(f"cd {node.repo.name} && python3 -m servelab.node_build start").startswith("Every image is built")


def test_a_failed_step_stops_the_build_saying_what_failed_and_runs_again_from_there(node, capsys):
    node.env["STANDIN_FAIL"] = "triton"
    with pytest.raises(RuntimeError) as failed:
        node.follow(until="ray_serve")
    message = str(failed.value)
    assert message.startswith("building Triton (notebooks 5 to 7 and 9 to 11) failed (exit 1); the log's last line: ")
    assert "ERROR: failed to solve: triton: no space left on device" in message
    assert "run this cell again: the build resumes where it stopped" in message
    log = (node.repo / node_build.STATE_FOLDER / "build.log").read_text()
    assert "---- servelab: triton:build: " in log and "#7 [torch 2/5] RUN pip install torch" in log
    # The node's Jupyter container, waiting for Triton, is told what to do too.
    with pytest.raises(RuntimeError, match=r"failed \(exit 1\).*notebook 2 \(Chameleon's Jupyter\), run the build"):
        node_build.wait_for_service("triton", lambda: False, node.repo)

    del node.env["STANDIN_FAIL"]
    assert node.ask(f"cd {node.repo.name} && python3 -m servelab.node_build start").startswith("Started the build")
    assert Progress(node_build.status(node.repo)).failed() is None, "the last run's failure is not this run's"
    node.follow(until="ray_serve")
    assert node.called() == [*CALLS_BUILDING[:3], *CALLS_BUILDING[2:]]


def test_with_an_image_prefix_the_node_pulls_the_images_and_builds_none(node, capsys):
    (node.repo / ".env").write_text(node_env.env_file("original", "registry.example.org/course/servelab-"))
    assert node_env.image_prefix(node.repo) == "registry.example.org/course/servelab-"
    node.follow(until="ray_serve")
    assert node.called() == [
        "pull fastapi_pt fastapi_onnx image_host gourmetgram jupyter",
        "up -d --no-build fastapi_pt fastapi_onnx image_host gourmetgram jupyter",
        "pull triton",
        "up -d --no-build triton",
        "pull ray_serve",
        "up -d --no-build ray_serve",
    ]


def test_the_env_file_names_the_gpu_variant_and_the_registry_file_only_with_a_prefix():
    # compose.yaml alone is the CPU variant: the node's one line names the GPU file over it.
    assert node_env.env_file("original").splitlines() == [
        "FOOD11_CHECKPOINT=original",
        "COMPOSE_FILE=compose.yaml:docker/compose.gpu.yaml",
    ]
    with_registry = node_env.env_file("", "r.example/x-").splitlines()
    assert with_registry == [
        "FOOD11_CHECKPOINT=",
        "SERVELAB_IMAGE_PREFIX=r.example/x-",
        "COMPOSE_FILE=compose.yaml:docker/compose.gpu.yaml:docker/compose.registry.yaml",
    ]
    for files in (node_env.GPU_FILES, node_env.REGISTRY_FILES):
        assert all((paths.REPO_ROOT / name).is_file() for name in files.split(":")), files


def test_the_jupyter_container_waits_for_a_service_with_the_build_s_progress(node, capsys):
    answers_calls = []
    node_build.wait_for_service("triton", lambda: answers_calls.append(1) or True, node.repo)
    node_build.wait_for_service("triton", lambda: False, node.repo)  # no build here: nothing to follow
    assert answers_calls == [1] and capsys.readouterr().out == ""

    (node.hold / "triton").touch()
    node.follow(until="fastapi")
    wait_until(lambda: "#7 [triton 2/5]" in Progress(node_build.status(node.repo)).line())
    sleeps = []

    def sleep(seconds: float) -> None:  # the student waits; meanwhile Triton's image gets built
        sleeps.append(seconds)
        if len(sleeps) == 3:
            (node.hold / "triton").unlink()
        time.sleep(seconds)

    capsys.readouterr()
    node_build.wait_for_service("triton", lambda: False, node.repo, poll_s=0.05, sleep=sleep)
    out = capsys.readouterr().out
    assert out.startswith(
        "Waiting for Triton (notebooks 5 to 7 and 9 to 11), built in the background since notebook 2. "
    )
    assert "Building Triton (notebooks 5 to 7 and 9 to 11): " in out and "Log: #7 [triton 2/5]" in out
    assert Progress(node_build.status(node.repo)).stage_done("triton") and len(sleeps) >= 3


# ---- a step that prints nothing: a download, or a build that stopped ----------------------------


class FakeStep:
    """A step's process on a fake clock: each wait is `poll_s` long, and the node receives the next figure
    of `per_poll` in it, in bytes; the step ends after the last."""

    def __init__(self, per_poll: list[int], poll_s: float = node_build.POLL_S):
        self.now, self.bytes, self.per_poll, self.poll_s = 0.0, 5_000_000_000, list(per_poll), poll_s

    def wait(self, timeout_s: float) -> int | None:
        assert timeout_s == self.poll_s
        if not self.per_poll:
            return 0
        self.now += timeout_s
        self.bytes += self.per_poll.pop(0)
        return None


def watched(log_path: Path, step: FakeStep) -> tuple[int, list[str]]:
    with open(log_path, "ab", buffering=0) as log:
        code = node_traffic.watch(step.wait, log, step.poll_s, lambda: step.now, lambda: step.bytes)
    return code, [line for line in log_path.read_text().splitlines() if line.startswith("---- servelab: the step")]


def test_a_step_quiet_while_the_node_downloads_says_so_in_the_log_and_one_that_stalled_does_not(tmp_path):
    log_path = tmp_path / "build.log"
    log_path.write_text("#7 [torch 2/5] RUN pip install torch\n#7 Downloading torch-2.14.1+cu126 (3.6 GB)\n")
    per_minute = int(node_traffic.QUIET_S / node_build.POLL_S)
    # pip downloads PyTorch in silence for 5 minutes at 25 MB/s, then the connection hangs for 20.
    download, stall = [25_000_000 * int(node_build.POLL_S)] * (5 * per_minute), [2_000] * (20 * per_minute)
    code, said = watched(log_path, FakeStep(download + stall))
    assert code == 0
    assert len(said) == 5, said  # one a quiet minute while bytes come in, none once they stop
    assert said[0] == (
        "---- servelab: the step printed nothing for 60 s, and the node received 1500 MB meanwhile: "
        "a download (pip says nothing until it is in)"
    )


def test_a_step_that_prints_needs_no_line_whatever_it_downloads(tmp_path):
    log_path = tmp_path / "build.log"
    log_path.touch()
    step = FakeStep([50_000_000] * 40)
    real_wait = step.wait

    def printing(timeout_s: float) -> int | None:  # BuildKit's progress: a line every poll
        log_path.open("a").write("#5 sha256:0a1b 1.2GB / 5.1GB\n")
        return real_wait(timeout_s)

    step.wait = printing
    assert watched(log_path, step) == (0, [])


def state_with_triton_building(repo: Path, log_age_s: float) -> None:
    """The node's state while Triton's stage builds, its log last written `log_age_s` ago."""
    folder = repo / node_build.STATE_FOLDER
    folder.mkdir(parents=True)
    steps = {f"fastapi:{action}": {"status": "done", "attempts": 1} for action in ("build", "start")}
    steps["triton:build"] = {"status": "running", "attempts": 1, "started_at": time.time() - 1500}
    (folder / "state.json").write_text(json.dumps({"steps": steps, "mode": "build"}))
    (folder / "build.log").write_text("#9 [triton 4/9] RUN pip3 install torch\n")
    os.utime(folder / "build.log", (time.time() - log_age_s,) * 2)


@pytest.mark.parametrize("downloading", [True, False], ids=["pip-downloading", "stopped"])
def test_the_jupyter_container_s_alarm_judges_a_silent_download_by_its_bytes(tmp_path, capsys, downloading):
    repo = tmp_path / "serve-system"
    state_with_triton_building(repo, log_age_s=node_build.SILENT_LIMIT_S + 60)
    per_poll = (30_000_000 if downloading else 1_000) * int(node_build.POLL_S)
    with open(repo / node_build.STATE_FOLDER / "build.log", "ab", buffering=0) as log:  # the runner, on the node
        step = FakeStep([per_poll] * int(node_traffic.QUIET_S / node_build.POLL_S))
        node_traffic.watch(step.wait, log, step.poll_s, lambda: step.now, lambda: step.bytes)
    polls = []

    def answers() -> bool:  # Triton answers at the second look: the build went on
        polls.append(1)
        return len(polls) > 1

    if downloading:
        node_build.wait_for_service("triton", answers, repo, poll_s=0, sleep=lambda s: None)
        assert "the node received 1800 MB meanwhile" in capsys.readouterr().out  # 30 MB/s for a minute
    else:
        with pytest.raises(RuntimeError, match=r"The build's log has said nothing for 16 min .*: it stopped"):
            node_build.wait_for_service("triton", answers, repo, poll_s=0, sleep=lambda s: None)


def test_the_bytes_received_are_every_interface_s_but_loopback(tmp_path):
    net_dev = tmp_path / "dev"
    net_dev.write_text(
        "Inter-|   Receive                            |  Transmit\n"
        " face |bytes    packets errs drop fifo frame compressed multicast|bytes packets\n"
        "    lo: 9000000000 1 0 0 0 0 0 0 9000000000 1\n"
        "  eno1: 3600000000 2500000 0 0 0 0 0 0 1200 3\n"
        "docker0: 1000 4 0 0 0 0 0 0 0 0\n"
    )
    assert node_traffic.bytes_received(net_dev) == 3_600_001_000
    assert node_traffic.bytes_received(tmp_path / "none") == 0
    assert node_traffic.bytes_received() > 0  # this machine's own /proc/net/dev
