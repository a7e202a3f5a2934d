"""The figures of what the clients measured: latency and throughput against concurrency, the
latency's distribution, throughput against its bounds, and latency against offered load beside
what queueing theory predicts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import cycle
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from servelab.measure import queueing
from servelab.report.plots.canvas import (
    PERCENTILE_MARKERS,
    PERCENTILE_STYLES,
    PathLike,
    color_cycle,
    concurrency_axis,
    concurrency_of,
    finish,
    grouped,
    median,
    rate_of,
    series_name,
)
from servelab.results import RunResult


def _hollow(ax: Any, repeated: list[RunResult], values: list[float], marker: str, color: str) -> None:
    """Each of the runs repeated at one concurrency, as a hollow marker (none where none was)."""
    if repeated:
        ax.scatter([r.concurrency for r in repeated], values, marker=marker, s=22, facecolors="none", edgecolors=color)


def plot_latency_throughput_vs_concurrency(
    results: Sequence[RunResult], path: PathLike = None, title: str = "Latency and throughput vs concurrency"
) -> Figure:
    """p50/p95/p99 latency (left) and throughput (right) vs concurrency, one colour per run name and tool.

    Only closed-loop results (those with a concurrency) are drawn. A series measured more than once
    at one concurrency (the machine drifts between runs) is drawn through the median there, with
    each of those runs as a hollow marker, rather than as a vertical line between them.
    """
    closed = [result for result in results if result.concurrency is not None]
    if not closed:
        raise ValueError("no closed-loop results (with a concurrency) to plot")
    fig, (ax_latency, ax_throughput) = plt.subplots(1, 2, figsize=(13, 5.2), layout="constrained")
    groups = grouped(closed, lambda r: (r.name, r.tool, r.batch_size))
    for color, ((name, tool, batch_size), runs) in zip(color_cycle(), groups.items(), strict=False):
        at = grouped(runs, concurrency_of)
        concurrency = sorted(at)
        repeated = [r for r in runs if len(at[concurrency_of(r)]) > 1]
        for percentile, style in PERCENTILE_STYLES.items():
            # A percentile the run was too short for is left out (NaN), not drawn as a guess.
            p = int(percentile[1:])
            latencies = [median([r.latency_ms(p) for r in at[c]]) for c in concurrency]
            marker = PERCENTILE_MARKERS[percentile]
            ax_latency.plot(concurrency, latencies, linestyle=style, marker=marker, markersize=5, color=color)
            _hollow(ax_latency, repeated, [r.latency_ms(p) for r in repeated], marker, color)
        ax_throughput.plot(
            concurrency,
            [median([r.images_per_s for r in at[c]]) for c in concurrency],
            marker="o",
            color=color,
            label=series_name(name, tool, batch_size) + (" (median of repeated runs)" if repeated else ""),
        )
        _hollow(ax_throughput, repeated, [r.images_per_s for r in repeated], "o", color)
    all_concurrency = [concurrency_of(r) for r in closed]
    for ax in (ax_latency, ax_throughput):
        concurrency_axis(ax, all_concurrency)
        ax.grid(True, which="both", alpha=0.3)
    ax_throughput.set_ylim(bottom=0)
    latencies = [v for r in closed for v in (r.latency.p50_ms, r.latency.p99_ms) if math.isfinite(v) and v > 0]
    if latencies and max(latencies) / min(latencies) > 20:  # values spanning decades: a log axis shows them all
        ax_latency.set_yscale("log")
        ax_latency.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax_latency.yaxis.set_minor_formatter(NullFormatter())
        ax_latency.set_ylabel("latency (ms, log scale)")
    else:
        ax_latency.set_ylim(bottom=0)
        ax_latency.set_ylabel("latency (ms)")
    ax_latency.set_title("Latency percentiles")
    # Colours name the series (legend on the right plot); line styles and markers name the percentiles.
    ax_latency.legend(
        handles=[
            Line2D([], [], color="black", linestyle=style, marker=PERCENTILE_MARKERS[p], label=p)
            for p, style in PERCENTILE_STYLES.items()
        ],
        loc="upper left",
        title="percentile",
    )
    throughput_unit = "req/s" if all(r.batch_size == 1 for r in closed) else "images/s; = req/s at batch 1"
    ax_throughput.set_ylabel(f"throughput ({throughput_unit})")
    ax_throughput.set_title("Throughput")
    ax_throughput.legend(loc="best", fontsize="small")
    fig.suptitle(title)
    return finish(fig, path)


def plot_latency_cdf(
    results: Sequence[RunResult],
    path: PathLike = None,
    log_x: bool = False,
    title: str = "Latency distribution (empirical CDF)",
) -> Figure:
    """Empirical CDF of each run's raw latencies; `log_x` spreads out runs of very different speed."""
    runs = [result for result in results if result.latencies_ms]
    if not runs:
        raise ValueError("none of the results has raw latencies (latencies_ms) to plot")
    fig, ax = plt.subplots(figsize=(10, 5.5), layout="constrained")
    for color, result in zip(color_cycle(), runs, strict=False):
        latencies = np.sort(np.asarray(result.latencies_ms, dtype=float))
        fraction = np.arange(1, latencies.size + 1) / latencies.size
        ax.step(latencies, fraction, where="post", color=color, label=f"{result.label} (n={latencies.size})")
    # Where each curve crosses these lines is that run's p50, p95 and p99.
    for level, name in ((0.5, "p50"), (0.95, "p95"), (0.99, "p99")):
        ax.axhline(level, color="gray", linewidth=0.8, linestyle=":")
        ax.annotate(
            name,
            (1, level),
            xycoords=("axes fraction", "data"),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize="small",
            color="gray",
        )
    if log_x:
        ax.set_xscale("log")
        # Plain millisecond numbers at 1-2-5 steps read better than powers of ten.
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())  # no second set of labels in another format
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("latency (ms)" + (", log scale" if log_x else ""))
    ax.set_ylabel("fraction of requests at or below")
    ax.grid(True, which="both" if log_x else "major", alpha=0.3)
    ax.legend(loc="upper left", fontsize="small")  # a CDF leaves the upper left empty
    ax.set_title(title)
    return finish(fig, path)


