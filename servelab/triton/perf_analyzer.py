"""Run NVIDIA's perf_analyzer (from the tritonclient 2.51.0 wheel) and read its CSV report.

Every run comes back as the lab's `RunResult`, with perf_analyzer's server-side breakdown
(queue, compute input, compute infer, compute output) in `server_breakdown`, and the exact command
line that measured it in `command`, so its numbers sit in the same tables and plots as the lab's
own load generator, and a student can run the same command by hand.

perf_analyzer needs libcudart.so.12 even without a GPU (from the nvidia-cuda-runtime-cu12 wheel,
put on LD_LIBRARY_PATH here) and libb64 (the Debian/Ubuntu package libb64-0d, which
`make setup` installs).
"""

from __future__ import annotations

import csv
import io
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from servelab.results import LatencySummary, RunResult

log = logging.getLogger(__name__)

# CSV column -> server_breakdown key; perf_analyzer reports these in microseconds.
SERVER_COLUMNS = {
    "Client Send": "client_send_us",
    "Network+Server Send/Recv": "network_server_send_recv_us",
    "Server Queue": "server_queue_us",
    "Server Compute Input": "server_compute_input_us",
    "Server Compute Infer": "server_compute_infer_us",
    "Server Compute Output": "server_compute_output_us",
    "Client Recv": "client_recv_us",
}


REPORT = "report.csv"  # the CSV report perf_analyzer writes (-f), in the folder it runs in


class PerfAnalyzerError(RuntimeError):
    """perf_analyzer could not run, or failed; the message carries the end of its output."""


class NoStableMeasurement(PerfAnalyzerError):
    """perf_analyzer ran, but gave no number it trusts at this load: its windows never agreed, or
    no request completed within one. Not a fault: longer windows, or another attempt, may settle."""

    def __init__(self, meaning: str, output: str) -> None:
        super().__init__(f"no stable measurement: {meaning}.\n{output}")
        self.meaning = meaning


# perf_analyzer's ways of saying "no trustworthy number at this load", and what each means.
UNSTABLE_MESSAGES = {
    "Failed to obtain stable measurement": "the windows never agreed within the stability percentage",
    "No valid requests recorded": "no request completed within a measurement window",
}


def binary() -> Path:
    candidate = Path(sys.executable).parent / "perf_analyzer"
    found = candidate if candidate.is_file() else shutil.which("perf_analyzer")
    if not found:
        raise PerfAnalyzerError(
            "perf_analyzer is not installed; run `make setup` (it comes with tritonclient[all]==2.51.0)."
        )
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
    results: list[RunResult] = field(default_factory=list)  # the rows as the lab's record type


def run(
    url: str,
    model: str,
    concurrency: int | None = 1,
    request_rate: float | None = None,
    request_distribution: str = "constant",
    batch_size: int = 1,
    shape: list[str] | None = None,
    input_data: str | Path | None = None,
    protocol: str = "http",
    request_count: int = 50,
    measurement_interval_ms: int | None = None,
    max_trials: int = 10,
    stability_percentage: float = 10,
    extra_args: list[str] | None = None,
    timeout_s: float = 300,
    sequence_length: int | None = None,
    sequence_length_variation: float | None = None,
    sequence_id_range: tuple[int, int | None] | None = None,
    num_of_sequences: int | None = None,
    serial_sequences: bool = False,
) -> PerfAnalyzerRun:
    """One perf_analyzer measurement at a fixed concurrency, or at a fixed request rate.

    Measurement windows are `request_count` requests each (count_windows), or
    `measurement_interval_ms` long when that is given (time_windows). perf_analyzer repeats
    windows, up to `max_trials`, until three in a row agree within `stability_percentage`, and
    reports the last three. Poisson arrivals in short windows rarely agree within the default 10%:
    give them longer windows or a larger percentage.

    A stateful model (sequence batching) gets sequences, which perf_analyzer finds in the model's
    config; these options shape them. `sequence_length` frames each (perf_analyzer's default 20),
    varied by +/- `sequence_length_variation` percent (default 20; 0 for every sequence alike);
    correlation IDs from `sequence_id_range` (start, end excluded; end None: unbounded). At a
    concurrency, each request in flight belongs to its own sequence, so `concurrency` is the number
    of live sequences; at a request rate, `num_of_sequences` are live (default 4), and
    `serial_sequences` keeps each to one request in flight.
    """
    if (concurrency is None) == (request_rate is None):
        raise ValueError("give exactly one of concurrency or request_rate")
    if request_rate is None and (num_of_sequences is not None or serial_sequences):
        raise ValueError(
            "perf_analyzer honours num_of_sequences and serial_sequences only at a request rate (request_rate=...); "
            "at a concurrency, each request in flight is its own sequence: concurrency is the number of live sequences"
        )
    sequence_options = _sequence_options(
        sequence_length, sequence_length_variation, sequence_id_range, num_of_sequences, serial_sequences
    )
    command = [str(binary()), "-u", url, "-i", protocol, "-m", model, "-b", str(batch_size), "-f", REPORT]
    if concurrency is not None:
        command += ["--concurrency-range", str(concurrency)]
    else:
        command += ["--request-rate-range", f"{request_rate:g}", "--request-distribution", request_distribution]
    if measurement_interval_ms is not None:
        command += ["--measurement-mode", "time_windows", "-p", str(measurement_interval_ms)]
    else:
        command += ["--measurement-mode", "count_windows", "--measurement-request-count", str(request_count)]
    command += ["--max-trials", str(max_trials), "--stability-percentage", f"{stability_percentage:g}"]
    for item in shape or []:
        command += ["--shape", item]
    if input_data:  # a file or folder of data, by its absolute path; or "zero", "random"
        data = Path(input_data)
        command += ["--input-data", str(data.resolve()) if data.exists() else str(input_data)]
    command += sequence_options + (extra_args or [])
    stdout, rows = execute(command, timeout_s)
    name = f"triton/{model} ({protocol})"
    results = [
        to_run_result(row, name, batch_size, request_rate, request_distribution, stdout, command) for row in rows
    ]
    return PerfAnalyzerRun(command, rows, stdout, results)


