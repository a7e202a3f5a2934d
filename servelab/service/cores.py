"""Threads are a resource: how many cores this process may use, and how to split them.

A model server on a CPU has two knobs. *Inference slots*: how many inferences run at once
(FastAPI's PREDICT_CONCURRENCY, or Triton's instance count). *Threads per inference*: how many
threads one inference spreads over (PyTorch's and ONNX Runtime's intra-op threads). Each running
inference has its own team of threads, so the busy threads are the running inferences times
their threads. More than the cores, and every inference is slower: the teams take turns.

The defaults never exceed the cores. On a CPU, a service gets one slot per core, and its
threads are *elastic*: an inference gets the cores divided by the inferences running when it
starts. One request alone uses every core (lowest latency); under load each slot has a core of
its own (highest throughput). Triton's instances are processes of their own: they count the
instances at work (decoding included) through lock files (`RunningAcrossProcesses`), and share
the cores out the same way. On a GPU, one slot: the GPU runs one inference at a time anyway, and
the CPU's cores go to decoding. More slots do not feed it better: measured with fastapi_pt on an
H100 (16 cores, 16 clients, alternating runs), one slot served 129 and 145 requests/s, two slots
117 and 127. A batch-1 MobileNetV2 keeps the GPU about 10% busy either way: what limits it is the
Python that launches its kernels, which shares one interpreter with the server and the decoding.

Either knob can be set by an environment variable (PREDICT_CONCURRENCY, INFERENCE_THREADS; a
given thread count is fixed, not elastic), also past the cores, for the lab's experiment: the
plan then says so, and the services log it and report it in /health.

"The cores this process may use" respects CPU affinity (taskset, Docker's --cpuset-cpus) and a
container's CPU quota (Docker's --cpus, Kubernetes limits: cgroup cpu.max), not just the number
of cores the machine has. Standard library only, like the rest of what every service imports
from this package where no runtime is installed.
"""

from __future__ import annotations

import fcntl
import hashlib
import math
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

CGROUP_V2_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1_QUOTA = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
CGROUP_V1_PERIOD = Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us")


def _cgroup_quota_cores() -> float | None:
    """The container's CPU quota in cores, or None when there is none."""
    try:
        quota, period = CGROUP_V2_CPU_MAX.read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int(CGROUP_V1_QUOTA.read_text())
        return None if quota_us <= 0 else quota_us / int(CGROUP_V1_PERIOD.read_text())
    except (OSError, ValueError):
        return None


