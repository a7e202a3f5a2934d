"""The lab's figures, drawn from `RunResult`s whichever tool measured them.

Every plot function returns its matplotlib Figure and, given `path`, also saves it as a PNG. In
Jupyter a figure shows inline by itself; end the line with `;` so that the returned Figure is
not shown a second time. In a script, `plt.close(fig)` a figure once it is saved.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from itertools import cycle
from pathlib import Path
from typing import Any, TypeGuard, TypeVar, cast

import matplotlib

# Without a display (a server, CI, the GPU node over SSH) draw into files only. A backend chosen
# through MPLBACKEND is left alone: that is how Jupyter selects its inline backend.
if (
    sys.platform.startswith("linux")
    and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    and "MPLBACKEND" not in os.environ
    and "ipykernel" not in sys.modules
):
    matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (after the backend choice)
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator, ScalarFormatter  # noqa: E402
from matplotlib.typing import LineStyleType  # noqa: E402

from servelab.measure import queueing  # noqa: E402
from servelab.results import RunResult  # noqa: E402
from servelab.triton.stats import StatsDelta  # noqa: E402

PathLike = str | Path | None
# What plot_batch_sizes accepts as one set of batch statistics.
BatchStats = StatsDelta | Mapping[str, Any] | Mapping[int, int]

PERCENTILE_STYLES: dict[str, LineStyleType] = {"p50": "-", "p95": "--", "p99": ":"}
PERCENTILE_MARKERS = {"p50": "o", "p95": "s", "p99": "^"}
DPI = 120


def _colors() -> Iterator[str]:
    """Matplotlib's colour cycle, repeating without end (so zip it with strict=False)."""
    return cycle(plt.rcParams["axes.prop_cycle"].by_key()["color"])


def _finish(fig: Figure, path: PathLike) -> Figure:
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=DPI)
    return fig


Key = TypeVar("Key", bound=Hashable)


def _group(results: Iterable[RunResult], key: Callable[[RunResult], Key]) -> dict[Key, list[RunResult]]:
    groups: dict[Key, list[RunResult]] = {}
    for result in results:
        groups.setdefault(key(result), []).append(result)
    return groups


def _concurrency(result: RunResult) -> int:
    """A closed-loop result's concurrency (the plots of closed-loop runs keep only those that have one)."""
    assert result.concurrency is not None, f"{result.label} is not a closed-loop run"
    return result.concurrency


def _rate(result: RunResult) -> float:
    """An open-loop result's offered rate (the plots of open-loop runs keep only those that have one)."""
    assert result.rate_rps is not None, f"{result.label} is not an open-loop run"
    return result.rate_rps


def _series_name(name: str, tool: str, batch_size: int = 1) -> str:
    return f"{name} [{tool}]" + (f", batch {batch_size}" if batch_size != 1 else "")


def _median(values: Iterable[float]) -> float:
    """The median of the finite values; NaN when there are none."""
    finite = [value for value in values if math.isfinite(value)]
    return float(np.median(finite)) if finite else math.nan


