"""The lab's images on the GPU node: built (or pulled from a registry) in stages, by a process
detached from the SSH connection that starts it, resumed where it stopped when started again.

    python3 -m servelab.node_build start          # in the clone on the node; returns at once
    python3 -m servelab.node_build status [--json]
    python3 -m servelab.node_build run            # the runner itself, which `start` detaches

A build of every image takes 20-30 minutes, most of it downloads, and a dropped SSH connection
used to kill it. The runner is started in a session of its own (it outlives the connection),
builds what notebooks 3 and 4 need first and starts those services, then builds Triton's image,
the largest, while the student works through the FastAPI notebooks, then Ray Serve's: each stage
is `docker compose build` (or `pull`, where SERVELAB_IMAGE_PREFIX names a registry:
docker/compose.registry.yaml) then `up -d --no-build` of its services. Its state and output are
in the clone (`.lab/node-build/`), where notebook 2 reads them over SSH (`follow`) and the
notebooks in the node's Jupyter container read them directly (`wait_for_service`). A stage that
ran start to end in one go has its time written to notebooks/node_build_times.json, which the
lease plan reads (servelab.node_plan).

Standard library only: notebook 2 imports it on Chameleon's Jupyter server, the node runs it with its system Python.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from servelab import node_traffic
from servelab.node_env import image_prefix

STATE_FOLDER = Path(".lab") / "node-build"  # in the clone, which the Jupyter container mounts
MEASURED_TIMES = Path("notebooks") / "node_build_times.json"
POLL_S = 15.0
SHOW_EVERY_S = 60.0  # a progress line at least this often, and whenever the step changes
SILENT_LIMIT_S = 15 * 60.0  # a log quiet this long: the build stopped (a download says so: servelab.node_traffic)


@dataclass(frozen=True)
class Stage:
    name: str
    what: str  # for the student
    built: tuple[str, ...]  # the services it builds (the torch image first: the others use it)
    started: tuple[str, ...]  # and starts (or pulls, then starts)


STAGES = (
    Stage(
        "fastapi",
        "the FastAPI services, GourmetGram, the image host and Jupyter (notebooks 3 and 4)",
        ("torch", "fastapi_pt", "fastapi_onnx", "image_host", "gourmetgram", "jupyter"),
        ("fastapi_pt", "fastapi_onnx", "image_host", "gourmetgram", "jupyter"),
    ),
    Stage("triton", "Triton (notebooks 5 to 7 and 9 to 11)", ("triton",), ("triton",)),
    Stage("ray_serve", "Ray Serve (notebooks 9 and 10)", ("ray_serve",), ("ray_serve",)),
)


@dataclass(frozen=True)
class Step:
    stage: Stage
    action: str  # "build", "pull" or "start"

    @property
    def name(self) -> str:
        return f"{self.stage.name}:{self.action}"

    def command(self, compose: list[str]) -> list[str]:
        if self.action == "build":
            return [*compose, "--progress", "plain", "build", *self.stage.built]  # a line per step, for the log
        if self.action == "pull":
            return [*compose, "pull", *self.stage.started]
        return [*compose, "up", "-d", "--no-build", *self.stage.started]

    def doing(self) -> str:
        return {"build": "building", "pull": "pulling", "start": "starting"}[self.action]


def steps(pulling: bool) -> list[Step]:
    return [Step(stage, action) for stage in STAGES for action in ("pull" if pulling else "build", "start")]


def stage_of(service: str) -> Stage:
    return next(stage for stage in STAGES if service in stage.started)


# ---- the runner, on the node ------------------------------------------------------------------


def folder(repo: Path) -> Path:
    return repo / STATE_FOLDER


def read_state(repo: Path) -> dict:
    path = folder(repo) / "state.json"
    return json.loads(path.read_text()) if path.is_file() else {"steps": {}}


@contextmanager
def state_lock(repo: Path) -> Iterator[None]:
    """Held around every write of the state: `start` and the runner it started both write it."""
    with open(folder(repo) / "state.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def write_state(repo: Path, state: dict) -> None:
    with state_lock(repo):
        replace_state(repo, state)


def replace_state(repo: Path, state: dict) -> None:
    """The state file replaced whole, so that a reader never sees half a file; under `state_lock`."""
    path = folder(repo) / "state.json"
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(state, indent=1))
    partial.replace(path)


def runner_alive(state: dict) -> bool:
    """Whether the runner that last wrote `state` still runs (on the node: its process is there)."""
    pid = state.get("runner_pid")
    try:
        return pid is not None and b"servelab.node_build" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def record_time(repo: Path, stage: Stage, seconds: float, mode: str) -> None:
    """A stage's time, measured start to end in one go, where the lease plan reads it."""
    path = repo / MEASURED_TIMES
    times = json.loads(path.read_text()) if path.is_file() else {}
    times[stage.name] = {
        "seconds": round(seconds),
        "date": date.today().isoformat(),
        "machine": platform.node(),
        "mode": mode,
    }
    path.write_text(json.dumps(times, indent=2) + "\n")


