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

from servelab.service.hardware import nvidia_smi

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
        rows = nvidia_smi(NVIDIA_SMI_QUERY, binary, NVIDIA_SMI_TIMEOUT_S)
        if not rows:
            raise RuntimeError("nvidia-smi lists no GPU")
        self.gpus = [GpuInfo(int(row[0]), row[1], _number(row[4])) for row in rows]

    def read(self) -> list[tuple[float, float]]:
        rows = nvidia_smi(NVIDIA_SMI_QUERY, self._binary, NVIDIA_SMI_TIMEOUT_S)
        return [(_number(row[2]), _number(row[3])) for row in rows]

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