def _concurrency_axis(ax: Any, values: Iterable[int]) -> None:
    """Log scale (base 2) when concurrency spans a wide range, with a tick at each measured value."""
    ticks = sorted(set(values))
    if ticks[0] > 0 and ticks[-1] / ticks[0] >= 8:
        ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("concurrency (requests in flight)")


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
    groups = _group(closed, lambda r: (r.name, r.tool, r.batch_size))
    for color, ((name, tool, batch_size), runs) in zip(_colors(), groups.items(), strict=False):
        at = _group(runs, _concurrency)
        concurrency = sorted(at)
        repeated = [r for r in runs if len(at[_concurrency(r)]) > 1]
        for percentile, style in PERCENTILE_STYLES.items():
            # A percentile the run was too short for is left out (NaN), not drawn as a guess.
            p = int(percentile[1:])
            latencies = [_median([r.latency_ms(p) for r in at[c]]) for c in concurrency]
            marker = PERCENTILE_MARKERS[percentile]
            ax_latency.plot(concurrency, latencies, linestyle=style, marker=marker, markersize=5, color=color)
            if repeated:
                ax_latency.scatter(
                    [r.concurrency for r in repeated], [r.latency_ms(p) for r in repeated],
                    marker=marker, s=22, facecolors="none", edgecolors=color,
                )  # fmt: skip
        ax_throughput.plot(
            concurrency,
            [_median([r.images_per_s for r in at[c]]) for c in concurrency],
            marker="o",
            color=color,
            label=_series_name(name, tool, batch_size) + (" (median of repeated runs)" if repeated else ""),
        )
        if repeated:
            ax_throughput.scatter(
                [r.concurrency for r in repeated], [r.images_per_s for r in repeated],
                marker="o", s=22, facecolors="none", edgecolors=color,
            )  # fmt: skip
    all_concurrency = [_concurrency(r) for r in closed]
    for ax in (ax_latency, ax_throughput):
        _concurrency_axis(ax, all_concurrency)
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
    return _finish(fig, path)


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
    for color, result in zip(_colors(), runs, strict=False):
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
    return _finish(fig, path)


def _histogram(stats: BatchStats) -> tuple[str | None, dict[int, int], float | None]:
    """(model name, executions by batch size, average batch size) of one set of batch statistics."""
    # Either form: {"executions_by_batch_size": {...}, ...} or {batch size: count}.
    data: Mapping[Any, Any] = stats.to_dict() if isinstance(stats, StatsDelta) else stats
    if "executions_by_batch_size" in data:
        # JSON turns the integer batch sizes into strings: accept both.
        counts = {int(size): int(count) for size, count in data["executions_by_batch_size"].items()}
        return data.get("model"), counts, data.get("avg_batch_size")
    return None, {int(size): int(count) for size, count in data.items()}, None


def _is_one_set(stats: Any) -> TypeGuard[BatchStats]:
    """A StatsDelta, its dict, or a {batch size: count} mapping, rather than a {label: stats} mapping."""
    if isinstance(stats, StatsDelta):
        return True
    if not isinstance(stats, Mapping):
        return False
    labelled = all(isinstance(value, (StatsDelta, Mapping)) for value in stats.values())
    return "executions_by_batch_size" in stats or not labelled


