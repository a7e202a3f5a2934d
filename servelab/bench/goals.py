"""The headline benchmark's goals: each served setup's throughput against the ceiling measured in
the same run (`ceiling_of`, `window_fractions`, `machine_speed`), and the Goals section of its
report (`goal_lines`), each line met, NOT MET, NOT JUDGED (saying why) or reported beside them.

A throughput goal is judged at GOAL_CONCURRENCY alone, the GPU check's (servelab.bench.gpu_check.
report): with more clients than a service has processes, workers that share one listening socket
get their share of connections, as they would from real clients. The other loads are reported
with the same figures, never judged; so is a point whose load generator was saturated (at the GPU
check's SATURATED_PERCENT of a core or more), since the load may then have set the pace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servelab.bench import setups
from servelab.bench.gpu_check.report import GOAL_CONCURRENCY, client_text
from servelab.loadgen.processes import SATURATED_PERCENT
from servelab.report import tables
from servelab.results import RunResult

AGREEMENT_LIMITS = {"throughput": 0.10, "p50": 0.15}


@dataclass(frozen=True)
class Goal:
    """A goal judged at GOAL_CONCURRENCY: `service` reaches `fraction` of its ceiling, or, `of_cap`,
    of its cap: the share of the ceiling its CPU split leaves it (overhead_cap), judged only where
    every core was busy, since only then does the cap bind."""

    service: str
    fraction: float
    of_cap: bool = False


# A FastAPI service pays for HTTP, its event loop and the load generator, which the in-process
# ceiling never pays: on busy cores, that caps it below the ceiling, so it is judged against its
# cap. Triton's front end has no event loop of ours to count (no CPU split): judged on the ceiling.
GOALS = (
    Goal("fastapi_pt", 0.95, of_cap=True),
    Goal("fastapi_onnx", 0.95, of_cap=True),
    Goal("triton/food_classifier", 0.8),
)

# A load point kept every core busy when the server and the load generator used at least this
# share of the cores' time over its windows (CpuSplit.cores_busy); below it, cores idled (or ran
# other processes), and the CPU the event loop and the load generator took need not have been
# taken from decoding and inference.
EVERY_CORE_BUSY = 0.9

SATURATED = (
    f"NOT JUDGED (the client was saturated, the load generator at {SATURATED_PERCENT:.0f}% of a core or more, so "
    "it, not the service, may have set the pace)"
)


def _served(result: RunResult) -> setups.ServedSetup | None:
    named = {setup.name: setup for setup in setups.SETUPS}
    named |= {name: setups.ServedSetup(name, "fastapi", None, runtime) for runtime, name in setups.NAIVE.items()}
    return named.get(result.name)


def ceiling_of(result: RunResult, ceilings: dict[str, dict[str, float]]) -> float | None:
    """The ceiling a served run is judged against, measured between its windows: one request in
    flight at concurrency 1, the best plan for many otherwise."""
    if _served(result) is None:
        return None
    return ceilings[result.name][str(result.concurrency)]


def window_fractions(point: dict[str, list[float]]) -> list[float]:
    """Each measured window of a load point (`served_rps`) as a fraction of the mean of the two
    ceiling windows beside it (`ceiling_rps`, one more than the windows): the spread says how
    far the machine moved during the point."""
    ceiling = point["ceiling_rps"]
    if len(ceiling) != len(point["served_rps"]) + 1:
        raise ValueError("a load point has one ceiling window more than its measured windows")
    return [served / ((ceiling[i] + ceiling[i + 1]) / 2) for i, served in enumerate(point["served_rps"])]


def machine_speed(result: RunResult, meta: dict) -> float:
    """How fast the machine was around `result`'s run, relative to the sweep at the start: its
    ceiling measured between its windows over the same ceiling in the sweep. Two runs made at
    different moments compare fairly once each throughput is divided by its speed and each
    latency multiplied by it (a slower machine makes every request slower, whoever serves it)."""
    served = _served(result)
    if served is None:
        raise ValueError(f"{result.name} is not a setup of the benchmark: it has no ceiling")
    key = setups.ceiling_key(served.runtime, served.decode, "one" if result.concurrency == 1 else "many")
    return ceiling_of(result, meta["ceilings_rps"]) / meta["sweep_best_rps"][key]


def _saturated(result: RunResult) -> bool:
    return bool((result.client or {}).get("saturated"))


def floored(share: float) -> str:
    """A share as a percentage with one decimal, rounded down: a ratio just under its goal never
    reads as the goal itself."""
    return f"{math.floor(round(share * 1000, 6)) / 10:.1f}%"


def overhead_cap(point: dict, meta: dict) -> str:
    """What a load point's CpuSplit (`point["cpu_s"]`) says about its ratio, in words; empty without one."""
    if "cpu_s" not in point:
        return ""
    cpu, cores = setups.CpuSplit(**point["cpu_s"]), meta["machine"]["cores_available"]
    return (
        f"; the event loop and the load generator took {cpu.overhead_share():.1%} of the CPU its requests "
        f"cost, which caps it at {1 - cpu.overhead_share():.1%} of the ceiling while every core is busy "
        f"(they were {floored(cpu.cores_busy(cores))} busy)"
    )