def run(repo: Path, compose: list[str]) -> int:
    """Each step not done yet, in order, its output appended to the log; stops at a failed step."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the terminal that started it may go
    folder(repo).mkdir(parents=True, exist_ok=True)
    state = read_state(repo)
    mode = "pull" if image_prefix(repo) else "build"
    state.update(runner_pid=os.getpid(), mode=mode)
    write_state(repo, state)
    with open(folder(repo) / "build.log", "ab", buffering=0) as log:
        for step in steps(mode == "pull"):
            record = state["steps"].setdefault(step.name, {"status": "pending", "attempts": 0})
            if record["status"] == "done":
                continue
            command = step.command(compose)
            record.update(status="running", started_at=time.time(), attempts=record["attempts"] + 1)
            write_state(repo, state)
            log.write(f"---- servelab: {step.name}: {shlex.join(command)}\n".encode())
            process = subprocess.Popen(command, cwd=repo, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
            exit_code = node_traffic.watch(node_traffic.exit_code_within(process), log, POLL_S, time.monotonic)
            record.update(ended_at=time.time(), exit_code=exit_code, status="done" if exit_code == 0 else "failed")
            write_state(repo, state)
            if exit_code != 0:
                return 1
            if step.action != "start":
                continue
            stage_steps = [state["steps"][s.name] for s in steps(mode == "pull") if s.stage == step.stage]
            if all(r["attempts"] == 1 for r in stage_steps):
                record_time(repo, step.stage, sum(r["ended_at"] - r["started_at"] for r in stage_steps), mode)
    return 0


def start(repo: Path, compose: list[str]) -> str:
    """Start the runner in a session of its own, unless it runs already; what happened, in a line."""
    state = read_state(repo)
    if runner_alive(state):
        return f"The build runs already (process {state['runner_pid']})."
    if state.get("mode") == ("pull" if image_prefix(repo) else "build") and Progress(status(repo)).current() is None:
        return "Every image is built and its services started."
    folder(repo).mkdir(parents=True, exist_ok=True)
    # Each step not done is pending again before the runner exists, so that a status read before the
    # runner's first write does not report the last run's failure (or its dead runner) as this run's.
    for record in state["steps"].values():
        if record["status"] != "done":
            record["status"] = "pending"
    write_state(repo, state)
    with open(folder(repo) / "runner.log", "ab") as output:
        runner = subprocess.Popen(
            [sys.executable, "-m", "servelab.node_build", "run", "--repo", str(repo), "--compose", shlex.join(compose)],
            cwd=repo,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # setsid: no hang-up when the SSH connection goes
        )
    # At once, so that a status read before the runner writes its own does not find the last runner gone;
    # under the lock, so that this write keeps whatever the runner wrote first.
    with state_lock(repo):
        state = read_state(repo)
        if state.get("runner_pid") != runner.pid:
            state["runner_pid"] = runner.pid
            replace_state(repo, state)
    resumed = [name for name, r in state["steps"].items() if r["status"] == "done"]
    where = f", resuming after {', '.join(resumed)}" if resumed else ""
    return f"Started the build (process {runner.pid}){where}; its log: {STATE_FOLDER / 'build.log'}."


def last_line(log: Path) -> str:
    """The log's last line with text (its last 4 KB are read: the log grows to megabytes)."""
    try:
        with open(log, "rb") as file:
            file.seek(max(0, file.seek(0, os.SEEK_END) - 4096))
            lines = [line.strip() for line in file.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1][:160] if lines else ""


def status(repo: Path, runner_known: bool = True) -> dict:
    """What `Progress` reads: the state, the log's last line and age, and the runner's life (None
    where this process cannot see it: the Jupyter container does not see the node's processes)."""
    state, log = read_state(repo), folder(repo) / "build.log"
    age = time.time() - log.stat().st_mtime if log.is_file() else None
    alive = runner_alive(state) if runner_known else None
    return {"state": state, "last_line": last_line(log), "log_age_s": age, "runner_alive": alive, "now": time.time()}


# ---- reading its progress: over SSH (notebook 2), or in the Jupyter container -------------------


def minutes_seconds(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes} min {seconds} s" if minutes else f"{seconds} s"