def plot_batch_sizes(
    stats: BatchStats | Sequence[BatchStats] | Mapping[str, BatchStats],
    labels: Sequence[str] | None = None,
    path: PathLike = None,
    title: str = "Executions per batch size",
    share: bool = False,
) -> Figure:
    """Bar chart: how many model executions ran at each batch size.

    `stats`: a `StatsDelta`, its `to_dict()` (e.g. a RunResult's `triton_stats`), or a plain
    {batch size: executions} mapping; or several of these, as a list (with `labels`) or as a
    {label: stats} mapping, to compare e.g. before/after enabling dynamic batching.
    `share`: draw each batch size's share of the run's inferences (in %) instead of the count of
    executions, so that runs of different lengths compare; the legend gives each run's totals.
    """
    if _is_one_set(stats):
        items: list[BatchStats] = [stats]
    elif isinstance(stats, Mapping):  # not one set (above): {label: stats}
        labelled = cast(Mapping[str, BatchStats], stats)
        labels = labels or list(labelled)
        items = list(labelled.values())
    else:  # neither one set nor a mapping: a list of sets
        items = list(cast(Sequence[BatchStats], stats))
    histograms = [_histogram(item) for item in items]
    if not any(counts for _, counts, _ in histograms):
        raise ValueError("nothing to plot: no executions recorded")
    if labels is None:
        models = [model for model, _, _ in histograms if model is not None]
        unique = len(models) == len(histograms) and len(set(models)) == len(models)
        labels = models if unique else [f"run {i + 1}" for i in range(len(histograms))]
    if len(labels) != len(histograms):
        raise ValueError(f"{len(labels)} labels for {len(histograms)} sets of statistics")

    sizes = sorted({size for _, counts, _ in histograms for size in counts})
    positions = np.arange(len(sizes))
    width = 0.8 / len(histograms)
    fig, ax = plt.subplots(figsize=(max(7.0, 0.55 * len(sizes) * len(histograms) + 3), 4.8), layout="constrained")
    for i, (color, label, (_, counts, avg_batch)) in enumerate(zip(_colors(), labels, histograms, strict=False)):
        offset = (i - (len(histograms) - 1) / 2) * width
        inferences = sum(size * count for size, count in counts.items())
        if share:
            label = f"{label} ({inferences} inferences in {sum(counts.values())} executions)"
            heights = [100 * size * counts.get(size, 0) / inferences for size in sizes]
            texts = [f"{height:.0f}%" if height else "" for height in heights]
        else:
            heights = [counts.get(size, 0) for size in sizes]
            texts = [str(counts[size]) if counts.get(size) else "" for size in sizes]
        if avg_batch is not None and not math.isnan(avg_batch):
            label = f"{label}, avg batch {avg_batch:.2f}"
        bars = ax.bar(positions + offset, heights, width, color=color, label=label)
        ax.bar_label(bars, labels=texts, fontsize="small")
    ax.set_xticks(positions, [str(size) for size in sizes])
    ax.set_xlabel("batch size executed (inferences per model execution)")
    ax.set_ylabel("% of the run's inferences" if share else "executions")
    ax.margins(y=0.12)  # room for the count above the tallest bar
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(fontsize="small")
    ax.set_title(title)
    return _finish(fig, path)


def plot_process_cpu(runs: Mapping[str, RunResult], cores: int, path: PathLike = None, title: str = "") -> Figure:
    """Stacked bars: each run's CPU per process (`resources["processes"]`, % of one core, as
    TritonSide.perf records it for a model's instances), against the line of every core busy."""
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(runs) + 2), 4.5), layout="constrained")
    for position, result in enumerate(runs.values()):
        bottom = 0.0
        processes = (result.resources or {}).get("processes", {}) if result else {}
        for color, (process, percent) in zip(_colors(), processes.items(), strict=False):
            ax.bar(position, percent, bottom=bottom, color=color, edgecolor="white", width=0.6)
            if percent >= 8:
                ax.text(position, bottom + percent / 2, process, ha="center", va="center", fontsize="x-small")
            bottom += percent
        ax.text(position, bottom, f"{bottom:.0f}%", ha="center", va="bottom", fontsize="small")
    ax.axhline(100 * cores, color="tab:red", linestyle="--", label=f"all {cores} cores busy ({100 * cores}%)")
    ax.set_xticks(range(len(runs)), list(runs))
    ax.set_ylabel("CPU per process (% of one core, stacked)")
    ax.set_ylim(0, 100 * cores * 1.2)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(loc="upper left", fontsize="small")
    ax.set_title(title or "CPU used by each instance process")
    return _finish(fig, path)


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
        colors = _colors()
        for line, runs in lines.items():
            points = sorted((c, run.throughput_rps) for c, run in runs.items() if run is not None)
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", color=next(colors), label=line)
                levels += [value for _, value in points]
        for (label, value), style in zip(bounds.get(panel, {}).items(), cycle([":", "--", "-."]), strict=False):
            ax.axhline(value, color="grey", linestyle=style, label=f"{label} = {value:.1f} req/s")
            levels.append(value)
        _concurrency_axis(ax, sorted({c for runs in lines.values() for c in runs}))
        ax.set_title(panel)
        ax.set_xlabel("concurrent senders")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    axes[0][0].set_ylabel("throughput (req/s)")
    axes[0][0].set_ylim(0, 1.15 * max(levels, default=1))
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _finish(fig, path)