def plot_throughput_bounds(
    panels: Mapping[str, Mapping[str, Mapping[int, RunResult | None]]],
    bounds: Mapping[str, Mapping[str, float]],
    path: PathLike = None,
    title: str = "",
) -> Figure:
    """Throughput against concurrency, one panel per condition (an emulated download latency, say)
    and one line per design in it, with the panel's throughput bounds (req/s) as dashed lines.

    panels: panel -> line -> concurrency -> run (None: no result); bounds: panel -> label -> req/s.
    """
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False, sharey=True)
    levels = []  # every plotted value, so that the shared axis shows them all
    for ax, (panel, lines) in zip(axes[0], panels.items(), strict=True):
        colors = color_cycle()
        for line, runs in lines.items():
            points = sorted((c, run.throughput_rps) for c, run in runs.items() if run is not None)
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", color=next(colors), label=line)
                levels += [value for _, value in points]
        for (label, value), style in zip(bounds.get(panel, {}).items(), cycle([":", "--", "-."]), strict=False):
            ax.axhline(value, color="grey", linestyle=style, label=f"{label} = {value:.1f} req/s")
            levels.append(value)
        concurrency_axis(ax, sorted({c for runs in lines.values() for c in runs}))
        ax.set_title(panel)
        ax.set_xlabel("concurrent senders")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    axes[0][0].set_ylabel("throughput (req/s)")
    axes[0][0].set_ylim(0, 1.15 * max(levels, default=1))
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return finish(fig, path)


def plot_queueing(
    measured: Sequence[RunResult],
    service_time_s: float,
    cv2: float = 0.0,
    alone_ms: float | None = None,
    path: PathLike = None,
    log_y: bool = False,
    title: str | None = None,
) -> Figure:
    """Measured latency vs offered rate beside what queueing theory predicts for service time S.

    `measured`: open-loop results (with `rate_rps`). Each model's curve is a request's latency
    alone (`alone_ms`, default S) plus its predicted wait: M/D/1 (Poisson arrivals, constant
    service), M/G/1 with the measured service-time variation `cv2` (when above 0), and D/D/1
    (constant arrivals: no wait), drawn for contrast.
    """
    runs = [result for result in measured if result.rate_rps is not None]
    if not runs:
        raise ValueError("no open-loop results (with a rate_rps) to plot")
    capacity = queueing.capacity_rps(service_time_s)
    base_ms = service_time_s * 1000 if alone_ms is None else alone_ms
    fig, ax = plt.subplots(figsize=(10, 5.8), layout="constrained")

    # Up to 99.5 % of capacity: the curves are infinite at capacity itself.
    rates = np.linspace(0, 0.995 * capacity, 400)
    models = [("M/D/1 (Poisson arrivals, constant service)", 0.0, "black")]
    if cv2 > 0:
        models.append((f"M/G/1 (Poisson arrivals, service cv² = {cv2:.2f})", cv2, "tab:purple"))
    for name, variation, color in models:
        waits = [row["queueing_delay_ms"] for row in queueing.mg1_estimate(rates, service_time_s, variation)]
        ax.plot(rates, base_ms + np.asarray(waits), color=color, linewidth=2, label=f"{name}: predicted mean")
    ax.plot(
        rates,
        [base_ms + 1000 * queueing.dd1_mean_wait_s(rate, service_time_s) for rate in rates],
        color="black",
        linestyle=":",
        linewidth=1.5,
        label="D/D/1 (constant arrivals): no queueing",
    )
    ax.axvline(capacity, color="tab:red", linestyle="--", linewidth=1.2, label=f"capacity 1/S = {capacity:.1f} req/s")

    groups = grouped(runs, lambda r: (r.name, r.tool, r.arrival))
    for color, ((name, tool, arrival), group) in zip(color_cycle(), groups.items(), strict=False):
        group = sorted(group, key=rate_of)
        offered = [rate_of(r) for r in group]
        series = f"{series_name(name, tool)}, {arrival or 'unknown'} arrivals"
        ax.plot(offered, [r.latency.mean_ms for r in group], color=color, marker="o", label=f"{series}: measured mean")

    ax.set_xlim(0, max(max(rate_of(r) for r in runs), capacity) * 1.05)
    if log_y:
        ax.set_yscale("log")
    else:
        # Keep the interesting part readable: the estimates shoot up near capacity.
        measured_max = max((r.latency.mean_ms for r in runs if math.isfinite(r.latency.mean_ms)), default=base_ms)
        ax.set_ylim(0, max(measured_max, 10 * base_ms) * 1.1)
    utilization_axis = ax.secondary_xaxis(
        "top", functions=(lambda rate: np.asarray(rate) * service_time_s, lambda rho: np.asarray(rho) / service_time_s)
    )
    utilization_axis.set_xlabel("utilization ρ = λ·S")
    ax.set_xlabel("offered rate λ (req/s)")
    ax.set_ylabel("mean latency (ms)" + (", log scale" if log_y else ""))
    ax.grid(True, which="both" if log_y else "major", alpha=0.3)
    ax.legend(loc="upper left", fontsize="small")
    ax.set_title(title or f"Latency vs offered load, against queueing theory (S = {service_time_s * 1000:.1f} ms)")
    return finish(fig, path)