@dataclass
class Progress:
    status: dict

    @property
    def records(self) -> dict[str, dict]:
        return self.status["state"]["steps"]

    @property
    def pulling(self) -> bool:
        return self.status["state"].get("mode") == "pull"

    def current(self) -> tuple[Step, dict] | None:
        """The first step not done, with its record; None when every step is done."""
        for step in steps(self.pulling):
            record = self.records.get(step.name, {"status": "pending"})
            if record["status"] != "done":
                return step, record
        return None

    def stage_done(self, stage: str) -> bool:
        return self.records.get(f"{stage}:start", {}).get("status") == "done"

    def failed(self) -> str | None:
        """What failed and how, or None."""
        found = self.current()
        if found is None or found[1]["status"] != "failed":
            return None
        step, record = found
        return (
            f"{step.doing()} {step.stage.what} failed (exit {record.get('exit_code')}); the log's last line: "
            f"{self.status['last_line'] or '(empty)'}"
        )

    def stopped(self) -> bool:
        """The runner is gone with steps left (the node rebooted, or someone ended it)."""
        return self.current() is not None and self.status["runner_alive"] is False and not self.failed()

    def line(self) -> str:
        found = self.current()
        if found is None:
            return "Every image is built and its services started."
        step, record = found
        if record["status"] != "running":
            return f"Next: {step.doing()} {step.stage.what}."
        so_far = minutes_seconds(self.status["now"] - record["started_at"])
        return f"{step.doing().capitalize()} {step.stage.what}: {so_far} so far. Log: {self.status['last_line']}"


def follow(
    ask: Callable[[str], str],
    repo_dir: str,
    until: str = "fastapi",
    poll_s: float = POLL_S,
    sleep: Callable[[float], None] = time.sleep,
    ssh_retries: int = 5,
) -> Progress:
    """From Chameleon's Jupyter (notebook 2): start the build on the node (`ask` runs a command
    there and returns what it printed), then show its progress until stage `until` is started.
    Raises RuntimeError, saying what to do, where a step failed or the runner stopped; a dropped
    SSH connection is retried (the build goes on without it)."""
    here = f"cd {shlex.quote(repo_dir)} && python3 -m servelab.node_build"
    shown, shown_at, failures = "", 0.0, 0
    print(ask(f"{here} start").strip())
    while True:
        try:
            progress = Progress(json.loads(ask(f"{here} status --json")))
            failures = 0
        except Exception as exc:  # fabric and paramiko raise their own classes; the build runs on without SSH
            failures += 1
            if failures > ssh_retries:
                raise RuntimeError(f"The node stopped answering ({exc}): run this cell again.") from exc
            print(f"The node did not answer ({exc}); asking again in {poll_s:.0f} s.")
            sleep(poll_s)
            continue
        if problem := progress.failed():
            raise RuntimeError(
                f"{problem}. Read {repo_dir}/{STATE_FOLDER}/build.log on the node, fix the cause, "
                "and run this cell again: the build resumes where it stopped."
            )
        if progress.stopped():
            raise RuntimeError(
                "The build stopped before it finished (did the node restart?): run this cell again, "
                "and it resumes where it stopped."
            )
        step = progress.current()
        if progress.stage_done(until):
            print(
                progress.line() if step is None else f"Done: {stage(until).what}. In the background: {progress.line()}"
            )
            return progress
        now = time.monotonic()
        if step is not None and (f"{step[0].name} {step[1]['status']}" != shown or now - shown_at >= SHOW_EVERY_S):
            print(progress.line())
            shown, shown_at = f"{step[0].name} {step[1]['status']}", now
        sleep(poll_s)


def stage(name: str) -> Stage:
    return next(stage for stage in STAGES if stage.name == name)


def wait_for_service(
    service: str,
    answers: Callable[[], bool],
    repo: Path,
    poll_s: float = POLL_S,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """In the node's Jupyter container: return at once where `service` answers, or where no build
    runs here (`make test-docker`, a Docker host of one's own); else show its stage's progress until
    it is built and started. Raises RuntimeError, saying what to do, where its build failed or stopped."""
    shown_at = 0.0
    while not answers():
        if not (folder(repo) / "state.json").is_file():
            return
        progress = Progress(status(repo, runner_known=False))
        if progress.stage_done(stage_of(service).name):
            return  # started: the caller waits for it to answer, as for any service
        if problem := progress.failed():
            raise RuntimeError(f"{problem}. In notebook 2 (Chameleon's Jupyter), run the build cell again.")
        silent = progress.status["log_age_s"]
        if silent is not None and silent > SILENT_LIMIT_S:
            raise RuntimeError(
                f"The build's log has said nothing for {minutes_seconds(silent)}: it stopped. "
                "In notebook 2 (Chameleon's Jupyter), run the build cell again."
            )
        if time.monotonic() - shown_at >= SHOW_EVERY_S:
            print(f"Waiting for {stage_of(service).what}, built in the background since notebook 2. {progress.line()}")
            shown_at = time.monotonic()
        sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m servelab.node_build", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("start", "status", "run"))
    parser.add_argument("--repo", type=Path, default=Path.cwd(), help="the clone (default: this folder)")
    parser.add_argument("--compose", default="docker compose", help="the Compose command (default: docker compose)")
    parser.add_argument("--json", action="store_true", help="status: as JSON, for `follow`")
    args = parser.parse_args(argv)
    repo, compose = args.repo.resolve(), shlex.split(args.compose)
    if args.action == "run":
        return run(repo, compose)
    if args.action == "start":
        print(start(repo, compose))
    elif args.json:
        print(json.dumps(status(repo)))
    else:
        print(Progress(status(repo)).line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
