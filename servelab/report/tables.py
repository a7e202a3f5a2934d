"""The lab's Markdown tables, drawn from `RunResult`s whichever tool measured them: a notebook
shows one beside its figure, and the benchmark's report is made of them."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from servelab.measure.resources import summarize
from servelab.results import RunResult


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(headings: Sequence[str], rows: Iterable[Sequence[Any]], right: Collection[int] = ()) -> str:
    """A Markdown table: the columns whose index is in `right` right-aligned (numbers, so their digits
    line up), each cell's text kept on its line."""
    rule = "|" + "|".join("---:" if index in right else "---" for index in range(len(headings))) + "|"
    lines = ["| " + " | ".join(headings) + " |", rule]
    return "\n".join([*lines, *("| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows)]) + "\n"


def _number(value: float, digits: int = 1) -> str:
    """A number for a table; n/a for one that was not measured, or a percentile the run was too short for."""
    return f"{value:.{digits}f}" if math.isfinite(value) else "n/a"


def _load(result: RunResult) -> str:
    if result.concurrency is not None:
        load = f"c={result.concurrency}"
    elif result.rate_rps is not None:
        load = f"{result.rate_rps:g} req/s" + (f" {result.arrival}" if result.arrival else "")
    else:
        load = "n/a"
    return load + (f", batch {result.batch_size}" if result.batch_size != 1 else "")


def gpu_busy(result: RunResult | None) -> str | None:
    """How busy each GPU was during the run, in percent of the time (the sampler's mean, as nvtop
    shows it), one figure per GPU ("41, 38"); None where the run sampled no GPU."""
    if result is None or not result.resources or not result.resources.get("gpus"):
        return None
    means = [gpu["util_percent_mean"] for gpu in summarize(result.resources)["gpus"]]
    return ", ".join(_number(mean, 0) for mean in means)


GPU_BUSY = "GPU busy (%)"


def _errors(result: RunResult) -> str:
    crashed = "" if result.clean else f"; NOT A CLEAN RUN: {'; '.join(result.interrupted_by)}"
    if not result.error_count:
        return "0" + crashed
    kinds = ", ".join(f"{kind}: {count}" for kind, count in sorted(result.errors.items()) if count)
    return f"{result.error_count} ({kinds}){crashed}"


BY_PROCESS = "by process: connections/requests"


def process_spread(result: RunResult) -> str | None:
    """How a run spread over the service's processes, by each one's own count (its app's
    predict_*_by_process): "connections/requests" of each, busiest first; None where one process served."""
    by_process = ((result.service_stats or {}).get("by_process") or {}).values()
    if len(by_process) < 2:
        return None
    ordered = sorted(by_process, key=lambda counts: (counts["requests"], counts["connections"]), reverse=True)
    return ", ".join(f"{counts['connections']}/{counts['requests']}" for counts in ordered)


def results_table(
    results: Sequence[RunResult],
    baseline_rps: float | Mapping[str, float] | Callable[[RunResult], float | None] | None = None,
    baseline_heading: str = "vs in-process",
) -> str:
    """A Markdown table, one row per result; with `baseline_rps` (the in-process throughput), a
    last column gives each throughput as a percentage of it. A mapping (by run name) gives each run its own
    baseline (a PyTorch service against in-process PyTorch, say), a function each row its own."""
    # (heading, right-aligned: a number, whose digits line up, and the cell of a result)
    columns: list[tuple[str, bool, Callable[[RunResult], str]]] = [
        ("name", False, lambda result: result.name),
        ("tool", False, lambda result: result.tool),
        ("load", False, _load),
        ("requests", True, lambda result: str(result.requests)),
        ("throughput (req/s)", True, lambda result: _number(result.throughput_rps)),
        *((f"p{p} (ms)", True, lambda result, p=p: _number(result.latency_ms(p))) for p in (50, 95, 99)),
        ("errors", False, _errors),
    ]
    if isinstance(baseline_rps, Mapping):
        baseline_of = lambda result: baseline_rps.get(result.name)  # noqa: E731
    elif callable(baseline_rps):
        baseline_of = baseline_rps
    else:
        baseline_of = lambda result: baseline_rps  # noqa: E731
    if baseline_rps is not None:
        if any((value := baseline_of(result)) is not None and value <= 0 for result in results):
            raise ValueError("baseline_rps must be positive")

        def versus(result: RunResult) -> str:
            baseline = baseline_of(result)
            # One decimal: a ratio judged against a target (80%) must not round onto it.
            return f"{100 * result.throughput_rps / baseline:.1f}%" if baseline else "n/a"

        columns.append((baseline_heading, True, versus))
    # Where the runs sampled a GPU, how busy it was: what a student would watch nvtop for.
    if any(gpu_busy(result) is not None for result in results):
        columns.append((GPU_BUSY, True, lambda result: gpu_busy(result) or "-"))
    # Where a service of several processes counted its own share: how the load spread over them.
    if any(process_spread(result) is not None for result in results):
        columns.append((BY_PROCESS, False, lambda result: process_spread(result) or "-"))
    rows = [[cell(result) for _, _, cell in columns] for result in results]
    right = [index for index, (_, is_number, _) in enumerate(columns) if is_number]
    return markdown_table([heading for heading, _, _ in columns], rows, right)


def breakdown_table(results: Mapping[str, RunResult | None]) -> str:
    """Where each named perf_analyzer run spent its time: throughput, latency, and Triton's queue
    and compute-infer per request. A None result is a run that gave no stable measurement; p95 is
    n/a for a run of fewer than 20 requests. Where the runs sampled a GPU, a last column says how
    busy it was."""
    sampled_gpus = any(gpu_busy(result) is not None for result in results.values())
    heading = f"{'run':>18} | {'req/s':>7} | {'mean ms':>8} | {'p95 ms':>7} | {'queue ms':>8} | "
    heading += f"{'compute infer ms':>16}"
    lines = [heading + (f" | {GPU_BUSY}" if sampled_gpus else "")]
    for name, result in results.items():
        if result is None:
            lines.append(f"{name:>18} | no stable measurement")
            continue
        queue, infer = result.server_ms("queue"), result.server_ms("compute_infer")
        line = (
            f"{name:>18} | {result.throughput_rps:7.1f} | {result.latency.mean_ms:8.1f} | "
            f"{_number(result.latency_ms(95)):>7} | {queue:8.1f} | {infer:16.1f}"
        )
        lines.append(line + (f" | {gpu_busy(result) or '-':>{len(GPU_BUSY)}}" if sampled_gpus else ""))
    return "\n".join(lines)
