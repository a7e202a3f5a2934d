"""The CPU of named processes over a block (`ProcessCpu`), and the processes of a Triton
Python-backend model's instances to name (`triton_instance_processes`).
"""

from __future__ import annotations

import time
from pathlib import Path

import psutil


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
