"""A lone client, before and after a load: each FastAPI service against the in-process loop, in one run.

For each FastAPI service, before any other load point of the benchmark reaches it: one client for a
window (`fresh`), then GOAL_CONCURRENCY clients for a window (`load`), then one client again at once
(`after`), then the in-process loop (`loop`: decode then infer, one image at a time, on one thread with
one intra-op thread, as the services' slots run it) measured at once, beside it. The goal: the lone
client served at LONE_GOAL of the loop or more, fresh and after the load. A service whose lone request
slows once a load has passed fails it: seen with PyTorch's teams of threads, one per inference thread,
when a team's threads still spinning after its inference took a core from the next inference, on another
thread.
"""

from __future__ import annotations

from typing import Any

from servelab import loadgen
from servelab.bench.goals import floored
from servelab.bench.gpu_check.report import GOAL_CONCURRENCY
from servelab.measure import inprocess
from servelab.profiles import Profile
from servelab.report.tables import markdown_table
from servelab.results import RunResult

LONE_GOAL = 0.8
PHASES = ("fresh", "load", "after", "loop")
# The in-process loop: decode then infer, one image at a time, on one thread with one intra-op thread.
LOOP = inprocess.Point(1, 1, pipelined=False)


def figures(run: RunResult) -> dict[str, float]:
    return {"rps": run.throughput_rps, "p50_ms": run.latency.p50_ms, "concurrency": run.concurrency or 1}


def measure(url: str, runtime: str, profile: Profile, image: bytes) -> dict[str, dict[str, float]]:
    """The four phases' figures for the FastAPI service at `url` (fresh: nothing has loaded it yet), the
    loop of its runtime (`runtime`: "pytorch", "onnxruntime") measured right after them."""
    window_s = profile.duration_s / profile.windows
    endpoint = loadgen.Endpoint("fastapi", url, image_bytes=image)

    def clients(concurrency: int, warmup_s: float) -> RunResult:
        load = loadgen.Load(concurrency, duration_s=window_s, warmup_s=warmup_s)
        return loadgen.closed_loop(endpoint, load, progress=False)

    # The loop's process starts first (its model loads meanwhile), and waits while the service is measured.
    with inprocess.PointProcess(runtime, LOOP) as loop_process:
        fresh = clients(1, profile.warmup_s)  # the warm-up a fresh service needs: its first requests
        load = clients(GOAL_CONCURRENCY, 0.0)
        after = clients(1, 0.0)  # at once: the slowdown was seen right after a load, and 5 s later
        loop = loop_process.measure(window_s, min(1.0, profile.warmup_s))
    return {phase: figures(run) for phase, run in zip(PHASES, (fresh, load, after, loop), strict=True)}


def lone_lines(measured: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    """The goal, for each service measured: met where its lone client, fresh and after the load, reached
    LONE_GOAL of the loop; with every figure."""
    lines = []
    for service, phase in measured.items():
        loop = phase["loop"]["rps"]
        fresh, after = phase["fresh"]["rps"] / loop, phase["after"]["rps"] / loop
        verdict = "met" if min(fresh, after) >= LONE_GOAL else "NOT MET"
        lines.append(
            f"- {verdict}: {service} serves a lone client at {floored(after)} of the in-process loop right after "
            f"{phase['load']['concurrency']:.0f} clients, {floored(fresh)} before them (goal {LONE_GOAL:.0%} both): "
            f"{phase['after']['rps']:.1f} and {phase['fresh']['rps']:.1f} req/s (p50 {phase['after']['p50_ms']:.1f} "
            f"and {phase['fresh']['p50_ms']:.1f} ms), the loop {loop:.1f} req/s (p50 {phase['loop']['p50_ms']:.1f} "
            f"ms), measured at once after them"
        )
    return lines


def lone_table(measured: dict[str, Any]) -> list[str]:
    rows = [
        [
            service,
            *(f"{phase[name]['rps']:.1f}" for name in ("fresh", "load", "after", "loop")),
            floored(phase["after"]["rps"] / phase["loop"]["rps"]),
        ]
        for service, phase in measured.items()
    ]
    headings = ["service", "fresh, 1 client", f"{GOAL_CONCURRENCY} clients", "1 client after", "in-process loop"]
    return markdown_table([*headings, "after / loop"], rows, right=range(1, 6)).splitlines() if rows else []
