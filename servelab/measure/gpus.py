"""Reading the GPUs' utilization and memory, for servelab.measure.resources' sampler: through NVML
(the `pynvml` module, from the `nvidia-ml-py` package) when it is installed, else through
`nvidia-smi` (`open_gpu_reader`); on a machine with neither, no reader and why (NO_GPU).
"""

from __future__ import annotations

import math
import shutil
import subprocess
from dataclasses import dataclass
from typing import Protocol

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
