"""A perf_analyzer run as the lab reads one, with the server's breakdown, for the tests of the
notebooks' helpers (their checks, tables and retries); and perf_analyzer run against the real
Triton until it settles, for the tests of perf_analyzer itself."""

from __future__ import annotations

from servelab import retries
from servelab.results import LatencySummary, RunResult
from servelab.triton import perf_analyzer


def perf_result(queue_us: float = 2000.0, infer_us: float = 5000.0, requests: int = 40) -> RunResult:
    return RunResult(
        name="triton/toy (http)",
        tool="perf_analyzer",
        mode="closed",
        requests=requests,
        throughput_rps=42.0,
        latency=LatencySummary(8.0, 7.5, 9.0, 9.5, 9.9, 9.9),
        wall_s=0.25,
        concurrency=2,
        server_breakdown={"server_queue_us": queue_us, "server_compute_infer_us": infer_us},
    )


def run_stable(url: str, model: str, attempts: int = 2, **options) -> perf_analyzer.PerfAnalyzerRun:
    """`perf_analyzer.run`, tried again while it finds no stable measurement: on a busy machine its
    windows can disagree for a while. Each new try is logged as a retry (servelab.retries)."""
    for attempt in range(1, attempts):
        try:
            return perf_analyzer.run(url, model, **options)
        except perf_analyzer.NoStableMeasurement as unstable:
            retries.note(f"perf_analyzer against {model} (attempt {attempt + 1} of {attempts})", unstable.meaning)
    return perf_analyzer.run(url, model, **options)
