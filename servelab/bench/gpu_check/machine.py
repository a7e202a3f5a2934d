"""The machine the GPU check runs on: whether it has an NVIDIA GPU (what nvidia-smi, NVML and PyTorch
each see, and the message when none does), the GPU memory each process holds, and the machine's line
at the top of the table."""

from __future__ import annotations

import math
import platform
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata

from servelab.measure.gpus import NvmlReader
from servelab.service.cores import available_cores
from servelab.service.hardware import machine_info, nvidia_smi


@dataclass(frozen=True)
class Sighting:
    """What one source says about this machine's NVIDIA GPUs: their names, and what else it said."""

    source: str
    gpus: tuple[str, ...]
    said: str

    def __str__(self) -> str:
        return f"{self.source}: {', '.join(self.gpus) if self.gpus else 'no GPU'} ({self.said})"


@dataclass(frozen=True)
class NvidiaSmiGpu:
    name: str
    memory_mib: str
    driver: str


def nvidia_smi_gpus() -> list[NvidiaSmiGpu] | str:
    """The GPUs nvidia-smi lists, or what it said instead."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return "not on PATH"
    try:
        rows = nvidia_smi("name,memory.total,driver_version", binary)
    except RuntimeError as exc:  # nvidia-smi ran and failed: its own words
        return str(exc)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return [NvidiaSmiGpu(*row) for row in rows if len(row) == 3]


def look_for_gpus() -> list[Sighting]:
    """What nvidia-smi, NVML and PyTorch each see. PyTorch is asked last: importing it takes seconds."""
    listed = nvidia_smi_gpus()
    if isinstance(listed, str):
        sightings = [Sighting("nvidia-smi", (), listed)]
    else:
        drivers = sorted({gpu.driver for gpu in listed})
        sightings = [Sighting("nvidia-smi", tuple(gpu.name for gpu in listed), f"driver {', '.join(drivers) or '?'}")]
    try:
        reader = NvmlReader()
    except ImportError:
        sightings.append(Sighting("NVML", (), "nvidia-ml-py is not installed"))
    except Exception as exc:  # pynvml's NVMLError, or NvmlReader's own "lists no GPU"
        sightings.append(Sighting("NVML", (), f"{type(exc).__name__}: {exc}"))
    else:
        sightings.append(Sighting("NVML", tuple(gpu.name for gpu in reader.gpus), "nvidia-ml-py"))
        reader.close()
    try:
        import torch
    except ImportError:
        sightings.append(Sighting("PyTorch", (), "torch is not installed"))
        return sightings
    build = f"torch {torch.__version__}, built for CUDA {torch.version.cuda or 'none'}"
    if not torch.cuda.is_available():
        sightings.append(Sighting("PyTorch", (), f"{build}: torch.cuda.is_available() is False"))
    else:
        names = tuple(torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count()))
        sightings.append(Sighting("PyTorch", names, build))
    return sightings


def no_gpu_message(sightings: Sequence[Sighting]) -> str | None:
    """Why the check cannot run on a GPU here, or None when a source sees one."""
    if any(sighting.gpus for sighting in sightings):
        return None
    seen = "\n".join(f"  {sighting}" for sighting in sightings)
    return (
        f"No NVIDIA GPU here, so there is nothing on a GPU to check:\n{seen}\n"
        "Run it on a machine with an NVIDIA GPU, or run the same steps on the CPU: "
        "make test-gpu GPU_CHECK_ARGS='--device cpu'"
    )


def gpu_memory_by_pid() -> dict[int, float] | str:
    """MiB of GPU memory each process holds, as nvidia-smi lists them; or why they cannot be read."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return "no nvidia-smi"
    query = [binary, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
    try:
        listing = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi failed: {exc}"
    return parse_compute_apps(listing.stdout)


def parse_compute_apps(text: str) -> dict[int, float]:
    """nvidia-smi's `--query-compute-apps=pid,used_memory` (csv, no header, no units): MiB by pid,
    summed over the GPUs a process uses; a process whose memory it cannot read counts NaN."""
    memory: dict[int, float] = {}
    for line in text.splitlines():
        pid, _, used = (value.strip() for value in line.partition(","))
        if pid.isdigit():
            try:
                mib = float(used)
            except ValueError:  # "[N/A]" where the driver does not say (some virtualized GPUs)
                mib = math.nan
            memory[int(pid)] = memory.get(int(pid), 0.0) + mib
    return memory


def machine_line(gpus: list[NvidiaSmiGpu] | str, onnx_providers: Sequence[str]) -> str:
    """GPUs (name, memory, driver), cores, Python, and the runtimes' versions with their providers."""
    if isinstance(gpus, str):
        gpu_text = f"no GPU listed (nvidia-smi: {gpus})"
    else:
        drivers = ", ".join(sorted({gpu.driver for gpu in gpus}))
        gpu_text = ", ".join(f"{gpu.name} ({gpu.memory_mib} MiB)" for gpu in gpus) + f", driver {drivers}"
    versions = []
    for package in ("torch", "onnxruntime", "numpy", "fastapi", "uvicorn"):
        try:
            versions.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{package} not installed")
    versions[1] += f" ({', '.join(onnx_providers)})"
    cpu = machine_info()["cpu"]
    return (
        f"Machine: {gpu_text}; CPU {cpu}, {available_cores()} cores for this process; "
        f"Python {platform.python_version()}; {', '.join(versions)}"
    )
