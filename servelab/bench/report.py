"""The headline benchmark's report: report.md and its plots, from one run's results.

Every ratio is taken against a ceiling measured in the same run on the same machine, in windows
that take turns with the row's own measured windows (the mean of the ceiling's windows): a row
at concurrency 1 against the in-process ceiling for one request in flight, a row at higher
concurrency against the best in-process plan for many. The goals the lab sets itself are
checked against this run's numbers and listed as met or not met, with the numbers, or as not
judged, saying why (a FastAPI service is judged against the cap its CPU split sets, and only where
every core was busy): the report says what happened, it does not fail.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from servelab.bench import setups
from servelab.report import plots, tables
from servelab.results import RunResult

AGREEMENT_LIMITS = {"throughput": 0.10, "p50": 0.15}


@dataclass(frozen=True)
class Goal:
    """A goal the benchmark is judged on: `service` at `loads` reaches `fraction` of its ceiling,
    or, `of_cap`, of its cap: the share of the ceiling its CPU split leaves it (overhead_cap),
    judged only where every core was busy, since only then does the cap bind."""

    service: str
    fraction: float
    loads: tuple[int, ...]  # the concurrencies it is judged at
    of_cap: bool = False


# A FastAPI service pays for HTTP, its event loop and the load generator, which the in-process
# ceiling never pays: on busy cores, that caps it below the ceiling, so it is judged against its
# cap. Triton's front end has no event loop of ours to count (no CPU split): judged on the ceiling.
GOALS = (
    Goal("fastapi_pt", 0.95, (1, 8, 16), of_cap=True),
    Goal("fastapi_onnx", 0.95, (1, 8, 16), of_cap=True),
    Goal("triton/food_classifier", 0.8, (1, 8, 16)),
)

# A load point kept every core busy when the server and the load generator used at least this
# share of the cores' time over its windows (CpuSplit.cores_busy); below it, cores idled (or ran
# other processes), and the CPU the event loop and the load generator took need not have been
# taken from decoding and inference.
EVERY_CORE_BUSY = 0.9


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


def _find(results: list[RunResult], name: str, concurrency: int) -> RunResult | None:
    return next((r for r in results if r.name == name and r.concurrency == concurrency), None)


def pair_ratios(agreement: dict) -> str:
    """Each measure's ratios, pair by pair, in words."""
    return "; ".join(
        f"{measure} {', '.join(f'{ratio:.2f}' for ratio in ratios)}"
        for measure, ratios in agreement["pair_ratios"].items()
    )


def _floored(share: float) -> str:
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
        f"(they were {_floored(cpu.cores_busy(cores))} busy)"
    )


