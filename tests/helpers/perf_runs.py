"""A perf_analyzer run as the lab reads one, with the server's breakdown, for the tests of the
notebooks' helpers (their checks, tables and retries)."""

from __future__ import annotations

from servelab.results import LatencySummary, RunResult


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
