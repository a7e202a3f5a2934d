"""What a server's container has, as its start finds it: the GPUs it sees, the cores it may use and,
for Triton, the backends its server ships.

The start of the Triton and Ray Serve containers writes this record to a volume the Jupyter
container shares, so that the notebooks adapt a config to the hardware of the server that runs it
(servelab.lab.facade), not to the hardware of the container they run in. Locally the servers run on this
machine, with no GPU (servelab.triton.server.LOCAL_TRITON).
"""

from __future__ import annotations

import json
import os
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


def visible_gpus() -> int:
    """The NVIDIA GPUs this container sees (none without the NVIDIA runtime, or without a GPU, or
    with CUDA_VISIBLE_DEVICES set empty, which hides them from every CUDA program)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return 0
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))
