"""Threads are a resource: how many cores this process may use, and how to split them.

A model server on a CPU has two knobs. *Inference slots*: how many inferences run at once
(FastAPI's PREDICT_CONCURRENCY, or Triton's instance count). *Threads per inference*: how many
threads one inference spreads over (PyTorch's and ONNX Runtime's intra-op threads). Each running
inference has its own team of threads, so the busy threads are the running inferences times
their threads. More than the cores, and every inference is slower: the teams take turns.

The defaults never exceed the cores: a slot per core of a process's share, one thread each, beside
a GPU too (the other slots decode while one's inference runs there). The services plan their own in
their app.py; `thread_plan` describes such a plan, and `service_plan` is the lab's copy of the apps'
rule of processes, for the in-process ceilings and notebook 4's expectations (a test holds the two
equal: tests/test_fastapi_services.py). Either knob can be set past the cores (PREDICT_CONCURRENCY,
INFERENCE_THREADS), for the lab's experiment: the plan then says so.

"The cores this process may use" respects CPU affinity (taskset, Docker's --cpuset-cpus) and a
container's CPU quota (Docker's --cpus: cgroup cpu.max), not just the machine's cores.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
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
# handlers' Python, launching a GPU's kernels), so a service runs several, each on a share of the
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
    """How a prediction service uses the machine, as its app.py plans it: its processes, and in each
    one the cores it may use and its inference slots (one thread each; a slot decodes its own photo)."""

    processes: int
    cores_each: int  # cores each process may use: the machine's, shared out
    slots: int  # inference slots of each process
    chosen_by: str = "the defaults"

    def describe(self) -> str:
        return (
            f"{self.processes} process(es), each with {self.cores_each} core(s) and {self.slots} inference slot(s) "
            f"of one thread, each slot decoding its own photo ({self.chosen_by})"
        )


def service_plan(cores: int, on_gpu: bool, processes: int | None = None) -> ServicePlan:
    """The plan for a service on `cores` cores, on a GPU or not; `processes` as given (WEB_CONCURRENCY),
    else planned as the FastAPI apps plan them (`python app.py`). The rules, each measured (the constants
    above say where): on a CPU, a process per CPU_CORES_PER_PROCESS cores (at least one); on a GPU, a
    process per GPU_CORES_PER_PROCESS cores, at most MOST_PROCESSES_ON_A_GPU. Either way a slot per core
    of a process's share: beside a GPU, the other slots decode while one's inference runs there.
    """
    chosen_by = "the defaults" if processes is None else f"set by WEB_CONCURRENCY={processes}"
    if processes is None:
        if on_gpu:
            processes = min(MOST_PROCESSES_ON_A_GPU, cores // GPU_CORES_PER_PROCESS)
        else:
            processes = cores // CPU_CORES_PER_PROCESS
        processes = max(1, processes)
    cores_each = max(1, cores // processes)
    return ServicePlan(processes, cores_each, cores_each, chosen_by)


@dataclass(frozen=True)
class ThreadPlan:
    """How one process uses its cores for inference."""

    slots: int  # inferences that may run at once
    threads: int  # intra-op threads of each inference
    cores: int  # cores this process may use
    chosen_by: str  # what set it: the defaults, or which environment variables

    @property
    def busy_threads(self) -> int:
        """The most threads busy at once, when every slot runs an inference."""
        return self.slots * self.threads

    @property
    def oversubscribed(self) -> bool:
        return self.busy_threads > self.cores

    def describe(self) -> str:
        text = (
            f"{self.slots} inference slot(s), {self.threads} thread(s) each: at most {self.busy_threads} busy "
            f"threads on {self.cores} core(s) ({self.chosen_by})"
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
    threads = threads or max(1, cores // slots)  # each slot its share of the cores
    return ThreadPlan(slots, threads, cores, "set by " + ", ".join(chosen) if chosen else "the defaults")
