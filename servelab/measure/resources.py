"""Sample CPU, memory and GPU utilization in the background while a measurement runs.

A latency number alone does not say *why*: a plateau in throughput can be a saturated CPU, a busy
GPU, or neither (then the bottleneck is elsewhere: a lock, a single worker, the network). So a
run samples the machine at a fixed interval:

    with ResourceSampler(interval_s=0.5) as sampler:
        run_load()
    result.resources = sampler.series()

GPUs are read through NVML (the `pynvml` module, from the `nvidia-ml-py` package) when it is
installed, else through `nvidia-smi`; on a machine with neither the series says so and has no
GPU entries. The sampler measures the whole machine, so the client generating the load counts
too when it runs on the same machine: pass the server's process id as `pids` to see the
server's own share.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import numpy as np
import psutil

NO_GPU = "none (no NVIDIA GPU found)"
NVIDIA_SMI_QUERY = "index,name,utilization.gpu,memory.used,memory.total"
NVIDIA_SMI_TIMEOUT_S = 5.0


@dataclass
class GpuInfo:
    index: int
    name: str
    memory_total_mib: float


class GpuReader(Protocol):
    source: str
    gpus: list[GpuInfo]

    def read(self) -> list[tuple[float, float]]:
        """(utilization %, memory used MiB) of each GPU, in the order of `gpus`."""

    def close(self) -> None: ...


class NvmlReader:
    source = "nvml"

    def __init__(self) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            pynvml.nvmlShutdown()
            raise RuntimeError("NVML lists no GPU")
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self.gpus = []
        for index, handle in enumerate(self._handles):
            name = pynvml.nvmlDeviceGetName(handle)
            # Older pynvml releases return the name as bytes.
            name = name.decode() if isinstance(name, bytes) else name
            self.gpus.append(GpuInfo(index, name, pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**20))

    def read(self) -> list[tuple[float, float]]:
        readings = []
        for handle in self._handles:
            try:
                utilization = float(self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except self._nvml.NVMLError:
                # A MIG slice, for instance, has no utilization counter of its own.
                utilization = math.nan
            readings.append((utilization, self._nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20))
        return readings

    def close(self) -> None:
        self._nvml.nvmlShutdown()


class NvidiaSmiReader:
    source = "nvidia-smi"

    def __init__(self, binary: str) -> None:
        self._binary = binary
        rows = self._query()
        if not rows:
            raise RuntimeError("nvidia-smi lists no GPU")
        self.gpus = [GpuInfo(int(row[0]), row[1], _number(row[4])) for row in rows]

    def _query(self) -> list[list[str]]:
        completed = subprocess.run(
            [self._binary, f"--query-gpu={NVIDIA_SMI_QUERY}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
        )
        if completed.returncode != 0:
            raise RuntimeError(f"nvidia-smi failed: {(completed.stderr or completed.stdout).strip()}")
        rows = []
        for line in completed.stdout.strip().splitlines():
            fields = [value.strip() for value in line.split(",")]
            # The name is the only field that could hold a comma: rejoin whatever lies between.
            rows.append([fields[0], ",".join(fields[1:-3]), *fields[-3:]])
        return rows

    def read(self) -> list[tuple[float, float]]:
        return [(_number(row[2]), _number(row[3])) for row in self._query()]

    def close(self) -> None:
        pass


def _number(text: str) -> float:
    """nvidia-smi prints "[N/A]" (or "[Not Supported]") where a GPU has no such counter."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def open_gpu_reader() -> tuple[GpuReader | None, str]:
    """The best available way to read the GPUs, and how they are read (the series' gpu_source)."""
    problems = []
    try:
        return NvmlReader(), NvmlReader.source
    except ImportError:
        pass  # nvidia-ml-py is optional; nvidia-smi gives the same numbers
    except Exception as exc:  # pynvml raises NVMLError subclasses when there is no driver or GPU
        problems.append(f"NVML: {exc}")
    binary = shutil.which("nvidia-smi")
    if binary:
        try:
            return NvidiaSmiReader(binary), NvidiaSmiReader.source
        except (OSError, RuntimeError, subprocess.SubprocessError, ValueError, IndexError) as exc:
            problems.append(f"nvidia-smi: {exc}")
    # Say why a GPU that seems to be there could not be read: a missing driver looks like this.
    return None, (f"{NO_GPU[:-1]}; {'; '.join(problems)})" if problems else NO_GPU)


def _busy_and_total(times: Any) -> tuple[float, float]:
    """Busy and total CPU seconds, counted the way psutil.cpu_percent counts them.

    Computed here from cpu_times() rather than with psutil.cpu_percent(), whose "since the last
    call" state is global to the process: two samplers (or any other caller) would corrupt it.
    """
    # Linux counts guest time inside user time already; iowait is idle time.
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    idle = times.idle + getattr(times, "iowait", 0.0)
    return total - idle, total


def _percent(before: Any, after: Any) -> float:
    busy_before, total_before = _busy_and_total(before)
    busy_after, total_after = _busy_and_total(after)
    elapsed = total_after - total_before
    return round(min(100.0, max(0.0, 100.0 * (busy_after - busy_before) / elapsed)), 1) if elapsed > 0 else 0.0


