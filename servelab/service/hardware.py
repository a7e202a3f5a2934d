"""What a server's container has, as its start finds it: the GPUs it sees, the cores it may use and,
for Triton, the backends its server ships; the lab's one reader of nvidia-smi (`nvidia_smi`), and
the machine in words (`machine_info`).

The start of the Triton and Ray Serve containers writes this record to a volume the Jupyter
container shares, so that the notebooks adapt a config to the hardware of the server that runs it
(servelab.lab.facade), not to the hardware of the container they run in. Locally the servers run on this
machine, with no GPU (servelab.triton.server.LOCAL_TRITON).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from servelab.service.cores import available_cores


@dataclass(frozen=True)
class Hardware:
    gpus: int
    cores: int
    backends: tuple[str, ...] = field(default=())  # a Triton server's backends; empty elsewhere

    @classmethod
    def here(cls, backends: tuple[str, ...] = ()) -> Hardware:
        return cls(visible_gpus(), available_cores(), tuple(sorted(backends)))

    def describe(self) -> str:
        gpus = f"{self.gpus} GPU(s)" if self.gpus else "no GPU"
        return f"{gpus}, {self.cores} CPU core(s)" + (f", backends {', '.join(self.backends)}" if self.backends else "")

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)) + "\n")

    @classmethod
    def read(cls, path: Path) -> Hardware:
        record = json.loads(path.read_text())
        return cls(int(record["gpus"]), int(record["cores"]), tuple(record.get("backends", ())))


def nvidia_smi(query: str, binary: str = "nvidia-smi", timeout_s: float = 30) -> list[list[str]]:
    """Each GPU's fields of `query` (`nvidia-smi --query-gpu=QUERY`, without units); RuntimeError
    with what nvidia-smi said where it fails, OSError where there is none."""
    done = subprocess.run(
        [binary, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if done.returncode != 0:
        raise RuntimeError(f"nvidia-smi failed: {(done.stderr or done.stdout).strip()}")
    asked, rows = query.split(","), []
    for line in done.stdout.strip().splitlines():
        fields = [value.strip() for value in line.split(",")]
        if "name" in asked:  # the only field that could hold a comma: rejoin whatever it was split into
            at, extra = asked.index("name"), len(fields) - len(asked)
            fields[at : at + extra + 1] = [",".join(fields[at : at + extra + 1])]
        rows.append(fields)
    return rows


def visible_gpus() -> int:
    """The NVIDIA GPUs this container sees (none without the NVIDIA runtime, or without a GPU, or
    with CUDA_VISIBLE_DEVICES set empty, which hides them from every CUDA program)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return 0
    try:
        return len(nvidia_smi("index"))
    except (OSError, RuntimeError, subprocess.SubprocessError):
        return 0


def machine_info() -> dict:
    """CPU model, core count, GPUs (name and memory, from nvidia-smi, when there is one) and platform."""
    cpu_model = platform.processor() or "unknown"
    try:
        cpu_model = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    try:
        gpus = [f"{name}, {memory} MiB" for name, memory in nvidia_smi("name,memory.total", timeout_s=10)]
    except (OSError, RuntimeError, subprocess.SubprocessError):
        gpus = []
    return {"cpu": cpu_model, "cores": os.cpu_count(), "gpus": gpus or ["none"], "platform": platform.platform()}