def execute(command: list[str], timeout_s: float) -> tuple[str, list[dict[str, float]]]:
    """Run a perf_analyzer `command` that writes its report to REPORT, in a folder of its own (so
    that the command, kept in each result, names no folder that is gone: run again anywhere, it
    works the same); its output and its report's rows. A failure raises with the end of its output."""
    with tempfile.TemporaryDirectory() as tmp:
        log.info("running %s", shlex.join(command))
        completed = subprocess.run(
            command, cwd=tmp, env=environment(), capture_output=True, text=True, timeout=timeout_s
        )
        if completed.returncode != 0:
            output = (
                f"perf_analyzer exited with {completed.returncode}:\n"
                f"{completed.stdout[-2000:]}\n{completed.stderr[-2000:]}"
            )
            for message, meaning in UNSTABLE_MESSAGES.items():
                if message in completed.stdout + completed.stderr:
                    raise NoStableMeasurement(meaning, output)
            raise PerfAnalyzerError(output)
        return completed.stdout, parse_csv((Path(tmp) / REPORT).read_text())


def _sequence_options(
    length: int | None,
    length_variation: float | None,
    id_range: tuple[int, int | None] | None,
    num_of_sequences: int | None,
    serial: bool,
) -> list[str]:
    options = []
    if length is not None:
        if length < 1:
            raise ValueError("sequence_length must be at least 1")
        options += ["--sequence-length", str(length)]
    if length_variation is not None:
        if not 0 <= length_variation <= 100:
            raise ValueError("sequence_length_variation is a percentage, 0 to 100")
        options += ["--sequence-length-variation", f"{length_variation:g}"]
    if id_range is not None:
        start, end = id_range
        if start < 1 or (end is not None and end <= start):
            raise ValueError("sequence_id_range is (start, end) with 1 <= start < end, or (start, None)")
        options += ["--sequence-id-range", f"{start}" if end is None else f"{start}:{end}"]
    if num_of_sequences is not None:
        if num_of_sequences < 1:
            raise ValueError("num_of_sequences must be at least 1")
        options += ["--num-of-sequences", str(num_of_sequences)]
    return options + (["--serial-sequences"] if serial else [])


def parse_csv(text: str) -> list[dict[str, float]]:
    """perf_analyzer's -f report: one row per measured load level, latencies in microseconds, in
    the order of the load levels. perf_analyzer writes them by throughput, which puts c=2 before
    c=1 wherever c=2 served less (a busy machine)."""
    rows = [{key: float(value) for key, value in row.items()} for row in csv.DictReader(io.StringIO(text))]
    return sorted(rows, key=lambda row: row.get("Concurrency", row.get("Request Rate", 0.0)))


def _request_count(stdout: str) -> int:
    """The client request count of the reported windows, from perf_analyzer's console summary."""
    match = re.search(r"Request count: (\d+)", stdout)
    return int(match.group(1)) if match else 0


def _mean_latency_us(row: dict[str, float], stdout: str) -> float:
    """The CSV has no mean latency in request-rate mode; the console summary always does."""
    if "Avg latency" in row:
        return row["Avg latency"]
    match = re.search(r"Avg latency: (\d+) usec", stdout)
    return float(match.group(1)) if match else float("nan")


def _latency_std_us(stdout: str) -> float:
    """The console summary's "Avg latency: N usec (standard deviation M usec)"."""
    match = re.search(r"Avg latency: \d+ usec \(standard deviation (\d+) usec\)", stdout)
    return float(match.group(1)) if match else float("nan")


def to_run_result(
    row: dict[str, float],
    name: str,
    batch_size: int = 1,
    request_rate: float | None = None,
    request_distribution: str = "constant",
    stdout: str = "",
    command: list[str] | None = None,
) -> RunResult:
    """One CSV row as a RunResult, with the `command` that measured it. perf_analyzer reports no
    maximum latency, so max_ms is its p99."""
    ms = 1 / 1000
    latency = LatencySummary(
        mean_ms=_mean_latency_us(row, stdout) * ms,
        p50_ms=row["p50 latency"] * ms,
        p90_ms=row["p90 latency"] * ms,
        p95_ms=row["p95 latency"] * ms,
        p99_ms=row["p99 latency"] * ms,
        max_ms=row["p99 latency"] * ms,
        std_ms=_latency_std_us(stdout) * ms,
    )
    open_loop = request_rate is not None
    throughput_rps = row["Inferences/Second"] / batch_size  # requests/s; each request carries batch_size images
    return RunResult(
        name=name,
        tool="perf_analyzer",
        mode="open" if open_loop else "closed",
        requests=_request_count(stdout),
        throughput_rps=throughput_rps,
        latency=latency,
        wall_s=_request_count(stdout) / throughput_rps if throughput_rps else 0.0,
        concurrency=None if open_loop else int(row["Concurrency"]),
        rate_rps=request_rate,
        arrival=request_distribution if open_loop else None,
        batch_size=batch_size,
        server_breakdown={key: row[column] for column, key in SERVER_COLUMNS.items() if column in row},
        command=command,
        notes=[
            "perf_analyzer reports p99, not the maximum: max_ms is p99_ms",
            f"throughput is requests/s; images/s = {row['Inferences/Second']:.1f}",
        ],
    )