def plot_resources(series: Mapping[str, Any], path: PathLike = None, title: str = "Resource utilization") -> Figure:
    """CPU (total and per core), memory, and each GPU's utilization and memory over time.

    `series`: `ResourceSampler.series()`, e.g. a RunResult's `resources`.
    """
    t = series["t_s"]
    if not t:
        raise ValueError("the resource series has no samples (was the run shorter than one interval?)")
    gpus = series["gpus"]
    rows = 3 if gpus else 1
    fig, axes = plt.subplots(rows, 1, figsize=(11, 3.3 * rows + 0.6), sharex=True, layout="constrained", squeeze=False)
    ax_cpu = axes[0][0]

    per_core = np.asarray(series["cpu_per_core"], dtype=float)  # samples x cores
    for core in range(per_core.shape[1]):
        ax_cpu.plot(
            t, per_core[:, core], color="tab:blue", linewidth=0.7, alpha=0.35, label="each core" if core == 0 else None
        )
    ax_cpu.plot(t, series["cpu_percent"], color="tab:blue", linewidth=2.2, label="all cores")
    if "process_cpu_percent" in series:
        # Per-process CPU is in % of one core; divided by the core count it is on the same scale.
        share = np.asarray(series["process_cpu_percent"], dtype=float) / series["cpu_count"]
        ax_cpu.plot(t, share, color="tab:orange", linewidth=1.8, label="watched processes (% of all cores)")
    ax_cpu.plot(t, series["memory_percent"], color="tab:gray", linestyle="--", linewidth=1.5, label="memory used")
    ax_cpu.set_ylim(0, 105)
    ax_cpu.set_ylabel("% of machine")
    cpu_title = f"CPU ({series.get('cpu_count', per_core.shape[1])} cores) and memory"
    ax_cpu.set_title(cpu_title if gpus else f"{cpu_title}; GPU: {series['gpu_source']}")
    ax_cpu.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")

    if gpus:
        ax_util, ax_memory = axes[1][0], axes[2][0]
        for color, gpu in zip(_colors(), gpus, strict=False):
            name = f"GPU {gpu['index']}: {gpu['name']}"
            ax_util.plot(t, gpu["util_percent"], color=color, linewidth=1.8, label=name)
            ax_memory.plot(t, gpu["memory_used_mib"], color=color, linewidth=1.8, label=f"{name}, used")
            ax_memory.axhline(
                gpu["memory_total_mib"],
                color=color,
                linestyle=":",
                linewidth=1.2,
                label=f"{name}, total ({gpu['memory_total_mib']:.0f} MiB)",
            )
        ax_util.set_ylim(0, 105)
        ax_util.set_ylabel("GPU utilization (%)")
        ax_util.set_title(f"GPU utilization (read with {series['gpu_source']})")
        ax_memory.set_ylim(bottom=0)
        ax_memory.set_ylabel("GPU memory (MiB)")
        ax_memory.set_title("GPU memory")
        for ax in (ax_util, ax_memory):
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    for row in axes:
        row[0].grid(True, alpha=0.3)
    axes[-1][0].set_xlabel("time since the start of sampling (s)")
    fig.suptitle(title)
    return _finish(fig, path)


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

    groups = _group(runs, lambda r: (r.name, r.tool, r.arrival))
    for color, ((name, tool, arrival), group) in zip(_colors(), groups.items(), strict=False):
        group = sorted(group, key=_rate)
        offered = [_rate(r) for r in group]
        series = f"{_series_name(name, tool)}, {arrival or 'unknown'} arrivals"
        ax.plot(offered, [r.latency.mean_ms for r in group], color=color, marker="o", label=f"{series}: measured mean")

    ax.set_xlim(0, max(max(_rate(r) for r in runs), capacity) * 1.05)
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
    return _finish(fig, path)
