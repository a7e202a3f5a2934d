"""The headline benchmark's report: report.md and its plots, from one run's results.

Every ratio is taken against a ceiling measured in the same run on the same machine, in windows
that take turns with the row's own measured windows (the mean of the ceiling's windows): a row
at concurrency 1 against the in-process ceiling for one request in flight, a row at higher
concurrency against the best in-process plan for many. The goals the lab sets itself
(servelab.bench.goals) are listed as met or not met, with the numbers, or as not judged, saying
why, or reported beside them: the report says what happened, it does not fail.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from servelab.bench import lone, setups
from servelab.bench.goals import EVERY_CORE_BUSY, GOAL_CONCURRENCY, ceiling_of, floored, goal_lines, window_fractions
from servelab.loadgen.processes import SATURATED_PERCENT
from servelab.report import plots, tables
from servelab.report.tables import markdown_table
from servelab.results import RunResult


def pair_ratios(agreement: dict) -> str:
    """Each measure's ratios, pair by pair, in words."""
    return "; ".join(
        f"{measure} {', '.join(f'{ratio:.2f}' for ratio in ratios)}"
        for measure, ratios in agreement["pair_ratios"].items()
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
    headings = ["service", "load", "event loop, of the server's CPU", "load generator, of all", "cap", "of ceiling"]
    cells = [
        [
            name,
            f"c={load}",
            f"{cpu.event_loop_s / cpu.server_s:.1%}",
            f"{cpu.load_generator_s / (cpu.server_s + cpu.load_generator_s):.1%}",
            f"{1 - cpu.overhead_share():.1%}",
            f"{statistics.mean(window_fractions(meta['windows_rps'][name][load])):.1%}",
            floored(cpu.cores_busy(cores)),
        ]
        for name, load, cpu in rows
    ]
    return markdown_table([*headings, "cores busy"], cells, right=range(2, 7)).splitlines()


def client_table(served: list[RunResult]) -> list[str]:
    """How busy the load generator was at every load point: its share of one core over the measured windows."""
    rows = []
    for result in served:
        client = result.client or {}
        busy = ", ".join(f"{percent:.0f}%" for percent in client.get("cpu_percent", [])) or "?"
        saturated = "**yes**: not judged" if client.get("saturated") else "no"
        rows.append([result.name, f"c={result.concurrency}", busy, saturated])
    return markdown_table(["service", "load", "load generator, of a core", "saturated"], rows, right=[2]).splitlines()


def _ceiling_table(results: list[RunResult]) -> list[str]:
    rows = []
    for result in results:
        if result.tool != "in-process":
            continue
        (key,) = [note.split(": ", 1)[1] for note in result.notes if note.startswith("ceiling: ")]
        plan, best = result.notes[0].split(" (")[0], key.endswith("(best)")
        throughput, p50 = f"{result.throughput_rps:.1f}", f"{result.latency.p50_ms:.1f}"
        rows.append([key.removesuffix(" (best)"), plan, throughput, p50, "**best**" if best else ""])
    headings = ["ceiling", "plan", "throughput (req/s)", "p50 (ms)", "best"]
    return markdown_table(headings, rows, right=[2, 3]).splitlines()


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
        f"Each throughput goal is judged at c={GOAL_CONCURRENCY} alone, with more clients than a service has "
        "processes (workers that share one listening socket balance connections, not requests); the other loads "
        "are reported with the same figures, never judged, with how their connections spread over a service's "
        "processes where it runs several. A point whose load generator was saturated is NOT JUDGED (see Is the "
        "load generator the bottleneck?). Each is decided by the load point's throughput over all its windows "
        "against the mean of the ceiling's windows around and between them. The window-by-window figures (each "
        "window against the two ceiling windows beside it) do not decide it: they show how far the machine moved "
        "meanwhile. A naive app runs minutes after the service it is compared with, so the two are compared at one "
        "machine speed, the sweep's: each throughput divided by, and each p99 multiplied by, the ceiling around its "
        "run over the same ceiling in the sweep.",
        "",
        "A FastAPI service is judged against its cap, not the ceiling itself: the ceiling pays for no HTTP, and "
        "while every core is busy the CPU its event loop and the load generator take is taken from decoding and "
        "inference (next section). So it is judged only at load points that kept every core busy (the server and "
        f"the load generator used at least {EVERY_CORE_BUSY:.0%} of the cores' time), and NOT JUDGED elsewhere, "
        "saying why. Triton's front end has no event loop of ours to count: it is judged against the ceiling.",
        "",
        *goal_lines(results, meta),
        "",
        "## A lone client, before and after a load",
        "",
        "Each FastAPI service before any other load point reached it: one client for a window, then "
        f"{GOAL_CONCURRENCY} clients for a window, then one client again at once, then the in-process loop (decode "
        "then infer, one image at a time, on one thread with one intra-op thread, as a service's slot runs it) "
        "measured at once, beside it (req/s). The goal: the lone client at "
        f"{lone.LONE_GOAL:.0%} of the loop or more, before the load and after it.",
        "",
        *lone.lone_table(meta.get("lone_after_load", {})),
        "",
        *lone.lone_lines(meta.get("lone_after_load", {})),
        "",
        "## Where a FastAPI service's CPU goes",
        "",
        "CPU seconds over each load point's windows (warm-ups included): the server's processes (its workers, where "
        "it runs several), their main threads (uvicorn's event loops: HTTP, JSON, FastAPI's routing and validation) "
        "and the load generator's process. "
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
        "The load generator runs in this process, an asyncio loop in one thread: near a full core, it, not the "
        "service, sets the pace. Its CPU (time.process_time, the resource sampler's thread included) over each "
        f"point's measured windows, as a share of one core; at {SATURATED_PERCENT:.0f}% or more the point is "
        "saturated, and no goal is judged on it (the GPU check's threshold).",
        "",
        *client_table(served),
        "",
        *markdown_table(
            ["tool", "throughput (req/s)", "p50 (ms)", "CPU per request (ms)"],
            [
                [
                    tool,
                    f"{figures['throughput_rps']:.1f}",
                    f"{figures['p50_ms']:.1f}",
                    f"{figures['cpu_ms_per_request']:.2f}",
                ]
                for tool, figures in (
                    ("servelab.loadgen", agreement["loadgen"]),
                    ("perf_analyzer", agreement["perf_analyzer"]),
                )
            ],
            right=[1, 2, 3],
        ).splitlines(),
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
