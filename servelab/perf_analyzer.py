"""Run NVIDIA's perf_analyzer (from the tritonclient 2.51.0 wheel) and read its CSV report.

perf_analyzer needs libcudart.so.12 even without a GPU (from the nvidia-cuda-runtime-cu12 wheel,
put on LD_LIBRARY_PATH here) and libb64 (the Debian/Ubuntu package libb64-0d, which
`make setup` installs).
"""

from __future__ import annotations

import csv
import io
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)


class PerfAnalyzerError(RuntimeError):
    pass


def binary() -> Path:
    candidate = Path(sys.executable).parent / "perf_analyzer"
    found = candidate if candidate.is_file() else shutil.which("perf_analyzer")
    if not found:
        raise PerfAnalyzerError("perf_analyzer is not installed; run `make setup` (it comes with tritonclient[all]==2.51.0).")
    return Path(found)


def environment() -> dict[str, str]:
    import nvidia.cuda_runtime

    cudart_dir = Path(nvidia.cuda_runtime.__path__[0]) / "lib"
    existing = os.environ.get("LD_LIBRARY_PATH", "")
    return {**os.environ, "LD_LIBRARY_PATH": f"{cudart_dir}:{existing}" if existing else str(cudart_dir)}


@dataclass
class PerfAnalyzerRun:
    command: list[str]
    rows: list[dict[str, float]] = field(default_factory=list)  # one per concurrency or rate
    stdout: str = ""


def run(
    url: str,
    model: str,
    concurrency: int = 1,
    batch_size: int = 1,
    shape: list[str] | None = None,
    input_data: str | None = None,
    protocol: str = "http",
    request_count: int = 50,
    extra_args: list[str] | None = None,
    timeout_s: float = 300,
) -> PerfAnalyzerRun:
    """One perf_analyzer measurement at a fixed concurrency, in count windows of `request_count`."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.csv"
        command = [
            str(binary()), "-u", url, "-i", protocol, "-m", model, "-b", str(batch_size),
            "--concurrency-range", str(concurrency),
            "--measurement-mode", "count_windows", "--measurement-request-count", str(request_count),
            "-f", str(report),
        ]
        for item in shape or []:
            command += ["--shape", item]
        if input_data:
            command += ["--input-data", input_data]
        command += extra_args or []
        log.info("running %s", " ".join(command))
        completed = subprocess.run(command, env=environment(), capture_output=True, text=True, timeout=timeout_s)
        if completed.returncode != 0:
            raise PerfAnalyzerError(
                f"perf_analyzer exited with {completed.returncode}:\n{completed.stdout[-2000:]}\n{completed.stderr[-2000:]}"
            )
        return PerfAnalyzerRun(command, parse_csv(report.read_text()), completed.stdout)


def parse_csv(text: str) -> list[dict[str, float]]:
    """perf_analyzer's -f report: one row per measured load level, latencies in microseconds."""
    return [{key: float(value) for key, value in row.items()} for row in csv.DictReader(io.StringIO(text))]