def _window_spread(point: dict) -> str:
    if len(point.get("served_rps", [])) < 2:
        return ""
    shares = ", ".join(f"{share:.0%}" for share in window_fractions(point))
    return f"; window by window, against the ceiling beside each: {shares}"


def load_said(result: RunResult) -> str:
    """What a goal's line says of its load: the load generator's CPU and, where the service runs
    several processes, how the point's connections and requests spread over them."""
    said = f"; the load: {client_text(result)}"
    spread = tables.process_spread(result)
    if spread:
        said += (
            f"; {tables.BY_PROCESS}, each process's own count over the windows, warm-ups included (one listening "
            f"socket hands each new connection to one process, and a kept-alive connection stays there): {spread}"
        )
    return said


def against_ceiling(goal: Goal, result: RunResult, ceiling: float) -> tuple[str, str]:
    """A goal on the ratio to the ceiling: (met or NOT MET, its numbers)."""
    fraction = result.throughput_rps / ceiling
    return "met" if fraction >= goal.fraction else "NOT MET", (
        f"{goal.service} at c={result.concurrency} reaches {floored(fraction)} of its ceiling (goal "
        f"{goal.fraction:.0%} at c={GOAL_CONCURRENCY}): {result.throughput_rps:.1f} of {ceiling:.1f} req/s"
    )


def against_cap(goal: Goal, result: RunResult, ceiling: float, point: dict, meta: dict) -> tuple[str, str]:
    """A goal on the ratio to the cap (the ceiling times 1 - the CPU split's overhead share): met or
    NOT MET where every core was busy; NOT JUDGED, saying why, where they were not or where no CPU
    split was measured. With its numbers."""
    where = f"{goal.service} at c={result.concurrency}"
    of_ceiling = (
        f"it reaches {result.throughput_rps / ceiling:.1%} of its ceiling ({result.throughput_rps:.1f} of "
        f"{ceiling:.1f} req/s)"
    )
    if "cpu_s" not in point:
        return "NOT JUDGED", (
            f"{where}: this run measured no CPU split (it did not know the server's process id), so there is no "
            f"cap to judge it against; {of_ceiling}"
        )
    cpu = setups.CpuSplit(**point["cpu_s"])
    if cpu.cores_busy(meta["machine"]["cores_available"]) < EVERY_CORE_BUSY:
        return "NOT JUDGED", (
            f"{where}: not every core was busy (under {EVERY_CORE_BUSY:.0%}), and the cap binds only on busy cores"
            + overhead_cap(point, meta)
            + f"; {of_ceiling}"
        )
    cap = 1 - cpu.overhead_share()
    of_cap = result.throughput_rps / (cap * ceiling)
    return "met" if of_cap >= goal.fraction else "NOT MET", (
        f"{where} reaches {floored(of_cap)} of its cap (goal {goal.fraction:.0%} at c={GOAL_CONCURRENCY}): "
        f"{result.throughput_rps:.1f} of {cap * ceiling:.1f} req/s" + overhead_cap(point, meta) + f"; {of_ceiling}"
    )


