"""Sample CPU, memory and GPU utilization in the background while a measurement runs.

A latency number alone does not say *why*: a plateau in throughput can be a saturated CPU, a busy
GPU, or neither (then the bottleneck is elsewhere: a lock, a single worker, the network). So a
run samples the machine at a fixed interval:

    with ResourceSampler(interval_s=0.5) as sampler:
        run_load()
    result.resources = sampler.series()

GPUs are read as servelab.measure.gpus can (NVML or nvidia-smi); without either the series says
why it has none. The sampler measures the whole machine, the load's client too where it runs there:
pass the server's process id as `pids` to see the server's own share (or
servelab.measure.processes' ProcessCpu, for named processes alone).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable
from types import TracebackType
from typing import Any

import numpy as np
import psutil

from servelab.measure.gpus import NO_GPU, NVIDIA_SMI_TIMEOUT_S, GpuInfo, GpuReader, open_gpu_reader


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