def available_cores() -> int:
    """The cores this process may use: its CPU affinity, capped by the container's CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_quota_cores()
    if quota is not None:
        cores = min(cores, max(1, math.floor(quota)))
    return max(1, cores)


def positive_int_setting(name: str, environ: Mapping[str, str]) -> int | None:
    """The whole number > 0 in environment variable `name`; None when unset; ValueError saying
    what to do when it is anything else."""
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a whole number; set it to a positive integer, or unset it.") from None
    if value < 1:
        raise ValueError(f"{name}={value} must be at least 1 (or unset, for the default).")
    return value


# One Python process serves at most what its one interpreter lock lets through (HTTP, JSON, the
# scheduler's Python, launching a GPU's kernels), so a service runs several, each on a share of the
# cores. Measured on 16 cores and an H200 (2026-11-26, c=16 / c=64, 32 KB photo, one client process):
# - fastapi_onnx on the CPU: 1 process of 16 slots 345 / 321 req/s; 2 of 8 810 / 936; 4 of 4 1,007 /
#   1,149 (4 decoding threads each); 8 of 2 1,034 / 1,358 (1 each): two cores a process.
# - fastapi_pt on the GPU: 1 process 172 / 163 req/s; 2 365 / 322; 3 541 / 546; 4 713 / 726; 8 (of 2
#   cores) 542 / 636: four cores a process, each feeding the GPU while the others run Python, and at
#   most four, which also keeps their GPU memory (about 750 MiB each) well within a P100's 16 GiB.
CPU_CORES_PER_PROCESS = 2
GPU_CORES_PER_PROCESS = 4
MOST_PROCESSES_ON_A_GPU = 4


@dataclass(frozen=True)
class ServicePlan:
    """How a prediction service uses the machine: its processes, and in each one the cores it may
    use, its inference slots and its decoding threads."""

    processes: int
    cores_each: int  # cores each process may use: the machine's, shared out
    slots: int  # inference slots of each process
    decoding_threads: int  # threads that decode and preprocess images, in each process
    chosen_by: str = "the defaults"

    def describe(self) -> str:
        return (
            f"{self.processes} process(es), each with {self.cores_each} core(s), {self.slots} inference slot(s) "
            f"and {self.decoding_threads} decoding thread(s) ({self.chosen_by})"
        )


def service_plan(cores: int, on_gpu: bool, processes: int | None = None) -> ServicePlan:
    """The plan for a service on `cores` cores, on a GPU or not; `processes` as given (SERVICE_PROCESSES),
    else planned. The rules, each measured (the constants above say where):

    - On a CPU: a process per CPU_CORES_PER_PROCESS cores (at least one), a slot per core of its
      share, and a decoding thread per two slots (2 cores: one; more would take cores from the
      inference threads).
    - On a GPU: a process per GPU_CORES_PER_PROCESS cores, at most MOST_PROCESSES_ON_A_GPU; one slot
      each (the GPU runs one inference at a time anyway), and every core of its share decodes:
      there, decoding is the CPU's main work.
    """
    chosen_by = "the defaults" if processes is None else f"set by SERVICE_PROCESSES={processes}"
    if processes is None:
        if on_gpu:
            processes = min(MOST_PROCESSES_ON_A_GPU, cores // GPU_CORES_PER_PROCESS)
        else:
            processes = cores // CPU_CORES_PER_PROCESS
        processes = max(1, processes)
    cores_each = max(1, cores // processes)
    if on_gpu:
        return ServicePlan(processes, cores_each, 1, cores_each, chosen_by)
    return ServicePlan(processes, cores_each, cores_each, max(1, cores_each // 2), chosen_by)


@dataclass(frozen=True)
class ThreadPlan:
    """How one process uses its cores for inference."""

    slots: int  # inferences that may run at once
    threads: int  # intra-op threads of an inference (of one running alone, when elastic)
    cores: int  # cores this process may use
    chosen_by: str  # what set it: the defaults, or which environment variables
    elastic: bool = False  # an inference gets cores // (inferences running) threads, at most `threads`

    def threads_for(self, running: int) -> int:
        """The threads of an inference that starts while `running` inferences (itself included) run."""
        if not self.elastic:
            return self.threads
        return max(1, min(self.threads, self.cores // max(1, running)))

    def thread_counts(self) -> list[int]:
        """Every thread count an inference may be given."""
        return sorted({self.threads_for(running) for running in range(1, self.slots + 1)})

    @property
    def busy_threads(self) -> int:
        """The most threads busy at once, when every slot runs an inference."""
        return max(running * self.threads_for(running) for running in range(1, self.slots + 1))

    @property
    def oversubscribed(self) -> bool:
        return self.busy_threads > self.cores

    def describe(self) -> str:
        if self.elastic:
            threads = (
                f"elastic threads: {self.threads_for(1)} for an inference alone, "
                f"{self.threads_for(self.slots)} each when all run"
            )
        else:
            threads = f"{self.threads} thread(s) each"
        text = (
            f"{self.slots} inference slot(s), {threads}: at most {self.busy_threads} busy threads "
            f"on {self.cores} core(s) ({self.chosen_by})"
        )
        if self.oversubscribed:
            text += ": MORE THREADS THAN CORES, so every inference is slowed by the others"
        return text


def thread_plan(
    slots: int | None = None,
    threads: int | None = None,
    *,
    device: str = "cpu",
    cores: int | None = None,
    environ: Mapping[str, str] | None = None,
    given_by: str = "the caller",
) -> ThreadPlan:
    """The plan for a process: `slots` and `threads` as given, else from PREDICT_CONCURRENCY and
    INFERENCE_THREADS, else the defaults above. `given_by` names where given values came from."""
    environ = os.environ if environ is None else environ
    cores = cores or available_cores()
    chosen = [] if slots is None and threads is None else [given_by]
    if slots is None and (slots := positive_int_setting("PREDICT_CONCURRENCY", environ)) is not None:
        chosen.append(f"PREDICT_CONCURRENCY={slots}")
    if threads is None and (threads := positive_int_setting("INFERENCE_THREADS", environ)) is not None:
        chosen.append(f"INFERENCE_THREADS={threads}")
    on_gpu = device.startswith("cuda")
    slots = slots or service_plan(cores, on_gpu, processes=1).slots
    elastic = threads is None and slots > 1 and not on_gpu
    if threads is None:  # elastic: a lone inference gets every core; fixed: each slot its share
        threads = cores if elastic else max(1, cores // slots)
    return ThreadPlan(slots, threads, cores, "set by " + ", ".join(chosen) if chosen else "the defaults", elastic)


class RunningAcrossProcesses:
    """How many inferences run now in a group of processes (Triton's instances of one model).

    Each process holds an exclusive lock on a file of its own while it infers, and counts the
    locked files of the group. The kernel drops the locks of a process that dies, so a crashed
    instance is never counted as running. One gate lock makes "mark myself, then count" atomic,
    so two inferences that start together see each other.
    """

    def __init__(self, group: str, member: str, directory: Path | None = None):
        self.directory = (directory or Path(tempfile.gettempdir())) / f"servelab-running-{group}"
        self.directory.mkdir(parents=True, exist_ok=True)
        self._gate = os.open(self.directory / ".gate", os.O_RDWR | os.O_CREAT, 0o600)
        self._own_path = self.directory / member
        self._own = os.open(self._own_path, os.O_RDWR | os.O_CREAT, 0o600)

    def _locked(self, path: Path) -> bool:
        try:
            probe = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # a member that left meanwhile
            return False
        try:
            fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(probe)  # closing drops the probe's lock, never the member's own

    @contextmanager
    def running(self) -> Iterator[int]:
        """Mark this process as inferring; yields how many of the group infer, itself included."""
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._own, fcntl.LOCK_EX)
            count = sum(self._locked(path) for path in self.directory.iterdir() if path.name != ".gate")
        finally:
            fcntl.flock(self._gate, fcntl.LOCK_UN)
        try:
            yield max(1, count)
        finally:
            fcntl.flock(self._own, fcntl.LOCK_UN)

    @classmethod
    def of_triton_model(cls, model: str, model_repository: str, instance: str) -> RunningAcrossProcesses:
        """The group of a Triton model's instances, `instance` its member: one group per model
        and per server (the servers of the lab each load a repository of their own)."""
        server = hashlib.sha1(model_repository.encode()).hexdigest()[:12]
        return cls(f"{model}-{server}", instance)

    def close(self) -> None:
        """Leave the group (Triton's finalize): the member's file goes, the group's folder stays."""
        os.close(self._own)
        os.close(self._gate)
        self._own_path.unlink(missing_ok=True)


@contextmanager
def threads_at_work(plan: ThreadPlan, group: RunningAcrossProcesses | None) -> Iterator[int]:
    """The threads a Triton instance may use while the block runs. With a group (elastic threads
    across instances), the instance counts as at work for the whole block, decoding included, and
    gets its share of the cores: counting the inference alone let one instance infer on every core
    while another decoded, one thread too many (measured with 2 instances on 2 cores at 8 clients:
    0.73 of the in-process ceiling, against 1.0 when decoding counts too; medians of 3 alternating
    runs). Without a group, the plan's fixed count."""
    if group is None:
        yield plan.threads
        return
    with group.running() as at_work:
        yield plan.threads_for(at_work)