class ResourceSampler:
    """Background sampling of the machine every `interval_s` seconds, as a context manager.

    The first sample comes one interval after the start (a CPU percentage needs an interval),
    and a last one when the sampler stops. `pids`: processes whose CPU use, with all their
    children, is sampled too ("process_cpu_percent", in % of one core as `top` shows it, so up
    to 100 x cores).
    """

    def __init__(self, interval_s: float = 0.5, pids: Iterable[int] = ()) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.interval_s = interval_s
        self.pids = list(pids)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gpu_reader: GpuReader | None = None
        self._gpu_source = NO_GPU
        self._gpus: list[GpuInfo] = []
        self._processes: dict[int, psutil.Process] = {}
        self._t_s: list[float] = []
        self._cpu: list[float] = []
        self._per_core: list[list[float]] = []
        self._memory: list[float] = []
        self._process_cpu: list[float] = []
        self._gpu_util: list[list[float]] = []
        self._gpu_memory: list[list[float]] = []
        self._errors: list[str] = []

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> ResourceSampler:
        if self._thread is not None:
            raise RuntimeError("a ResourceSampler samples once; create a new one for another run")
        self._gpu_reader, self._gpu_source = open_gpu_reader()
        self._gpus = self._gpu_reader.gpus if self._gpu_reader else []
        self._gpu_util = [[] for _ in self._gpus]
        self._gpu_memory = [[] for _ in self._gpus]
        self._process_tree_cpu()  # the first cpu_percent() of a process only sets its starting point
        self._thread = threading.Thread(target=self._run, name="resource-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling and wait for the thread; safe to call more than once."""
        self._stop.set()
        if self._thread is not None:
            # A sample in flight may wait on nvidia-smi, which has its own timeout.
            self._thread.join(timeout=self.interval_s + NVIDIA_SMI_TIMEOUT_S + 5)
        if self._gpu_reader is not None:
            self._gpu_reader.close()
            self._gpu_reader = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> ResourceSampler:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    # ---- sampling -------------------------------------------------------------------------

    def _run(self) -> None:
        start = time.monotonic()
        total, per_core = psutil.cpu_times(), psutil.cpu_times(percpu=True)
        last_sample = start
        next_due = start + self.interval_s
        try:
            # Sample on a fixed schedule, so a slow nvidia-smi call does not stretch the interval.
            while not self._stop.wait(max(0.0, next_due - time.monotonic())):
                total, per_core = self._sample(start, total, per_core)
                last_sample = time.monotonic()
                # A sample that overran its slot skips the missed ones rather than bunching samples up.
                while next_due <= last_sample:
                    next_due += self.interval_s
            # One last sample for the time since the previous one, unless that is so short that
            # the kernel's CPU time counters (10 ms ticks) would make its percentages noise.
            if time.monotonic() - last_sample >= max(0.05, self.interval_s / 10):
                self._sample(start, total, per_core)
        except Exception as exc:  # recorded in the series rather than lost with the thread
            with self._lock:
                self._errors.append(f"sampling stopped at t={time.monotonic() - start:.1f} s: {exc!r}")

    def _sample(self, start: float, total_before: Any, per_core_before: Any) -> tuple[Any, Any]:
        total, per_core = psutil.cpu_times(), psutil.cpu_times(percpu=True)
        memory = psutil.virtual_memory().percent
        process_cpu = self._process_tree_cpu() if self.pids else None
        gpu_readings = self._read_gpus()
        with self._lock:
            self._t_s.append(round(time.monotonic() - start, 3))
            self._cpu.append(_percent(total_before, total))
            self._per_core.append([_percent(b, a) for b, a in zip(per_core_before, per_core, strict=True)])
            self._memory.append(memory)
            if process_cpu is not None:
                self._process_cpu.append(process_cpu)
            for index, (utilization, memory_used) in enumerate(gpu_readings):
                self._gpu_util[index].append(utilization)
                self._gpu_memory[index].append(round(memory_used, 1))
        return total, per_core

    def _read_gpus(self) -> list[tuple[float, float]]:
        if self._gpu_reader is None:
            return []
        try:
            return self._gpu_reader.read()
        except Exception as exc:  # one failed reading is a gap in the series, not the end of the run
            message = f"GPU reading failed: {exc!r}"
            with self._lock:
                if message not in self._errors:
                    self._errors.append(message)
            return [(math.nan, math.nan)] * len(self._gpus)

    def _process_tree_cpu(self) -> float:
        """CPU % (of one core) of the `pids` processes and all their descendants, now alive."""
        total = 0.0
        seen: dict[int, psutil.Process] = {}
        for pid in self.pids:
            try:
                root = self._processes.get(pid) or psutil.Process(pid)
                tree = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue  # the process has ended: it uses no CPU any more
            for process in tree:
                # Keep the same Process object between samples: cpu_percent() measures since its last call.
                process = self._processes.get(process.pid, process)
                try:
                    total += process.cpu_percent(interval=None)
                except psutil.Error:
                    continue
                seen[process.pid] = process
        self._processes = seen
        return round(total, 1)

    # ---- results --------------------------------------------------------------------------

    def series(self) -> dict[str, Any]:
        """The samples so far, JSON-able; `cpu_per_core[i]` holds every core's % at `t_s[i]`."""
        with self._lock:
            series: dict[str, Any] = {
                "interval_s": self.interval_s,
                "t_s": list(self._t_s),
                "cpu_count": len(self._per_core[0]) if self._per_core else psutil.cpu_count(),
                "cpu_percent": list(self._cpu),
                "cpu_per_core": [list(cores) for cores in self._per_core],
                "memory_percent": list(self._memory),
                "gpus": [
                    {
                        "index": gpu.index,
                        "name": gpu.name,
                        "util_percent": list(self._gpu_util[i]),
                        "memory_used_mib": list(self._gpu_memory[i]),
                        "memory_total_mib": round(gpu.memory_total_mib, 1),
                    }
                    for i, gpu in enumerate(self._gpus)
                ],
                "gpu_source": self._gpu_source,
                "errors": list(self._errors),
            }
            if self.pids:
                series["pids"] = list(self.pids)
                series["process_cpu_percent"] = list(self._process_cpu)
        return series

    def summary(self) -> dict[str, Any]:
        return summarize(self.series())


class ProcessCpu:
    """CPU used by each of some processes over a block, in % of one core (as `top` shows it):

    with ProcessCpu({"food_classifier_0_0": 4242}) as usage:
        run_load()
    usage.percent  # {"food_classifier_0_0": 97.5}

    A process that ends during the block counts what it used until its last reading.
    """

    def __init__(self, pids: dict[str, int]) -> None:
        self._processes = {}
        for name, pid in pids.items():
            try:
                self._processes[name] = psutil.Process(pid)
            except psutil.NoSuchProcess:
                continue
        self.percent: dict[str, float] = {}

    def _cpu_s(self) -> dict[str, float]:
        seconds = {}
        for name, process in self._processes.items():
            try:
                times = process.cpu_times()
                seconds[name] = times.user + times.system
            except psutil.NoSuchProcess:
                continue
        return seconds

    def __enter__(self) -> ProcessCpu:
        self._started, self._before = time.monotonic(), self._cpu_s()
        return self

    def __exit__(self, *exc_info: object) -> None:
        wall_s, after = time.monotonic() - self._started, self._cpu_s()
        self.percent = {
            name: round(100 * (after[name] - self._before[name]) / wall_s, 1)
            for name in after
            if name in self._before and wall_s > 0
        }


def triton_instance_processes(repository: Path, model: str) -> dict[str, int]:
    """The processes of a Python-backend model's instances on this machine (name -> pid): the
    backend's stub processes started for `model` from the model repository `repository`."""
    found = {}
    model_dir = str(Path(repository) / model) + "/"
    for process in psutil.process_iter(["cmdline"]):
        command = process.info["cmdline"] or []
        if len(command) > 2 and command[0].endswith("triton_python_backend_stub") and command[1].startswith(model_dir):
            found[command[-2]] = process.pid  # the stub's next-to-last argument is the instance's name
    return dict(sorted(found.items()))


def _mean_max(values: list[float]) -> tuple[float, float]:
    """Mean and maximum ignoring NaN gaps; NaN when there is nothing to summarize."""
    array = np.asarray(values, dtype=float)
    array = array[~np.isnan(array)]
    return (round(float(array.mean()), 1), round(float(array.max()), 1)) if array.size else (math.nan, math.nan)


def summarize(series: dict[str, Any]) -> dict[str, Any]:
    """Mean and peak of each series of `ResourceSampler.series()` (also of one loaded from JSON)."""
    cpu_mean, cpu_max = _mean_max(series["cpu_percent"])
    summary: dict[str, Any] = {
        "samples": len(series["t_s"]),
        "duration_s": series["t_s"][-1] if series["t_s"] else 0.0,
        "cpu_percent_mean": cpu_mean,
        "cpu_percent_max": cpu_max,
        "memory_percent_max": _mean_max(series["memory_percent"])[1],
    }
    if "process_cpu_percent" in series:
        summary["process_cpu_percent_mean"], summary["process_cpu_percent_max"] = _mean_max(
            series["process_cpu_percent"]
        )
    summary["gpus"] = []
    for gpu in series["gpus"]:
        util_mean, util_max = _mean_max(gpu["util_percent"])
        summary["gpus"].append(
            {
                "index": gpu["index"],
                "name": gpu["name"],
                "util_percent_mean": util_mean,
                "util_percent_max": util_max,
                "memory_used_mib_max": _mean_max(gpu["memory_used_mib"])[1],
                "memory_total_mib": gpu["memory_total_mib"],
            }
        )
    summary["gpu_source"] = series["gpu_source"]
    if "processes" in series:  # ProcessCpu's reading, kept beside the series
        summary["processes"] = dict(series["processes"])
    return summary