def cpu_table(meta: dict) -> list[str]:
    """Where the CPU went in every load point measured with its server's process id."""
    cores = meta["machine"]["cores_available"]
    rows = [
        (name, load, setups.CpuSplit(**point["cpu_s"]))
        for name, by_load in meta.get("windows_rps", {}).items()
        for load, point in by_load.items()
        if "cpu_s" in point
    ]
    if not rows:
        return ["No server's process id was known to this run (services measured elsewhere): not measured."]
    lines = [
        "| service | load | event loop, of the server's CPU | load generator, of all | cap | of ceiling | cores busy |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, load, cpu in rows:
        fraction = statistics.mean(window_fractions(meta["windows_rps"][name][load]))
        lines.append(
            f"| {name} | c={load} | {cpu.event_loop_s / cpu.server_s:.1%} "
            f"| {cpu.load_generator_s / (cpu.server_s + cpu.load_generator_s):.1%} | {1 - cpu.overhead_share():.1%} "
            f"| {fraction:.1%} | {_floored(cpu.cores_busy(cores))} |"
        )
    return lines


def _window_spread(point: dict) -> str:
    if len(point.get("served_rps", [])) < 2:
        return ""
    shares = ", ".join(f"{share:.0%}" for share in window_fractions(point))
    return f"; window by window, against the ceiling beside each: {shares}"


def against_ceiling(goal: Goal, result: RunResult, ceiling: float, point: dict) -> str:
    """A goal on the ratio to the ceiling, met or not, with its numbers."""
    fraction = result.throughput_rps / ceiling
    return (
        f"- {'met' if fraction >= goal.fraction else 'NOT MET'}: {goal.service} at c={result.concurrency} reaches "
        f"{_floored(fraction)} of its ceiling (goal {goal.fraction:.0%}): {result.throughput_rps:.1f} of "
        f"{ceiling:.1f} req/s" + _window_spread(point)
    )


def against_cap(goal: Goal, result: RunResult, ceiling: float, point: dict, meta: dict) -> str:
    """A goal on the ratio to the cap (the ceiling times 1 - the CPU split's overhead share),
    met or not where every core was busy; NOT JUDGED, saying why, where they were not or where no
    CPU split was measured."""
    where = f"{goal.service} at c={result.concurrency}"
    of_ceiling = (
        f"it reaches {result.throughput_rps / ceiling:.1%} of its ceiling ({result.throughput_rps:.1f} of "
        f"{ceiling:.1f} req/s)"
    )
    if "cpu_s" not in point:
        return (
            f"- NOT JUDGED: {where}: this run measured no CPU split (it did not know the server's process id), "
            f"so there is no cap to judge it against; {of_ceiling}" + _window_spread(point)
        )
    cpu = setups.CpuSplit(**point["cpu_s"])
    if cpu.cores_busy(meta["machine"]["cores_available"]) < EVERY_CORE_BUSY:
        return (
            f"- NOT JUDGED: {where}: not every core was busy (under {EVERY_CORE_BUSY:.0%}), and the cap binds "
            f"only on busy cores" + overhead_cap(point, meta) + f"; {of_ceiling}" + _window_spread(point)
        )
    cap = 1 - cpu.overhead_share()
    of_cap = result.throughput_rps / (cap * ceiling)
    return (
        f"- {'met' if of_cap >= goal.fraction else 'NOT MET'}: {where} reaches {_floored(of_cap)} of its cap "
        f"(goal {goal.fraction:.0%}): {result.throughput_rps:.1f} of {cap * ceiling:.1f} req/s"
        + overhead_cap(point, meta)
        + f"; {of_ceiling}"
        + _window_spread(point)
    )


def goal_lines(results: list[RunResult], meta: dict) -> list[str]:
    """Each goal, met or not (or not judged, saying why), with the numbers that decide it (and
    the spread of a ratio's windows, which does not decide it)."""
    ceilings, windows, agreement = meta["ceilings_rps"], meta.get("windows_rps", {}), meta["agreement"]
    lines = []
    for goal in GOALS:
        for concurrency in goal.loads:
            result = _find(results, goal.service, concurrency)
            if result is None:
                lines.append(f"- NOT MEASURED: {goal.service} at c={concurrency}")
                continue
            if not result.clean:
                lines.append(f"- NOT JUDGED: {goal.service} at c={concurrency}: {'; '.join(result.interrupted_by)}")
                continue
            point = windows.get(goal.service, {}).get(str(concurrency)) or {}
            ceiling = ceiling_of(result, ceilings)
            assert ceiling is not None, f"{goal.service} is a setup of the benchmark, with a ceiling"
            if goal.of_cap:
                lines.append(against_cap(goal, result, ceiling, point, meta))
            else:
                lines.append(against_ceiling(goal, result, ceiling, point))
    busiest = max(r.concurrency or 0 for r in results if r.tool == "loadgen")
    for setup in setups.SETUPS:
        ours, naive = _find(results, setup.name, busiest), _find(results, setups.NAIVE[setup.runtime], busiest)
        if ours is None or naive is None:
            lines.append(f"- NOT MEASURED: {setup.name} against {setups.NAIVE[setup.runtime]} at c={busiest}")
            continue
        # Measured minutes apart: compared at one machine speed, the sweep's.
        speed = {run.name: machine_speed(run, meta) for run in (ours, naive)}
        rps = {run.name: run.throughput_rps / speed[run.name] for run in (ours, naive)}
        p99 = {run.name: run.latency.p99_ms * speed[run.name] for run in (ours, naive)}
        faster, shorter_tail = rps[ours.name] >= rps[naive.name], p99[ours.name] < p99[naive.name]
        lines.append(
            f"- {'met' if faster and shorter_tail else 'NOT MET'}: {setup.name} at c={busiest} is at least as fast "
            f"as {naive.name} ({rps[ours.name]:.1f} vs {rps[naive.name]:.1f} req/s: "
            f"{'yes' if faster else 'no'}) with a lower p99 ({p99[ours.name]:.0f} vs "
            f"{p99[naive.name]:.0f} ms: {'yes' if shorter_tail else 'no'}), at the sweep's machine speed; as "
            f"measured, with the machine at {speed[ours.name]:.0%} and {speed[naive.name]:.0%} of that speed: "
            f"{ours.throughput_rps:.1f} vs {naive.throughput_rps:.1f} req/s, p99 {ours.latency.p99_ms:.0f} vs "
            f"{naive.latency.p99_ms:.0f} ms"
        )
    for measure, limit in AGREEMENT_LIMITS.items():
        gap = agreement[f"{measure}_gap"]
        lines.append(
            f"- {'met' if gap <= limit else 'NOT MET'}: the load generator and perf_analyzer agree on {measure} "
            f"within {limit:.0%} (the median pair differs by {gap:.1%})"
        )
    return lines


def _ceiling_table(results: list[RunResult]) -> list[str]:
    lines = ["| ceiling | plan | throughput (req/s) | p50 (ms) | best |", "| --- | --- | ---: | ---: | --- |"]
    for result in results:
        if result.tool != "in-process":
            continue
        (key,) = [note.split(": ", 1)[1] for note in result.notes if note.startswith("ceiling: ")]
        plan = result.notes[0].split(" (")[0]
        best = key.endswith("(best)")
        lines.append(
            f"| {key.removesuffix(' (best)')} | {plan} | {result.throughput_rps:.1f} | {result.latency.p50_ms:.1f} "
            f"| {'**best**' if best else ''} |"
        )
    return lines


def write_report(results: list[RunResult], meta: dict, out_dir: Path) -> Path:
    served = [r for r in results if r.tool == "loadgen"]
    lab_runs = [r for r in served if not r.name.startswith("naive/")]
    plots.plot_latency_throughput_vs_concurrency(lab_runs, out_dir / "latency_throughput.png")
    busiest = max(r.concurrency or 0 for r in served)
    plots.plot_latency_cdf([r for r in served if r.concurrency == busiest], out_dir / "latency_cdf.png")
    plots.plot_batch_sizes(
        {r.label: r.triton_stats for r in served if r.triton_stats and r.concurrency == busiest},
        path=out_dir / "batch_sizes.png",
    )
    heaviest = max(lab_runs, key=lambda r: r.throughput_rps)
    assert heaviest.resources is not None, "every window of the benchmark samples the machine's resources"
    plots.plot_resources(
        heaviest.resources, out_dir / "resources.png", title=f"Resources during {heaviest.label}, last window"
    )

    ceilings = meta["ceilings_rps"]
    window_s = meta["profile_settings"]["duration_s"] / meta["profile_settings"]["windows"]
    weights, agreement, machine = meta["weights"], meta["agreement"], meta["machine"]
    untrained = " (serving cost is that of a trained model; the predicted labels are not meaningful)"
    lines = [
        f"# Headline benchmark ({meta['profile']} profile)",
        "",
        f"- Machine: {machine['cpu']}, {machine['cores']} cores ({machine['cores_available']} available to "
        f"this process); GPU: {', '.join(machine['gpus'])}",
        f"- Weights: **{weights['weights']}**" + ("" if weights["weights"] == "trained" else untrained),
        "- Versions: " + ", ".join(f"{name} {version}" for name, version in meta["versions"].items()),
        f"- Each load point: {meta['profile_settings']['warmup_s']:g} s warm-up, then "
        f"{meta['profile_settings']['duration_s']:g} s measured in {meta['profile_settings']['windows']} "
        f"window(s) (see the ceilings); closed loop (each sender sends its next "
        f"request when the last one is answered); payload {meta['payload']['image']} "
        f"({meta['payload']['bytes']} bytes).",
        "",
        "## Threads",
        "",
        *(f"- {name}: {plan}" for name, plan in meta["thread_plans"].items()),
        "",
        "## The in-process ceilings",
        "",
        "The same work as a service, in one process, with no HTTP: each plan in a process of its own, the "
        "best one is the ceiling. 'one in flight' decodes then infers, one image at a time (no server at "
        "concurrency 1 can beat it); 'pipeline' overlaps decoding with inference in `slots` threads. "
        "This machine's speed drifts within minutes, even within one run, so each load point is measured in "
        f"{meta['profile_settings']['windows']} window(s) of {window_s:g} s, and the winning plan is measured "
        "again, in its own process, before, between and after them (rows 'k of n around ...'): a service is "
        "compared with the mean of those, the ceiling's speed around and during its own run.",
        "",
        *_ceiling_table(results),
        "",
        "## Every service",
        "",
        "'of ceiling' is throughput as a fraction of the ceiling for the same work (PyTorch or ONNX Runtime, "
        "with decoding; Triton's ONNX model gets tensors, so inference alone): for one request in flight at "
        "concurrency 1, the best plan otherwise, measured around and between the row's windows. The naive rows are the "
        "reference app a student writes first (servelab/bench/naive_app.py). Triton's rows: on a server with "
        "no GPU, one instance per core (see Threads), set for these runs through the repository API.",
        "",
        tables.results_table(served, lambda r: ceiling_of(r, ceilings), "of ceiling"),
        "",
        "## Goals",
        "",
        "Each is decided by the load point's throughput over all its windows against the mean of the ceiling's "
        "windows around and between them. The window-by-window figures (each window against the two ceiling "
        "windows beside it) do not decide it: they show how far the machine moved meanwhile. A naive app runs "
        "minutes after the service it is compared with, so the two are compared at one machine speed, the "
        "sweep's: each throughput divided by, and each p99 multiplied by, the ceiling around its run over the "
        "same ceiling in the sweep.",
        "",
        "A FastAPI service is judged against its cap, not the ceiling itself: the ceiling pays for no HTTP, and "
        "while every core is busy the CPU its event loop and the load generator take is taken from decoding and "
        "inference (next section). So it is judged only at load points that kept every core busy (the server and "
        f"the load generator used at least {EVERY_CORE_BUSY:.0%} of the cores' time), and NOT JUDGED elsewhere, "
        "saying why. Triton's front end has no event loop of ours to count: it is judged against the ceiling.",
        "",
        *goal_lines(results, meta),
        "",
        "## Where a FastAPI service's CPU goes",
        "",
        "CPU seconds over each load point's windows (warm-ups included): the server process, its main thread "
        "(uvicorn's event loop: HTTP, JSON, FastAPI's routing and validation) and the load generator's process. "
        "The ceiling pays for neither the event loop nor the load generator, so while every core is busy a "
        "service whose decoding and inference cost what the ceiling's do reaches at most 'cap' of it (1 minus "
        "their share of all the CPU the requests cost). At low concurrency the cores idle and the cap does not "
        "bind; on a GPU the GPU, not the cores, may be what runs out. 'of ceiling' is the mean of the windows' "
        "own fractions (the windows' figures in Goals).",
        "",
        *cpu_table(meta),
        "",
        "## Is the load generator the bottleneck?",
        "",
        f"Against Triton `{agreement['model']}` at concurrency {agreement['concurrency']}, in this run, "
        f"the two tools took turns {agreement['pairs']} time(s); medians. CPU per request is each tool's own "
        "CPU time over the requests Triton answered meanwhile (warm-up and every trial window included). "
        "The goals compare the tools pair by pair, each pair run back to back at one machine speed "
        "(the load generator's figure over perf_analyzer's): " + pair_ratios(agreement) + ".",
        "",
        "| tool | throughput (req/s) | p50 (ms) | CPU per request (ms) |",
        "| --- | ---: | ---: | ---: |",
        *(
            f"| {tool} | {agreement[key]['throughput_rps']:.1f} | {agreement[key]['p50_ms']:.1f} "
            f"| {agreement[key]['cpu_ms_per_request']:.2f} |"
            for tool, key in (("servelab.loadgen", "loadgen"), ("perf_analyzer", "perf_analyzer"))
        ),
        "",
        "## Plots",
        "",
        "![latency and throughput vs concurrency](latency_throughput.png)",
        "",
        f"![latency CDF at concurrency {busiest}](latency_cdf.png)",
        "",
        "![Triton executions per batch size](batch_sizes.png)",
        "",
        "![resource utilization](resources.png)",
        "",
    ]
    report = out_dir / "report.md"
    report.write_text("\n".join(lines))
    (out_dir / "metadata.json").write_text(json.dumps(meta, indent=1, default=str))
    return report