def throughput_lines(goal: Goal, results: list[RunResult], meta: dict) -> list[str]:
    """`goal` at every load its service was measured at: judged at GOAL_CONCURRENCY (unless the
    load generator was saturated there), reported at the others."""
    runs = [r for r in results if r.name == goal.service and r.tool == "loadgen"]  # in the profile's order
    lines = []
    for result in runs:
        if not result.clean:
            lines.append(f"- NOT JUDGED: {goal.service} at c={result.concurrency}: {'; '.join(result.interrupted_by)}")
            continue
        point = meta.get("windows_rps", {}).get(goal.service, {}).get(str(result.concurrency)) or {}
        ceiling = ceiling_of(result, meta["ceilings_rps"])
        assert ceiling is not None, f"{goal.service} is a setup of the benchmark, with a ceiling"
        verdict, figures = (
            against_cap(goal, result, ceiling, point, meta) if goal.of_cap else against_ceiling(goal, result, ceiling)
        )
        if result.concurrency != GOAL_CONCURRENCY:
            verdict = "reported, not judged"
        elif _saturated(result):
            verdict = SATURATED
        lines.append(f"- {verdict}: {figures}{_window_spread(point)}{load_said(result)}")
    if not any(run.concurrency == GOAL_CONCURRENCY for run in runs):
        lines.append(f"- NOT MEASURED: {goal.service} at c={GOAL_CONCURRENCY}")
    return lines


def goal_lines(results: list[RunResult], meta: dict) -> list[str]:
    """Each goal, met or not (or not judged, saying why), with the numbers that decide it (and
    the spread of a ratio's windows, which does not decide it)."""
    lines = [line for goal in GOALS for line in throughput_lines(goal, results, meta)]
    busiest = max(r.concurrency or 0 for r in results if r.tool == "loadgen")
    at_busiest = {r.name: r for r in results if r.tool == "loadgen" and r.concurrency == busiest}
    for setup in setups.SETUPS:
        ours, naive = at_busiest.get(setup.name), at_busiest.get(setups.NAIVE[setup.runtime])
        if ours is None or naive is None:
            lines.append(f"- NOT MEASURED: {setup.name} against {setups.NAIVE[setup.runtime]} at c={busiest}")
            continue
        # Measured minutes apart: compared at one machine speed, the sweep's.
        speed = {run.name: machine_speed(run, meta) for run in (ours, naive)}
        rps = {run.name: run.throughput_rps / speed[run.name] for run in (ours, naive)}
        p99 = {run.name: run.latency.p99_ms * speed[run.name] for run in (ours, naive)}
        faster, shorter_tail = rps[ours.name] >= rps[naive.name], p99[ours.name] < p99[naive.name]
        verdict = "met" if faster and shorter_tail else "NOT MET"
        if _saturated(ours) or _saturated(naive):
            verdict = SATURATED
        lines.append(
            f"- {verdict}: {setup.name} at c={busiest} is at least as fast "
            f"as {naive.name} ({rps[ours.name]:.1f} vs {rps[naive.name]:.1f} req/s: "
            f"{'yes' if faster else 'no'}) with a lower p99 ({p99[ours.name]:.0f} vs "
            f"{p99[naive.name]:.0f} ms: {'yes' if shorter_tail else 'no'}), at the sweep's machine speed; as "
            f"measured, with the machine at {speed[ours.name]:.0%} and {speed[naive.name]:.0%} of that speed: "
            f"{ours.throughput_rps:.1f} vs {naive.throughput_rps:.1f} req/s, p99 {ours.latency.p99_ms:.0f} vs "
            f"{naive.latency.p99_ms:.0f} ms; the load: {client_text(ours)}, then {client_text(naive)}"
        )
    for measure, limit in AGREEMENT_LIMITS.items():
        gap = meta["agreement"][f"{measure}_gap"]
        lines.append(
            f"- {'met' if gap <= limit else 'NOT MET'}: the load generator and perf_analyzer agree on {measure} "
            f"within {limit:.0%} (the median pair differs by {gap:.1%})"
        )
    return lines
